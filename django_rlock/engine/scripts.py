"""Lua scripts and the one way they are sent.

Acquire and release go through :func:`call_once`: one EVALSHA on a pooled connection with no
client-side retry. redis-py's default ``Retry`` re-sends a command after a timeout; for an
acquire that doubles the hold count and orphans the lock (Redisson #4822, #7367), for a
release it produces a false "not owner" (#4871). A failure here propagates unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    NoScriptError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

from .clients import (
    async_twin,
    cluster_of,
    node_at,
    node_client,
    own_connection,
    refresh,
    sharded,
)
from .naming import DIRECT_TOKEN_MARK, WAKE_CHANNEL_PREFIX

# The index (``naming.index_key``): one hash per prefix, field = lock key, value =
# "<server time, s.us> <json about the holder>". Written only where a holder starts (a new lock,
# a hand-off) and removed where the key is deleted: never on reentry or renewal, so it costs the
# hot path a TIME and an HSET per new lock. Entries of locks that expired are pruned on read.
_STAMP = "local t = redis.call('time'); local stamp = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))"

_NOW_MS = ("local t = redis.call('time'); "
           "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)")

#: Reply of an acquire in claim mode whose owner was granted the lock meanwhile (it holds it
#: already: nothing is counted twice; the grant's short lease is now the full one).
CLAIMED = -3

# KEYS[1] lock hash, KEYS[2] index, KEYS[3] hand-off queue, KEYS[4] hand-off waiters (3 and 4
# only with a token); ARGV[1] lease ms, ARGV[2] owner field, ARGV[3] holder info, ARGV[4] mode:
# "" (a reentrant first attempt), "fresh" (a first attempt by an owner that holds nothing as
# far as its process knows: a field of its already there is a grant nobody took, taken as a
# new hold at count 1, never counted on top) or "claim" (a waiter's retry), ARGV[5] token (a
# waiter: registered if the attempt fails), ARGV[6] its budget ms (-1: none), ARGV[7] slack ms
# past the holder's PTTL, ARGV[8] grant lease ms.
# Reply: nil = acquired (new or reentrant); CLAIMED (see above); else the holder's PTTL (-1:
# no expiry), and the waiter is registered: queued once per token, its entry valid until its
# budget ends or the holder's PTTL plus the slack has passed (it re-registers on every retry).
ACQUIRE = """
if ARGV[4] == 'claim' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return """ + str(CLAIMED) + """
end
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  """ + _STAMP + """
  redis.call('hset', KEYS[2], KEYS[1], stamp .. ' ' .. ARGV[3])
  if ARGV[4] == 'claim' and KEYS[4] then
    redis.call('hdel', KEYS[4], ARGV[5], '=' .. ARGV[2])
  end
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  if ARGV[4] == 'fresh' then
    redis.call('hset', KEYS[1], ARGV[2], 1)
  else
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
  end
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
local ttl = redis.call('pttl', KEYS[1])
if ARGV[5] then
  """ + _NOW_MS + """
  local valid = ttl
  if valid < 0 then valid = 60000 end
  valid = valid + tonumber(ARGV[7])
  local budget = tonumber(ARGV[6])
  if budget >= 0 and budget < valid then valid = budget end
  local entry = (now + valid) .. ' ' .. ARGV[8] .. ' ' .. ARGV[3]
  if redis.call('hexists', KEYS[4], ARGV[5]) == 0 then
    redis.call('rpush', KEYS[3], ARGV[5])
  end
  redis.call('hset', KEYS[4], ARGV[5], entry)
  if redis.call('pttl', KEYS[4]) < valid then
    redis.call('pexpire', KEYS[4], valid)
    redis.call('pexpire', KEYS[3], valid)
  end
