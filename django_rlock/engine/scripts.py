"""Lua scripts and the one way they are sent.

Acquire and release go through :func:`call_once`: one EVALSHA on a pooled connection with no
client-side retry. redis-py's default ``Retry`` re-sends a command after a timeout; for an
acquire that doubles the hold count and orphans the lock (Redisson #4822, #7367), for a
release it produces a false "not owner" (#4871). A failure here propagates unchanged.
"""

from __future__ import annotations

import asyncio
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

from .aiopool import (
    cancel_dropped,
    cancelling,
    closed_while_idle,
    drained,
    kept,
    packed,
    written,
)
from .clients import (
    async_twin,
    cluster_of,
    node_at,
    node_client,
    own_connection,
    refresh,
)
from .lua import Script, source
from .naming import DIRECT_TOKEN_MARK, PROCESS_TOKEN_MARK, WAKE_CHANNEL_PREFIX

#: Reply of an acquire in claim mode whose owner was granted the lock meanwhile (it holds it
#: already: nothing is counted twice; the grant's short lease is now the full one).
CLAIMED = -3

# The scripts: KEYS, ARGV and the reply of each are in its file's header (``lua/<name>.lua``).
ACQUIRE = source("acquire", CLAIMED=CLAIMED)
RELEASE = source("release", DIRECT_TOKEN_MARK=DIRECT_TOKEN_MARK,
                 PROCESS_TOKEN_MARK=PROCESS_TOKEN_MARK, WAKE_CHANNEL_PREFIX=WAKE_CHANNEL_PREFIX)
RENEW = source("renew")
FORCE_UNLOCK = source("force_unlock")
FORCE_UNLOCK_OWNER = source("force_unlock_owner")
PRUNE_INDEX = source("prune_index")

ACQUIRE_SCRIPT = Script(ACQUIRE)
RELEASE_SCRIPT = Script(RELEASE)
RENEW_SCRIPT = Script(RENEW)
FORCE_UNLOCK_SCRIPT = Script(FORCE_UNLOCK)
FORCE_UNLOCK_OWNER_SCRIPT = Script(FORCE_UNLOCK_OWNER)
PRUNE_INDEX_SCRIPT = Script(PRUNE_INDEX)


def _send_once(conn: Any, args: tuple[Any, ...], wait: tuple[int, int] | None = None,
               meanwhile: Callable[[], Any] | None = None) -> Any:
    """Send one command (and, with ``wait``, a ``WAIT`` behind it in the same write); read the
    reply (a pair: reply or error, then acknowledged replicas or error). ``meanwhile()`` runs
    between the write and the read (without ``wait`` only)."""
    try:
        if wait is None:
            conn.send_command(*args)
            if meanwhile is not None:
                meanwhile()
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
             wait: tuple[int, int] | None = None, asking: bool = False,
             meanwhile: Callable[[], Any] | None = None) -> Any:
    try:
        if asking:  # an ASK redirection: it covers the one command that follows
            _send_once(conn, ("ASKING",))
        out = _send_once(conn, ("EVALSHA", script.sha, len(keys), *keys, *args), wait, meanwhile)
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
               wait: tuple[int, int] | None = None, asking: bool = False,
               meanwhile: Callable[[], Any] | None = None) -> Any:
    script = script.on(client)
    conn = getattr(client, "connection", None)
    if conn is not None:  # single_connection_client=True
        with client.single_connection_lock:
            return _call_on(conn, script, keys, args, wait, asking, meanwhile)
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
            return _call_on(conn, script, keys, args, wait, asking, meanwhile)
        finally:
            pool.release(conn)
    own.busy = True
    try:
        return _call_on(conn, script, keys, args, wait, asking, meanwhile)
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
              wait: tuple[int, int] | None = None,
              meanwhile: Callable[[], Any] | None = None) -> Any:
    """Run ``script`` exactly once on ``client`` (a redis-py ``Redis``); never retry.

    ``wait=(replicas, timeout_ms)`` sends ``WAIT`` behind it in the same round trip and returns
    ``(reply, acknowledged)``; ``acknowledged`` is the WAIT error if the server refused it.

    On a cluster node (``clients.node_client``) a reply that says the script did not run
    (MOVED, ASK, TRYAGAIN, CLUSTERDOWN), or no connection to be had at all, sends it where the
    slot is now; a connection lost after the send is still raised (the script may have run),
    but the slot map is refreshed for the next call.

    ``meanwhile()`` (without ``wait``): work that needs no reply, run once the command is
    written and before its reply is read, while the server runs the script (at most once: not
    again for a NOSCRIPT or a redirection's second send). It must not raise.
    """
    return _following(client, script, keys, args, wait, None, meanwhile)


