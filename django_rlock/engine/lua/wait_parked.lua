-- A wait parked before its first attempt (behind a waiter of its own process): nothing to
-- try, only its record to write; sent wrapped by ``waiters.noting`` (``waiters.Parked``).
-- KEYS: none of its own. ARGV: none of its own.
-- Reply: 1.

return 1
