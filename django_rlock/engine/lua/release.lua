-- RLock's release (and every lock kind's that hands off between processes).
-- KEYS[1] lock hash, KEYS[2] channel, KEYS[3] index, KEYS[4] hand-off queue, KEYS[5] hand-off
-- waiters, KEYS[6] grant channel (4 to 6: kinds that hand off between processes).
-- ARGV[1] owner, ARGV[2] lease ms in force, ARGV[3] message, ARGV[4] next owner (a waiter of
-- the releasing process that is not registered, or ""), ARGV[5] its lease ms, ARGV[6] how many
-- subscribers the releasing process itself accounts for, ARGV[7] the next owner's holder info
-- (restamped here with the server's time: `stamped`),
-- ARGV[8] a token to withdraw (a waiter giving up: its own release if that very token was
-- granted the lock, recorded as "=<owner>" in the waiters hash until the owner's hold ends;
-- else its entry is dropped), ARGV[9] the releasing process's token prefix: a grant to one of
-- its own waiters is not published (the reply tells it), ARGV[10] the token of ARGV[4] (the
-- releasing process's heir, an asyncio waiter not in line yet: put in line by this script if
-- it grants the lock to someone else, so its process need not send an attempt for it),
-- ARGV[11] its budget ms (-1: none), ARGV[12] its grant lease ms, ARGV[13] ms its entry stays
-- valid past the new holder's grant lease (unless its budget ends first).
-- Reply: nil = not owner; 0 = still held (count > 0, TTL reset to the lease in force);
-- a token (string) = granted to that registered waiter, short lease, named on KEYS[6] (or,
-- for a token ending in DIRECT_TOKEN_MARK, on its owner's wake channel only; for one ending in
-- PROCESS_TOKEN_MARK, on its process's channel KEYS[6]@<process> only; either only if someone
-- listens there: else that waiter is skipped as dead); {token, 1}: the same, and ARGV[10] was
-- put in line (its entry written as acquire.lua's registration would);
-- -1 = handed to ARGV[4] (only when no other process waits: it never sees the lock free);
-- n >= 1 = released, and n - 1 subscribers got the message (1 when every subscriber is a
-- django-rlock process with nobody in line: none of them is owed the first go).
-- A foreign subscriber (on KEYS[2] but not on KEYS[6]: a Redisson client, another kind) is
-- never starved: while one waits, every other release frees the lock with Redisson's "0"
-- (whoever is first takes it), and the line is granted the others ("!turn" in KEYS[5]).

if ARGV[8] and ARGV[8] ~= '' and redis.call('hget', KEYS[5], '=' .. ARGV[1]) ~= ARGV[8] then
  redis.call('hdel', KEYS[5], ARGV[8])
  return nil
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if not count then
  return nil
end
if count > 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], -1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 0
end
local foreign = nil
-- #include stamped
local function outsiders()
  local subs = redis.call('pubsub', 'numsub', KEYS[2], KEYS[6])
  return subs[2] > subs[4]
end
local queued = KEYS[6] and redis.call('exists', KEYS[5]) == 1
-- Our own grant record goes (with the first entry read, in the same HDEL, or at the end).
local mine = queued and '=' .. ARGV[1]
local token = queued and redis.call('lpop', KEYS[4])
if token then
  foreign = outsiders()
  local grant = not foreign
  if foreign then
    -- Someone outside the line waits too (a Redisson client): it gets every other release of
    -- ours (freed with "0"), the line the others, so neither side can starve the other.
    grant = redis.call('hget', KEYS[5], '!turn') == 'line'
    redis.call('hset', KEYS[5], '!turn', grant and 'free' or 'line')
    if not grant then
      -- Back at the head; a line that was this one token was deleted by the LPOP and is made
      -- again here: it gets the hash's expiry (withdrawals only HDEL: it must not outlive it).
      if redis.call('lpush', KEYS[4], token) == 1 then
        local left = redis.call('pttl', KEYS[5])
        if left > 0 then
          redis.call('pexpire', KEYS[4], left)
        end
      end
    end
  end
  if grant then
    -- #include now_ms
    local own = ARGV[9] or ''
    while token do
      local entry = redis.call('hget', KEYS[5], token)
      if entry then
        -- The entry leaves the hash after the grant record is in it: an HSET into a hash
        -- its last HDEL removed would make it again without an expiry, a key left forever.
        -- (Our own record goes with it, unless it is the one just written: our own stale
        -- entry at the head, granted to us.)
        local function taken(written)
          if mine and mine ~= written then
            redis.call('hdel', KEYS[5], token, mine)
          else
            redis.call('hdel', KEYS[5], token)
          end
          mine = nil
        end
        local deadline, grant, info = string.match(entry, '^(%d+) (%d+) (.*)$')
        local heir = string.match(token, '^(.*)#')
        local ours = own ~= '' and string.sub(token, 1, #own) == own
        local mark = not ours and string.sub(token, -1)
        -- A waiter with a line of its own (or whose process listens on a channel of its own
        -- for this lock) hears its grant there, and nobody else does; no receiver means its
        -- process is gone (its subscription went with it): skip it.
        local alone = mark == '{{DIRECT_TOKEN_MARK}}' or mark == '{{PROCESS_TOKEN_MARK}}'
        local live = tonumber(deadline) > now
        if live and mark == '{{DIRECT_TOKEN_MARK}}' then
          live = redis.call('publish', '{{WAKE_CHANNEL_PREFIX}}:' .. heir, token) > 0
        elseif live and mark == '{{PROCESS_TOKEN_MARK}}' then
          -- (in the lock's slot: a shard channel where the lock channels are)
          live = redis.call('publish', KEYS[6] .. '@' .. string.match(heir, '^[^:]*'), token) > 0
        end
        if live then
          redis.call('del', KEYS[1])
          redis.call('hset', KEYS[1], heir, 1)
          redis.call('pexpire', KEYS[1], grant)
          redis.call('hset', KEYS[3], KEYS[1], stamped(info, now))
          if not ours and not alone then
            redis.call('publish', KEYS[6], token)
          end
          local next = ARGV[10]
          if not next or next == '' then
            redis.call('hset', KEYS[5], '=' .. heir, token)
            taken('=' .. heir)
            return token
          end
          -- The releasing process's heir gets in line behind everyone here, as its own
          -- failed attempt would have put it (acquire.lua): its entry is valid for the new
          -- holder's lease plus the slack, or its budget.
          local valid = tonumber(grant) + tonumber(ARGV[13])
          local budget = tonumber(ARGV[11])
          if budget >= 0 and budget < valid then valid = budget end
          redis.call('hset', KEYS[5], '=' .. heir, token, next,
                     (now + valid) .. ' ' .. ARGV[12] .. ' ' .. stamped(ARGV[7], now))
          taken('=' .. heir)
          -- #include keep_line
          keep_line(KEYS[4], KEYS[5], valid, redis.call('rpush', KEYS[4], next))
          return {token, 1}
        end
        taken()
      end
      token = redis.call('lpop', KEYS[4])
    end
  end
end
if mine then
  redis.call('hdel', KEYS[5], mine)
end
if ARGV[4] and ARGV[4] ~= '' and redis.call('pubsub', 'numsub', KEYS[2])[2] <= tonumber(ARGV[6])
then
  redis.call('hdel', KEYS[1], ARGV[1])
  redis.call('hset', KEYS[1], ARGV[4], 1)
  redis.call('pexpire', KEYS[1], ARGV[5])
  -- #include now_ms
  redis.call('hset', KEYS[3], KEYS[1], stamped(ARGV[7], now))
  return -1
end
redis.call('del', KEYS[1])
redis.call('hdel', KEYS[3], KEYS[1])
local n = redis.call('publish', KEYS[2], ARGV[3])
if n > 0 and KEYS[6] and foreign == nil then
  foreign = outsiders()
end
if foreign == false then
  return 1
end
return 1 + n