end
return ttl
"""

# KEYS[1] lock hash, KEYS[2] channel, KEYS[3] index, KEYS[4] hand-off queue, KEYS[5] hand-off
# waiters, KEYS[6] grant channel (4 to 6: kinds that hand off between processes); ARGV[1]
# owner, ARGV[2] lease ms in force, ARGV[3] message, ARGV[4] next owner (a waiter of the
# releasing process that is not registered, or ""), ARGV[5] its lease ms, ARGV[6] how many
# subscribers the releasing process itself accounts for, ARGV[7] the next owner's holder info,
# ARGV[8] a token to withdraw (a waiter giving up: its own release if that very token was
# granted the lock, recorded as "=<owner>" in the waiters hash until the owner's hold ends;
# else its entry is dropped), ARGV[9] the releasing process's token prefix: a grant
# to one of its own waiters is not published (the reply tells it).
# Reply: nil = not owner; 0 = still held (count > 0, TTL reset to the lease in force);
# a token (string) = granted to that registered waiter, short lease, named on KEYS[6] (or,
# for a token ending in DIRECT_TOKEN_MARK, on its owner's wake channel only, and only if
# someone listens there: else that waiter is skipped as dead);
# -1 = handed to ARGV[4] (only when no other process waits: it never sees the lock free);
# n >= 1 = released, and n - 1 subscribers got the message (1 when every subscriber is a
# django-rlock process with nobody in line: none of them is owed the first go).
# A foreign subscriber (on KEYS[2] but not on KEYS[6]: a Redisson client, another kind) is
# never starved: while one waits, every other release frees the lock with Redisson's "0"
# (whoever is first takes it), and the line is granted the others ("!turn" in KEYS[5]).
RELEASE = """
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
local function outsiders()
  local subs = redis.call('pubsub', 'numsub', KEYS[2], KEYS[6])
  return subs[2] > subs[4]
end
local queued = KEYS[6] and redis.call('exists', KEYS[5]) == 1
if queued then
  redis.call('hdel', KEYS[5], '=' .. ARGV[1])
