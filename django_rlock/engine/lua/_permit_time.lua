-- Snippet: milliseconds of server time (`now_ms()`, `ms(x)`: a number as integer digits), a
-- permit id (32 hex chars) as its 16 raw bytes (`raw(hex)`), and `expired(now)`: the scores
-- of the permits expired at `now` (ms), the semaphore's one rule (an expiry not after now),
-- which `reclaim` drops and counts back and `pes_peek` counts as free.

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function raw(hex)
  return (string.gsub(hex, '..', function(c) return string.char(tonumber(c, 16)) end))
end
local function ms(x) return string.format('%.0f', x) end
local function expired(now) return '-inf', ms(now) end
