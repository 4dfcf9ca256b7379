-- Snippet: `stamp`, the server time as "<s>.<us>": the time part of an index entry in format 1
-- ("<s>.<us> <json>"), which the kinds without a holder write ({"kind": ...}: a semaphore, a
-- latch, a rate limiter). Holders' entries are format 2 (lockinfo.parse_entry), stamped by the
-- holder (identity.thread_info) or, on a hand-off, by `stamped`.

local t = redis.call('time'); local stamp = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