end
if queued and redis.call('llen', KEYS[4]) > 0 then
  foreign = outsiders()
  local grant = not foreign
  if foreign then
    -- Someone outside the line waits too (a Redisson client): it gets every other release of
    -- ours (freed with "0"), the line the others, so neither side can starve the other.
    grant = redis.call('hget', KEYS[5], '!turn') == 'line'
    redis.call('hset', KEYS[5], '!turn', grant and 'free' or 'line')
  end
  if grant then
    """ + _NOW_MS + """
    while true do
      local token = redis.call('lpop', KEYS[4])
      if not token then
        break
      end
      local entry = redis.call('hget', KEYS[5], token)
      if entry then
        redis.call('hdel', KEYS[5], token)
        local deadline, grant, info = string.match(entry, '^(%d+) (%d+) (.*)$')
        local heir = string.match(token, '^(.*)#')
        local own = ARGV[9] or ''
        local ours = own ~= '' and string.sub(token, 1, #own) == own
        local direct = not ours and string.sub(token, -1) == '""" + DIRECT_TOKEN_MARK + """'
        -- A waiter with a line of its own hears its grant there, and nobody else does; no
        -- receiver means its process is gone (its subscription went with it): skip it.
        if tonumber(deadline) > now and (not direct or
            redis.call('publish', '""" + WAKE_CHANNEL_PREFIX + """:' .. heir, token) > 0) then
          redis.call('del', KEYS[1])
          redis.call('hset', KEYS[1], heir, 1)
          redis.call('hset', KEYS[5], '=' .. heir, token)
          redis.call('pexpire', KEYS[1], grant)
          """ + _STAMP + """
          redis.call('hset', KEYS[3], KEYS[1], stamp .. ' ' .. info)
          if not ours and not direct then
            redis.call('publish', KEYS[6], token)
          end
          return token
        end
      end
    end
  end
end
if ARGV[4] and ARGV[4] ~= '' and redis.call('pubsub', 'numsub', KEYS[2])[2] <= tonumber(ARGV[6])
then
  redis.call('hdel', KEYS[1], ARGV[1])
  redis.call('hset', KEYS[1], ARGV[4], 1)
  redis.call('pexpire', KEYS[1], ARGV[5])
  """ + _STAMP + """
  redis.call('hset', KEYS[3], KEYS[1], stamp .. ' ' .. ARGV[7])
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
"""

# KEYS = lock hashes; ARGV = owner, lease ms for each key in turn.
# Reply: one 1 (renewed) or 0 (gone or no longer ours: lost) per key.
RENEW = """
local result = {}
for i = 1, #KEYS do
  if redis.call('hexists', KEYS[i], ARGV[2 * i - 1]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[2 * i])
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
"""

# KEYS[1] lock hash, KEYS[2] channel, KEYS[3] index; ARGV[1] message.
# Reply: 1 deleted (and published), 0 none.
FORCE_UNLOCK = """
redis.call('hdel', KEYS[3], KEYS[1])
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
return 0
"""


# KEYS[1] lock hash, KEYS[2] channel, KEYS[3] index; ARGV[1] owner, ARGV[2] message. Drops
# every hold of one owner that can never release it (its thread or task has ended).
# Reply: 1 deleted, 0 not held by it.
FORCE_UNLOCK_OWNER = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call('hdel', KEYS[3], KEYS[1])
  redis.call('publish', KEYS[2], ARGV[2])
  return 1
end
return 0
"""

# KEYS[1] index, KEYS[2..n] lock keys read as gone. Drops their entries unless the key exists
# again (taken since the read): a listing never unlists a live lock.
PRUNE_INDEX = """
local n = 0
for i = 2, #KEYS do
  if redis.call('exists', KEYS[i]) == 0 then
    n = n + redis.call('hdel', KEYS[1], KEYS[i])
  end
end
return n
"""


class Script:
    """A Lua source with its SHA1, computed locally so no SCRIPT LOAD round trip is needed.

    ``sharded``: the same script for a server whose lock channels are shard channels
    (``clients.sharded``): SPUBLISH and PUBSUB SHARDNUMSUB on them. A wake line's channel is
    named by owner, in no slot: it stays a classic PUBLISH (which a cluster broadcasts).
    """

    __slots__ = ("source", "sha", "_sharded")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self._sharded: Script | None = None

    def __repr__(self) -> str:
        return f"Script({self.sha[:8]})"

    @property
    def sharded(self) -> Script:
        if self._sharded is None:
            wake = "redis.call('publish', '" + WAKE_CHANNEL_PREFIX
            src = (self.source.replace("redis.call('publish', ", "redis.call('spublish', ")
                   .replace("redis.call('spublish', '" + WAKE_CHANNEL_PREFIX, wake)
                   .replace("'pubsub', 'numsub'", "'pubsub', 'shardnumsub'"))
            self._sharded = self if src == self.source else Script(src)
        return self._sharded

    def on(self, client: Any) -> Script:
        """The variant to send on ``client``'s server."""
        return self.sharded if sharded(client) else self


ACQUIRE_SCRIPT = Script(ACQUIRE)
RELEASE_SCRIPT = Script(RELEASE)
RENEW_SCRIPT = Script(RENEW)
FORCE_UNLOCK_SCRIPT = Script(FORCE_UNLOCK)
FORCE_UNLOCK_OWNER_SCRIPT = Script(FORCE_UNLOCK_OWNER)
PRUNE_INDEX_SCRIPT = Script(PRUNE_INDEX)


def _send_once(conn: Any, args: tuple[Any, ...], wait: tuple[int, int] | None = None) -> Any:
    """Send one command (and, with ``wait``, a ``WAIT`` behind it in the same write); read the
    reply (a pair: reply or error, then acknowledged replicas or error)."""
    try:
        if wait is None:
            conn.send_command(*args)
            return conn.read_response()
        conn.send_packed_command(conn.pack_commands([args, ("WAIT", *wait)]))
        replies: list[Any] = []
        for _ in range(2):  # an error reply still leaves the connection in step: read both
            try:
                replies.append(conn.read_response())
            except ResponseError as err:
                replies.append(err)
        return replies
    except ResponseError:
        raise  # a whole reply was read: the connection is still in step
    except BaseException:
        # A lost or partial reply leaves the connection out of step; never reuse it.
        conn.disconnect()
        raise


def _call_on(conn: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...],
             wait: tuple[int, int] | None = None, asking: bool = False) -> Any:
    try:
        if asking:  # an ASK redirection: it covers the one command that follows
            _send_once(conn, ("ASKING",))
        out = _send_once(conn, ("EVALSHA", script.sha, len(keys), *keys, *args), wait)
        if wait is not None and isinstance(out[0], NoScriptError):
            raise out[0]
    except NoScriptError:
        # NOSCRIPT means nothing ran, so sending the source now cannot run the script twice.
        if asking:
            _send_once(conn, ("ASKING",))
        out = _send_once(conn, ("EVAL", script.source, len(keys), *keys, *args), wait)
    if wait is not None and isinstance(out[0], ResponseError):
        raise out[0]
    return out


