-- Snippet: `made(key, index)`: list `key` in the index, as a {{KIND}}, if it does not exist
-- yet (call it just before a write that may create it). #include made KIND=<kind>.

local function made(key, index)
  if redis.call('exists', key) == 0 then
    -- #include stamp
    redis.call('hset', index, key, stamp .. ' {"kind":"{{KIND}}"}')
  end
end
