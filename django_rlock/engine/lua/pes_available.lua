-- PermitExpirableSemaphore's available_permits.
-- KEYS[1] key (permits available), KEYS[2] timeout zset, KEYS[3] channel, KEYS[4] index.
-- ARGV: none.
-- Reply: permits available (expired ones counted back first).

-- #include permits

reclaim(now)
return tonumber(redis.call('get', KEYS[1]) or 0)