def _call_once(client: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...],
               wait: tuple[int, int] | None = None, asking: bool = False) -> Any:
    script = script.on(client)
    conn = getattr(client, "connection", None)
    if conn is not None:  # single_connection_client=True
        with client.single_connection_lock:
            return _call_on(conn, script, keys, args, wait, asking)
    pool = client.connection_pool
    own = own_connection(pool)
    if own is not None and own.busy:
        own = None  # this thread's connection awaits a reply: borrow one from the pool
    try:
        conn = pool.get_connection() if own is None else own.take(pool)
    except (ConnectionError, TimeoutError) as exc:
        if cluster_of(client) is None:
            raise
        raise _NotSent(exc) from exc  # on a cluster node: maybe its slot has a new master
    if own is None:
        try:
            return _call_on(conn, script, keys, args, wait, asking)
        finally:
            pool.release(conn)
    own.busy = True
    try:
        return _call_on(conn, script, keys, args, wait, asking)
    finally:
        own.busy = False
        own.used = time.monotonic()


class _NotSent(Exception):
    """No connection to the server could be had: nothing was sent (``args[0]``: the error)."""


#: Replies of a cluster node that mean the script did not run: safe to send it again elsewhere.
_NOT_RUN = (AskError, TryAgainError, ClusterDownError)
#: Pauses before sending again after TRYAGAIN (keys of a slot half moved), CLUSTERDOWN or no
#: connection to the slot's master (a failover under way): about 5 s in all, longer than a
#: failover with a 1 s node timeout takes.
REDIRECT_BACKOFF = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.2, 1.2, 1.2)


def call_once(client: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...],
              wait: tuple[int, int] | None = None) -> Any:
    """Run ``script`` exactly once on ``client`` (a redis-py ``Redis``); never retry.

    ``wait=(replicas, timeout_ms)`` sends ``WAIT`` behind it in the same round trip and returns
    ``(reply, acknowledged)``; ``acknowledged`` is the WAIT error if the server refused it.

    On a cluster node (``clients.node_client``) a reply that says the script did not run
    (MOVED, ASK, TRYAGAIN, CLUSTERDOWN), or no connection to be had at all, sends it where the
    slot is now; a connection lost after the send is still raised (the script may have run),
    but the slot map is refreshed for the next call.
    """
    return _following(client, script, keys, args, wait)


def _following(client: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...],
               wait: tuple[int, int] | None, send: Callable[[], Any] | None = None) -> Any:
    """``send()`` (default: ``_call_once``, on the hot path without a closure); on a cluster
    node, send again where the slot is now if the server said nothing ran, and refresh the
    slot map after a lost connection."""
    try:
        return send() if send is not None else _call_once(client, script, keys, args, wait)
    except (*_NOT_RUN, _NotSent) as exc:
        cluster = cluster_of(client)
        if cluster is None:
            raise
        return _redirected(cluster, exc, script, keys, args, wait)
    except (ConnectionError, TimeoutError) as exc:
        cluster = cluster_of(client)
        if cluster is not None:
            refresh(cluster, exc)
        raise


def _retarget(cluster: Any, exc: Exception, keys: tuple[Any, ...]) -> tuple[Any, bool]:
    """Where to send again after ``exc`` (a reply that says nothing ran): the slot's master
    now (refreshing the map), or for ASK the migration's target; and whether to ASK."""
    if isinstance(exc, AskError) and not isinstance(exc, MovedError):
        return node_at(cluster, exc.host, exc.port), True  # the slot migrates; keys are there
    refresh(cluster, exc)  # MOVED; TRYAGAIN, CLUSTERDOWN, its master unreachable (failover)
    return node_client(cluster, keys[0]), False


def _pause(exc: Exception) -> bool:
    """Wait before sending again: not after a redirection, which names where to go now."""
    return not isinstance(exc, AskError)


def _redirected(cluster: Any, exc: Exception, script: Script, keys: tuple[Any, ...],
                args: tuple[Any, ...], wait: tuple[int, int] | None) -> Any:
    for pause in REDIRECT_BACKOFF:
        if _pause(exc):
            time.sleep(pause)
        target, asking = _retarget(cluster, exc, keys)
        try:
            return _call_once(target, script, keys, args, wait, asking)
        except (*_NOT_RUN, _NotSent) as again:
            exc = again
    raise exc.args[0] if isinstance(exc, _NotSent) else exc


