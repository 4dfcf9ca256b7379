-- RateLimiter's read: the permits left and how long until ARGV[1] permits could be taken by a
-- caller not in line (the live waiters' permits come first). Writes nothing.
-- KEYS[1..5] as in _rate.lua.
-- ARGV[1] permits.
-- Reply: {code, wait us, available, rate, interval ms, permits asked by waiters}; code 1 ok,
-- -1 no rate set, -2 not OVERALL, -3 permits above the rate.

-- #include rate

local rate, interval = rate_conf()
if not rate then return {interval, 0, 0, 0, 0, 0} end
local n = tonumber(ARGV[1])
if n > rate then return {-3, 0, 0, rate, interval, 0} end
local available = rate_available(rate, interval, false)
local ahead = rate_ahead(false, false)
local wait = 0
if available - ahead < n then wait = rate_wait(rate, interval, available, ahead + n) end
return {1, wait, available, rate, interval, ahead}
