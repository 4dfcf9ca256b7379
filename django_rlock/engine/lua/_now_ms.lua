-- Snippet: `now`, the server time in milliseconds (`t`: its TIME reply).

local t = redis.call('time'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