def call(client: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
    """Run an idempotent script through the client's normal path (its retry policy applies);
    on a cluster node, follow its slot as ``call_once`` does."""
    sent = script.on(client)

    def send() -> Any:
        try:
            return client.evalsha(sent.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(sent.source, len(keys), *keys, *args)

    return _following(client, script, keys, args, None, send)


async def _asend_once(conn: Any, args: tuple[Any, ...], wait: tuple[int, int] | None = None) -> Any:
    try:
        if wait is None:
            await conn.send_command(*args)
            return await conn.read_response()
        await conn.send_packed_command(conn.pack_commands([args, ("WAIT", *wait)]))
        replies: list[Any] = []
        for _ in range(2):
            try:
                replies.append(await conn.read_response())
            except ResponseError as err:
                replies.append(err)
        return replies
    except ResponseError:
        raise
    except BaseException:
        # Includes CancelledError mid-reply: the connection is out of step (redis-py #3847).
        await conn.disconnect()
        raise


async def _acall_on(conn: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...],
                    wait: tuple[int, int] | None = None, asking: bool = False) -> Any:
    try:
        if asking:
            await _asend_once(conn, ("ASKING",))
        out = await _asend_once(conn, ("EVALSHA", script.sha, len(keys), *keys, *args), wait)
        if wait is not None and isinstance(out[0], NoScriptError):
            raise out[0]
    except NoScriptError:
        if asking:
            await _asend_once(conn, ("ASKING",))
        out = await _asend_once(conn, ("EVAL", script.source, len(keys), *keys, *args), wait)
    if wait is not None and isinstance(out[0], ResponseError):
        raise out[0]
    return out


async def _acall_once(client: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...],
                      wait: tuple[int, int] | None = None, asking: bool = False) -> Any:
    script = script.on(client)
    conn = getattr(client, "connection", None)
    if conn is not None:  # single_connection_client=True
        async with client._single_conn_lock:
            return await _acall_on(conn, script, keys, args, wait, asking)
    pool = client.connection_pool
    try:
        conn = await pool.get_connection()
    except (ConnectionError, TimeoutError) as exc:
        if cluster_of(client) is None:
            raise
        raise _NotSent(exc) from exc
    try:
        return await _acall_on(conn, script, keys, args, wait, asking)
    finally:
        await pool.release(conn)


async def acall_once(client: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...],
                     wait: tuple[int, int] | None = None) -> Any:
    """``call_once`` for a ``redis.asyncio`` client (an asyncio lock on a cluster sends on the
    asyncio twin of its slot master's client, and follows the slot the same way)."""
    try:
        return await _acall_once(client, script, keys, args, wait)
    except (*_NOT_RUN, _NotSent) as exc:
        cluster = cluster_of(client)
        if cluster is None:
            raise
        return await _aredirected(cluster, exc, script, keys, args, wait)
    except (ConnectionError, TimeoutError) as exc:
        cluster = cluster_of(client)
        if cluster is not None:
            refresh(cluster, exc)
        raise


async def _aredirected(cluster: Any, exc: Exception, script: Script, keys: tuple[Any, ...],
                       args: tuple[Any, ...], wait: tuple[int, int] | None) -> Any:
    """``_redirected`` on the asyncio twins of the node clients (a refresh blocks briefly)."""
    for pause in REDIRECT_BACKOFF:
        if _pause(exc):
            await asyncio.sleep(pause)
        target, asking = _retarget(cluster, exc, keys)
        try:
            return await _acall_once(async_twin(target), script, keys, args, wait, asking)
        except (*_NOT_RUN, _NotSent) as again:
            exc = again
    raise exc.args[0] if isinstance(exc, _NotSent) else exc


# Enqueue de-duplication marks: a hash in lock layout whose one field is "<task id>:0", so the
# watchdog can renew it while the task runs and `locks list` shows which task holds it.
# KEYS[1] mark, KEYS[2] (optional) index; ARGV[1] field, ARGV[2] ttl ms, ARGV[3] holder info.
# Reply: nil = ours now (new, or our own retry: TTL reset); else the field that holds it.
MARK_CLAIM = """
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  if KEYS[2] and redis.call('exists', KEYS[1]) == 0 then
    """ + _STAMP + """
    redis.call('hset', KEYS[2], KEYS[1], stamp .. ' ' .. ARGV[3])
  end
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return nil
end
return redis.call('hkeys', KEYS[1])[1]
"""

# KEYS[1] mark, KEYS[2] (optional) index; ARGV[1] field. Reply: 1 if it was ours and is gone.
MARK_RELEASE = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('del', KEYS[1])
  if KEYS[2] then
    redis.call('hdel', KEYS[2], KEYS[1])
  end
  return 1
end
return 0
"""

MARK_CLAIM_SCRIPT = Script(MARK_CLAIM)
MARK_RELEASE_SCRIPT = Script(MARK_RELEASE)
