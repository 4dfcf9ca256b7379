-- The watchdog's renewal of RLock hashes, batched, with each owner and lease sent once per run
-- of keys that share them (renew.lua sends both per key: 2 ARGV per key cost more server CPU
-- than the two calls' own work). A key is renewed only if its hash still has the owner's
-- field: a renewal never extends another owner's lock.
-- KEYS = lock hashes, grouped: the first n1 keys are owner1's with lease1, the next n2 owner2's...
-- ARGV = owner1, lease1 ms, n1, owner2, lease2 ms, n2, ...
-- Reply: the 1-based positions in KEYS of the keys not renewed (gone, or no longer the
-- owner's: lost); empty when all were renewed.

local lost, n = {}, 0
local call, keys = redis.call, KEYS
local k = 0
for g = 1, #ARGV, 3 do
  local owner, lease = ARGV[g], ARGV[g + 1]
  local last = k + ARGV[g + 2]
  for i = k + 1, last do
    local key = keys[i]
    if call('hexists', key, owner) == 1 then
      call('pexpire', key, lease)
    else
      n = n + 1
      lost[n] = i
    end
  end
  k = last
end
return lost
