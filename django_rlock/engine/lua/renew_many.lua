-- The watchdog's renewal of RLock hashes, batched, with each owner and lease sent once per run
-- of keys that share them (renew.lua sends both per key: 2 ARGV per key cost more server CPU
-- than the two calls' own work). A key is renewed only if its hash still has the owner's
-- field: a renewal never extends another owner's lock.
-- The new expiry is set as an absolute time (PEXPIREAT), the server's TIME once per script
-- plus the lease, formatted once per run: PEXPIRE reads the clock and makes a new argument
-- object per key (the one it propagates): 11-16% of this script's server CPU per key
-- (docs/benchmarks.md). A lease so set ends at most this script's run time (well under a
-- millisecond) before the same PEXPIRE's would, and never before the client's send time
-- plus the lease.
-- KEYS = lock hashes, grouped: the first n1 keys are owner1's with lease1, the next n2 owner2's...
-- ARGV = owner1, lease1 ms, n1, owner2, lease2 ms, n2, ...
-- Reply: the 1-based positions in KEYS of the keys not renewed (gone, or no longer the
-- owner's: lost); empty when all were renewed.

-- #include now_ms
local lost, n = {}, 0
local call, keys = redis.call, KEYS
local k = 0
for g = 1, #ARGV, 3 do
  local owner, at = ARGV[g], string.format('%d', now + ARGV[g + 1])
  local last = k + ARGV[g + 2]
  for i = k + 1, last do
    local key = keys[i]
    if call('hexists', key, owner) == 1 then
      call('pexpireat', key, at)
    else
      n = n + 1
      lost[n] = i
    end
  end
  k = last
end
return lost
