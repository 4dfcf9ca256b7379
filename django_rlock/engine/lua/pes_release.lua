-- PermitExpirableSemaphore's release of one permit (also the watchdog's, of a permit whose
-- owner ended).
-- KEYS[1] key (permits available), KEYS[2] timeout zset, KEYS[3] channel, KEYS[4] index.
-- ARGV[1] permit id (hex), ARGV[2] optional: ms the semaphore lives on once idle (no permit
-- taken: every one is back, so nobody waits for long), set when this release makes it idle.
-- Reply: 1 = released (and published), 0 = unknown or expired.

-- #include permits

reclaim(now)
if redis.call('zrem', KEYS[2], raw(ARGV[1])) == 0 then return 0 end
made(KEYS[1], KEYS[4])
redis.call('publish', KEYS[3], redis.call('incrby', KEYS[1], 1))
if ARGV[2] and redis.call('exists', KEYS[2]) == 0 then redis.call('pexpire', KEYS[1], ARGV[2]) end
return 1
