-- Snippet: `stamp`, the server time as "<s>.<us>", the time part of an index entry.
-- The index (naming.index_key): one hash per prefix, field = lock key, value =
-- "<server time, s.us> <json about the holder>". Written only where a holder starts (a new
-- lock, a hand-off) and removed where the key is deleted: never on reentry or renewal, so it
-- costs the hot path a TIME and an HSET per new lock. Entries of locks that expired are pruned
-- on read.

local t = redis.call('time'); local stamp = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
