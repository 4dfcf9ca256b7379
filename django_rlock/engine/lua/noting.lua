-- A waiter's attempt (``waiters.noting``): a kind's acquire script, put in place of the line
-- `-- the kind's script` by Python (after its own expansion), run as a function of its own
-- KEYS and ARGV; then the waiter's record (`_waiting.lua`) by what it replied.
-- KEYS: the kind's, then the waiting hash of the key (``naming.waiting_key``).
-- ARGV: the kind's, then token, budget ms, bound ms, slack ms, holder info (``waiters.Note``).
-- Reply: the kind's.

local nk, na = #KEYS - 1, #ARGV - 5
local function attempt(KEYS, ARGV)
  -- the kind's script
end
local reply = attempt({unpack(KEYS, 1, nk)}, {unpack(ARGV, 1, na)})
-- #include waiting
