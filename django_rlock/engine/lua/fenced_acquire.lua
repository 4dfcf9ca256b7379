-- FencedLock's acquire: an RLock acquire that also issues a fencing token.
-- KEYS[1] lock hash, KEYS[2] index, KEYS[3] token counter.
-- ARGV[1] lease ms, ARGV[2] owner field, ARGV[3] holder info, ARGV[4] "claim" (sent by
-- waiters; with no hand-off there is nothing to claim, so it changes nothing).
-- Reply: {-1, token} = acquired (new or reentrant); {pttl, -1} = held by another (pttl -1: its
-- key has no expiry).
--
-- The token is max(counter + 1, server TIME in microseconds), written back to the counter: an
-- INCR while the counter is at or ahead of the clock (Redisson's step), else a SET to the
-- clock. Every token is then at least its issue time in microseconds, so a counter lost
-- (restart without persistence) or behind (a promoted replica that missed the last INCRs)
-- starts again above every token handed out before the loss, with no second round trip.
-- Assumes the server clock never steps back past the last token (a failover: the new
-- master's clock is not behind the old one's by as much as the outage) and fewer than a
-- million tokens per second per lock (else the counter runs ahead of the clock by the
-- excess). The clock is a string of digits (a Lua number is a double: tostring would write
-- 1.7e+15), compared as numbers (exact below 2**53: the year 2255 in microseconds). A counter
-- that is not a number goes to INCR, which refuses it as before. Tokens are numbers in the
-- reply, exact below 2**53 too.

local fresh = redis.call('exists', KEYS[1]) == 0
if fresh or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  local t = redis.call('time')
  local now = t[1] .. string.format('%06d', tonumber(t[2]))
  local last = redis.call('get', KEYS[3])
  local token
  if last and (tonumber(last) == nil or tonumber(last) >= tonumber(now)) then
    token = redis.call('incr', KEYS[3])
  else
    redis.call('set', KEYS[3], now)
    token = tonumber(now)
  end
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  if fresh then
    -- #include stamped
    redis.call('hset', KEYS[2], KEYS[1], stamped(ARGV[3], math.floor(tonumber(now) / 1000)))
  end
  return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