def _following(client: Any, script: Script, keys: tuple[Any, ...], args: tuple[Any, ...],
               wait: tuple[int, int] | None, send: Callable[[], Any] | None = None,
               meanwhile: Callable[[], Any] | None = None) -> Any:
    """``send()`` (default: ``_call_once``, on the hot path without a closure); on a cluster
    node, send again where the slot is now if the server said nothing ran, and refresh the
    slot map after a lost connection."""
    try:
        return send() if send is not None else _call_once(client, script, keys, args, wait,
                                                          False, meanwhile)
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
            await _aready(client, conn)
            return await _acall_on(conn, script, keys, args, wait, asking)
    pool = client.connection_pool
    try:
        conn = await pool.get_connection()
    except (ConnectionError, TimeoutError) as exc:
        if cluster_of(client) is None:
            raise
        raise _NotSent(exc) from exc
    try:
        await _aready(client, conn)
        return await _acall_on(conn, script, keys, args, wait, asking)
    finally:
        await pool.release(conn)


async def _aready(client: Any, conn: Any) -> None:
    """Before the script is written: an idle connection the server closed (a restart, its
    ``timeout``) is replaced, as a sync checkout does (invariant 38). Nothing has been sent,
    so a failure to connect again is raised as such ("not sent" on a cluster node)."""
    if not closed_while_idle(conn):
        return
    try:
        await conn.disconnect()
        await conn.connect()
    except (ConnectionError, TimeoutError) as exc:
        if cluster_of(client) is None:
            raise
        raise _NotSent(exc) from exc


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


class Cut(BaseException):
    """The caller of ``ashielded`` was cancelled after its script was written. ``rest`` (a
    future) finishes the round trip in a task of its own and resolves to the reply, as the
    shielded task did; ``cancel`` is the cancellation, to raise once the caller has arranged
    what ``rest`` needs (waited for it, or booked it when it lands). A ``BaseException``, so
    that no ``except Exception`` swallows it; never let out of the engine."""

    def __init__(self, rest: asyncio.Future[Any], cancel: asyncio.CancelledError) -> None:
        super().__init__(rest, cancel)
        self.rest = rest
        self.cancel = cancel


def shielded_task(coro: Any) -> Any:
    """``await`` this: ``coro`` in a task of its own, shielded; a cancellation raises ``Cut``."""
    fut = asyncio.ensure_future(coro)

    async def wait() -> Any:
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError as exc:
            raise Cut(fut, exc) from None
    return wait()


