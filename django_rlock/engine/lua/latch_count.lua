-- A latch waiter's look at the count (its wait loop's retry; the first look is a plain GET):
-- sent wrapped by ``waiters.noting``, it carries the waiter's record.
-- KEYS[1] latch key. ARGV: none.
-- Reply: the count (nil: open).

return redis.call('get', KEYS[1])
