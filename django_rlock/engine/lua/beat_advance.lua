-- A periodic schedule's tick, sent by the leader only: decides whether the tick is due and
-- advances the entry's progress to it, in one step, only for a term that is still current.
-- KEYS[1] the leadership hash, KEYS[2] its fencing counter, KEYS[3] the schedule's progress
-- (hash: entry name -> the last tick sent, server µs).
-- ARGV[1] the leader's owner field, ARGV[2] its term (the token, digits), ARGV[3] the entry's
-- name, ARGV[4] the tick proposed (µs), ARGV[5] the progress the tick was computed from (µs;
-- written as the entry's first progress if it has none, so its schedule stays anchored).
-- Reply: {code, progress, now}: code {{SEND}} = send it (the progress is now the tick),
-- {{NOT_YET}} = the tick is after the server's clock, {{PAST}} = the progress is at or after
-- the tick already (sent by this term or an earlier one: never again), {{STALE}} = the term is
-- not current (nothing read or written); progress = the entry's progress after the script
-- (µs, digits; false for a stale term); now = the server's TIME in µs (digits).
--
-- The term is current iff its owner field is in the leadership hash and the counter still
-- holds its token: a paused leader whose lease ran out, a deposed one (`locks clear`), or one
-- whose key a new leader holds with a higher token, all get {{STALE}}. Values are compared as
-- numbers (exact below 2**53 µs, the year 2255) and written back as the digit strings given.

local t = redis.call('time')
local now = t[1] .. string.format('%06d', tonumber(t[2]))
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 or redis.call('get', KEYS[2]) ~= ARGV[2] then
  return {{{STALE}}, false, now}
end
local last = redis.call('hget', KEYS[3], ARGV[3])
if not last then
  last = ARGV[5]
  redis.call('hset', KEYS[3], ARGV[3], last)
end
if tonumber(ARGV[4]) <= tonumber(last) then
  return {{{PAST}}, last, now}
end
if tonumber(ARGV[4]) > tonumber(now) then
  return {{{NOT_YET}}, last, now}
end
redis.call('hset', KEYS[3], ARGV[3], ARGV[4])
return {{{SEND}}, ARGV[4], now}
