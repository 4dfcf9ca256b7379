-- Snippet: `stamped(info, now)`: holder info as an index entry that starts at `now` (server
-- ms). The holder's info (identity.thread_info) is format 3 without its time: `now` goes in
-- front, in hex (`<ms hex>␞<owner>␞...`, ␞ = \30); an entry of format 3 already stamped (a
-- waiter's record, granted by a release) gets its time replaced. Every script that writes an
-- entry (a fresh acquire, a hand-off on the releaser's script) stamps it, so no listing
-- carries host skew. Info of processes of the previous releases is stamped as they were:
-- format 2 (`<ms>␟...`, ␟ = \31; its holder's time replaced) and format 1 (JSON: format 1's
-- "<s>.<ms> " in front); lockinfo.parse_entry reads all three.

local function stamped(info, now)
  local at = string.find(info, '\31', 1, true)
  if at then
    return now .. string.sub(info, at)
  end
  at = string.find(info, '\30', 1, true)
  if at then
    return string.format('%x', now) .. string.sub(info, at)
  end
  return string.format('%.3f', now / 1000) .. ' ' .. info
end
