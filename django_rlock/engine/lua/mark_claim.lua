-- Claims an enqueue de-duplication mark: a hash in lock layout whose one field is
-- "<task id>:0", so the watchdog can renew it while the task runs and `locks list` shows which
-- task holds it.
-- KEYS[1] mark, KEYS[2] (optional) index.
-- ARGV[1] field, ARGV[2] ttl ms, ARGV[3] index entry (taskmark.entry: kind "task", the task's
-- state and name), written on every successful claim, so the entry says "queued" after an
-- enqueue or a retry's re-enqueue and "running" once a worker claims it.
-- Reply: nil = ours now (new, or our own retry: TTL reset); else the field that holds it.

if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  if KEYS[2] then
    -- #include now_ms
    -- #include stamped
    redis.call('hset', KEYS[2], KEYS[1], stamped(ARGV[3], now))
  end
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return nil
end
return redis.call('hkeys', KEYS[1])[1]
