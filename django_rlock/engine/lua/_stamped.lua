-- Snippet: `stamped(info, now)`: holder info as an index entry that starts at `now` (server
-- ms). Holder info (identity.thread_info) is already an entry (format 2) whose leading time
-- is the holder's clock; every script that writes an entry (a fresh acquire, a hand-off on
-- the releaser's script) replaces it with the server's, so no listing carries host skew. Info of a process of the previous release
-- (format 1: JSON) gets format 1's "<s>.<ms> " in front (lockinfo.parse_entry reads both).

local function stamped(info, now)
  local at = string.find(info, '\31', 1, true)
  if at then
    return now .. string.sub(info, at)
  end
  return string.format('%.3f', now / 1000) .. ' ' .. info
end
