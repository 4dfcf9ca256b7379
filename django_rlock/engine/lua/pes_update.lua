-- PermitExpirableSemaphore's update_lease_time of one permit.
-- KEYS[1] key (permits available), KEYS[2] timeout zset, KEYS[3] channel, KEYS[4] index.
-- ARGV[1] permit id (hex), ARGV[2] lease ms.
-- Reply: 1 = its expiry is now + lease, 0 = unknown.

-- #include permits

reclaim(now)
if not redis.call('zscore', KEYS[2], raw(ARGV[1])) then return 0 end
redis.call('zadd', KEYS[2], 'XX', ms(now + tonumber(ARGV[2])), raw(ARGV[1]))
return 1