async def ashielded(client: Any, script: Script, keys: tuple[Any, ...],
                    args: tuple[Any, ...]) -> Any:
    """``acall_once`` that a cancellation of the caller never cuts in half, sent from the
    calling task (the hot path of ``AsyncRLock``: no task per script, invariant 8).

    Until the script is written, a cancellation propagates as is: nothing ran. From the write
    on, the round trip completes whatever happens to the caller: a cancellation raises ``Cut``,
    whose ``rest`` reads the reply in a task of its own (redis-py's parsers resume a read that
    was interrupted when the connection is not dropped, ``disconnect_on_error=False``). Where
    that cannot be done (a single-connection client, a connection redis-py gives no writer
    for), and for what follows an error reply (NOSCRIPT, a cluster redirection), the whole
    call runs in a shielded task as before.
    """
    if getattr(client, "connection", None) is not None:
        return await shielded_task(acall_once(client, script, keys, args))
    sent = script.on(client)
    pool = client.connection_pool
    home = kept(pool) or pool  # where the connection goes back: kept, or into the pool
    cancels = cancelling()
    try:
        conn = await home.take(pool) if home is not pool else await pool.get_connection()
    except (ConnectionError, TimeoutError):
        if cluster_of(client) is None:
            raise
        return await shielded_task(acall_once(client, script, keys, args))  # not sent
    try:
        await _aready(client, conn)
        if cancel_dropped(cancels):
            raise asyncio.CancelledError  # dropped by redis-py's connect (``mark_cancels``)
        ok = written(conn, packed(conn, ("EVALSHA", sent.sha, len(keys), *keys, *args)))
    except _NotSent:  # a cluster node we could not connect to again: nothing was written
        await home.release(conn)
        return await shielded_task(acall_once(client, script, keys, args))
    except BaseException:
        await home.release(conn)
        raise  # nothing written: nothing ran
    if not ok:
        await home.release(conn)
        return await shielded_task(acall_once(client, script, keys, args))
    err: ResponseError | None = None
    try:
        await drained(conn)
        reply = await _reply(conn)
    except asyncio.CancelledError as exc:
        raise Cut(asyncio.ensure_future(_rest(client, home, conn, script, keys, args)),
                  exc) from None
    except ResponseError as exc:
        reply, err = None, exc
    except (ConnectionError, TimeoutError) as exc:
        await home.release(conn)
        cluster = cluster_of(client)
        if cluster is not None:
            refresh(cluster, exc)
        raise
    except BaseException:
        await home.release(conn)
        raise
    try:
        await home.release(conn)
    except asyncio.CancelledError as exc:  # the reply is in: the caller must still see it
        raise Cut(asyncio.ensure_future(_settled(client, reply, err, script, keys, args)),
                  exc) from None
    if err is not None:
        return await shielded_task(_after_error(client, err, script, keys, args))
    return reply


async def _settled(client: Any, reply: Any, err: ResponseError | None, script: Script,
                   keys: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
    return reply if err is None else await _after_error(client, err, script, keys, args)


async def _reply(conn: Any) -> Any:
    """The reply to what was written; a cancellation leaves the connection as it is (the read
    goes on later); any other failure but an error reply drops it (out of step)."""
    try:
        return await conn.read_response(disconnect_on_error=False)
    except (ResponseError, asyncio.CancelledError):
        raise
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


async def _rest(client: Any, home: Any, conn: Any, script: Script, keys: tuple[Any, ...],
                args: tuple[Any, ...]) -> Any:
    """What a ``Cut`` left: the reply (its connection given back), as ``acall_once`` reads it."""
    try:
        await drained(conn)
        reply = await _reply(conn)
    except ResponseError as exc:
        await home.release(conn)
        return await _after_error(client, exc, script, keys, args)
    except asyncio.CancelledError:
        await conn.disconnect(nowait=True)  # abandoned mid-reply (its loop is closing)
        await home.release(conn)
        raise
    except BaseException as exc:
        await home.release(conn)
        cluster = cluster_of(client)
        if cluster is not None and isinstance(exc, (ConnectionError, TimeoutError)):
            refresh(cluster, exc)
        raise
    await home.release(conn)
    return reply


async def _after_error(client: Any, exc: ResponseError, script: Script, keys: tuple[Any, ...],
                       args: tuple[Any, ...]) -> Any:
    """An error reply to a script written by ``ashielded``: NOSCRIPT (nothing ran: EVAL it) and
    a cluster's "not run here" (send it where the slot is now) as ``acall_once`` does; any
    other error is the script's own, raised."""
    if isinstance(exc, NoScriptError):
        return await acall_once(client, script, keys, args)  # EVALSHA, NOSCRIPT again, EVAL
    if isinstance(exc, _NOT_RUN):
        cluster = cluster_of(client)
        if cluster is not None:
            return await _aredirected(cluster, exc, script, keys, args, None)
    raise exc


# Enqueue de-duplication marks (the Celery layer's): ``lua/mark_claim.lua``, ``mark_release.lua``.
MARK_CLAIM = source("mark_claim")
MARK_RELEASE = source("mark_release")

MARK_CLAIM_SCRIPT = Script(MARK_CLAIM)
MARK_RELEASE_SCRIPT = Script(MARK_RELEASE)
