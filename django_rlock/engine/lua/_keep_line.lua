-- Snippet: `keep_line(queue, waiters, valid, n)`, after an entry valid for `valid` ms went into
-- the waiters hash and its token into the line (`n`: the line's length after the RPUSH, 0 if
-- none was pushed). The line lives as long as its longest entry: raised (with room, so most
-- registrations only read it), never shortened; a list just made again gets the hash's.

local function keep_line(queue, waiters, valid, n)
  local left = redis.call('pttl', waiters)
  if left < valid then
    redis.call('pexpire', waiters, 2 * valid)
    redis.call('pexpire', queue, 2 * valid)
  elseif n == 1 then
    redis.call('pexpire', queue, left)
  end
end
