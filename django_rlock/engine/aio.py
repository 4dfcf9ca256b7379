"""AsyncRLock: the RLock on a ``redis.asyncio`` client, owned by the asyncio *task*.

Same scripts, same Redis layout, same semantics: reentrant per task, exclusive across tasks,
threads and processes. Acquire and release never block the event loop. Renewal and waiting
are the process's shared ones (one watchdog thread, one pub/sub subscription per server); they
reach the server through a sync twin of the client (``clients.sync_twin``) unless one is given.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import events, identity, leases, records, replicas, taskholds, waiters
from .aiopool import cancel_dropped, mark_cancels, reset_budget, reset_cancels, set_budget
from .clients import SlotBound, async_twin, refresh, sync_twin
from .errors import LockNotOwnedError
from .kinds import Kind, declare
from .lock import HoldKey, LockBase, RLock, log_masked_release, ttl_seconds
from .lua import Script
from .naming import PROCESS_TOKEN_MARK, UNLOCK_MESSAGE
from .scripts import RELEASE_SCRIPT, RENEW_SCRIPT, Cut, acall_once, ashielded, shielded_task
from .wait import loop as waiting
from .watchdog import server_id, watchdog

logger = logging.getLogger("django_rlock")

class AsyncRLock(LockBase):
    """A reentrant, Redisson-compatible distributed lock for asyncio code.

    The owner is ``<process uuid>:<task number>``: two concurrent tasks never share a hold,
    even on one thread (which ``sync_to_async`` and every event loop give them).
    ``sync_client``: a sync redis-py client to the same server for renewal and waiting;
    made from ``client``'s settings when omitted.
    """

    _CLUSTER = True
    _AIO = True

    def __init__(self, client: Any, name: str, prefix: str = "", watchdog_timeout: float = 30.0,
                 *, on_lost: Callable[..., Any] | None = None, sync_client: Any = None,
                 label: str | None = None, sync_replicas: int | str | None = "auto",
                 sync_timeout: float = 1.0, max_hold: float | None = None,
                 warn_held_after: float | None = None) -> None:
        super().__init__(client, name, prefix, watchdog_timeout, on_lost, label, sync_replicas,
                         sync_timeout, max_hold, warn_held_after)
        if self._cluster is not None:  # the slot master's sync client (``SlotBound._bind``)
            self._sync_client = self._node
        else:
            self._sync_client = sync_client if sync_client is not None else sync_twin(client)
        self._server = server_id(self._sync_client)

    @property
    def _client(self) -> Any:
        # On a cluster: the asyncio twin (for the running loop) of the slot master's client.
        node = SlotBound._client.fget(self)  # type: ignore[attr-defined]
        return node if self._cluster is None else async_twin(node)

    def _owner(self) -> str:
        return identity.task_owner()

    _info = staticmethod(identity.task_info)

    def _acquired(self, k: HoldKey, lease_ms: int | None, t0: float, thread: Any = None,
                  grant_ms: int | None = None, since: float | None = None,
                  task: Any = None) -> Any:
        hold = super()._acquired(k, lease_ms, t0, grant_ms=grant_ms, since=since)
        if task is None:
            task = identity.acting_task()
        if hold.count == 1 and task is not None:
            taskholds.watch(task, k, self, hold)
        return hold

    def _grant_callback(self, k: HoldKey, lease_ms: int | None,
                        t0: float) -> Callable[..., Any]:
        # A grant runs on the releasing thread or task: watch the waiter's own task. It was
        # made after the wait began, at the earliest (invariant 31).
        task = identity.acting_task()
        return lambda grant_ms=None, since=None: self._acquired(
            k, lease_ms, t0, grant_ms=grant_ms, since=t0 if since is None else since, task=task)

    def task_done(self, k: HoldKey, hold: Any) -> None:
        """Its owner task finished while still holding: nobody can ever release it as that
        owner (task numbers are never reused), so it would be renewed forever."""
        if watchdog().get(k) is not hold or hold.lost:
            return
        logger.warning("django-rlock: the task that held %r finished without unlocking it (was "
                       "lock() run inside asyncio.wait_for() or shield()? they run it in a task "
                       "of their own); releasing it", self.name)
        watchdog().forget(k)
        if events.listeners:
            events.emit("released", name=self.name, key=self.key, label=self.label, owner=k[2],
                        held=time.monotonic() - hold.since, reason="owner ended")
        self._spawn(acall_once(self._client, hold.end_script, hold.scripts_keys, hold.end_args))

    # -- acquiring ------------------------------------------------------------------------
    async def lock(self, lease_time: float | None = None) -> None:
        """Wait until acquired. ``lease_time`` in seconds; ``None``: watchdog mode."""
        lease_ms = self._lease_ms(lease_time)
        budget = set_budget(None)  # a full pool is waited for as long as the lock is
        mark = mark_cancels()
        try:
            await self._acquire(None, lease_ms)
            await self._not_cancelled()
        finally:
            reset_cancels(mark)
            reset_budget(budget)

    async def try_lock(self, wait_time: float = 0.0, lease_time: float | None = None) -> bool:
        """Try for up to ``wait_time`` seconds (0: exactly one attempt)."""
        wait = self._wait_budget(wait_time)
        lease_ms = self._lease_ms(lease_time)
        # A full pool is waited for within the budget (at least ``aiopool.POOL_TIMEOUT``).
        budget = set_budget(None if wait is None else time.monotonic() + wait)
        mark = mark_cancels()
        try:
            got = await self._acquire(wait, lease_ms)
            if got:
                await self._not_cancelled()
            return got
        finally:
            reset_cancels(mark)
            reset_budget(budget)

    async def _not_cancelled(self) -> None:
        """Acquired, though redis-py dropped the task's cancellation meanwhile
        (``aiopool.mark_cancels``): give the hold back and raise it, as if it had reached us."""
        if cancel_dropped():
            await self.unlock()
            raise asyncio.CancelledError

    async def _attempt(self, k: HoldKey, lease_ms: int | None, t0: float, claim: bool = False,
                       reg: tuple[str, float | None] | waiters.Note | None = None
                       ) -> int | None:
        if cancel_dropped():  # lost in redis-py earlier in this acquire: nothing sent yet
            raise asyncio.CancelledError
        args = self._acquire_args(k, lease_ms, claim)
        keys = self._acquire_keys
        script = None
        if isinstance(reg, waiters.Note):  # a kind without a hand-off: its waiter record
            script, keys, args = waiters.noted(reg, self._ACQUIRE, keys, args, *self._WAITING)
        elif reg is not None:
            args = args[:4] + self._register_args(reg[0], reg[1], self._grant_ms(lease_ms))
            keys = self._wait_keys
        if records.due(k[0], args[0]):  # once per process and server (invariant 43)
            await records.awrite(self._client, k[0], args[0])
        target = await self._target()
        sent = time.monotonic()
        try:
            if target[1] is None:  # one script, sent from this task (``ashielded``)
                ttl = self._ttl_of(await ashielded(self._client, script or self._ACQUIRE,
                                                   keys, args))
            else:  # acquire, WAIT and maybe the undo: one unit in a task of its own
                ttl = await shielded_task(self._send_acquire(k, args, *target, keys, script))
        except Cut as cut:
            # Cancelling the caller must not cancel a round trip Redis may already have run.
            rest = cut.rest if target[1] is not None else asyncio.ensure_future(
                self._ttl_later(cut.rest))
            await self._undo_cancelled(rest, k[2])
            raise cut.cancel from None
        if ttl is None:
            hold = self._acquired(k, lease_ms, t0, since=sent)
            if time.monotonic() - sent > hold.lease_ms / 2000.0 and not await self._verified(
                    k, True):
                return 0  # its reply came after half its lease: not ours any more, try again
            return None
        return int(ttl)

    async def _ttl_later(self, reply: asyncio.Future[Any]) -> int | None:
        return self._ttl_of(await reply)

    async def _target(self) -> tuple[int, tuple[int, int] | None]:
        if self.sync_replicas is None:
            return 0, None
        try:
            n = await replicas.aconnected(self._client, self._server) or 0
        except (RedisConnectionError, RedisTimeoutError) as exc:
            if self._cluster is not None:  # its master died: find the new one next time
                refresh(self._cluster, exc)
            raise
        return n, self._sync_target(n)

    async def _send_acquire(self, k: HoldKey, args: tuple[Any, ...], connected: int,
                            target: tuple[int, int] | None, keys: tuple[Any, ...] = (),
                            script: Script | None = None) -> Any:
        """The acquire round trip (with WAIT on a master with replicas; undone and raised if
        too few acknowledge): one unit, so cancellation shields the undo too."""
        keys = keys or self._acquire_keys
        script = script or self._ACQUIRE
        if target is None:
            return self._ttl_of(await acall_once(self._client, script, keys, args))
        try:
            reply, acked = await acall_once(self._client, script, keys,
                                            args, self._wait_args(target))
        except (RedisConnectionError, RedisTimeoutError):
            replicas.forget(self._server)  # a failover: the new master has other replicas
            raise
        ttl = self._ttl_of(reply)
        err = self._shortfall(acked, target, connected, "an acquire") if ttl is None else None
        if err is not None and not await self._recounted(acked):
            await acall_once(self._client, self._RELEASE, self._release_keys,
                             self._release_args(k[2], args[0]))
            raise err
        return ttl

    async def _send_release(self, args: tuple[Any, ...], connected: int,
                            target: tuple[int, int] | None) -> Any:
        if target is None:
            return await acall_once(self._client, self._RELEASE, self._release_keys, args)
        r, acked = await acall_once(self._client, self._RELEASE, self._release_keys, args,
                                    self._wait_args(target))
        err = self._shortfall(acked, target, connected, "a release")
        if err is not None and r is not None and not await self._recounted(acked):
            self._release_unsynced(err)
        return r

    async def _recounted(self, acked: Any) -> bool:
        return await replicas.arecounted(self._client, self._server, acked, self._sync_target)

    async def _undo_cancelled(self, fut: asyncio.Future[Any], owner: str) -> None:
        """The caller was cancelled with an acquire in flight: if it took the lock, give it
        back before the cancellation goes on (a later release could undo a legitimate one)."""
        try:
            ttl = await asyncio.shield(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(lambda f: self._give_back(f, owner))  # cancelled twice
            return
        except Exception:
            return
        if ttl is None:
            try:
                await acall_once(self._client, self._RELEASE, self._release_keys,
                                 self._release_args(owner, self._watchdog_ms))
            except BaseException:
                pass

    def _give_back(self, fut: asyncio.Future[Any], owner: str) -> None:
        """An acquire that landed after its caller was cancelled: nobody knows it holds the
        lock, so undo that one level now, not at the lease's end."""
        if fut.cancelled() or fut.exception() is not None or fut.result() is not None:
            return
        self._spawn(acall_once(self._client, self._RELEASE, self._release_keys,
                               self._release_args(owner, self._watchdog_ms)))

    @staticmethod
    def _spawn(coro: Any) -> None:
        taskholds.keep(asyncio.ensure_future(coro))

    async def _acquire(self, wait: float | None, lease_ms: int | None) -> bool:
        t0 = time.monotonic()
        k = (self._server, self.key, self._field())
        park_until = self._park_first_until(k, wait)
        deadline = None if wait is None else t0 + wait
        heard, token = False, None
        if self._registers(k, wait, park_until):
            heard = self._grants_heard()
            token = self._wait_token(k[2], heard)
        registered = False
        if not park_until:
            reg = None if token is None else (token, deadline)
            try:
                ttl = await self._attempt(k, lease_ms, t0, reg=reg)
            except asyncio.CancelledError:
                if token is not None:  # it may have registered: take it out of line
                    self._spawn(self._withdraw(k, token, deadline))
                raise
            except (RedisConnectionError, RedisTimeoutError):
                if token is not None:  # it may have registered before the reply was lost
                    self._withdraw_failed(token, deadline)
                raise
            if ttl is None:
                return True
            if wait == 0:
                waiting.refused(self._sync_client, self.name, self.key, self.label,
                                type(self).__name__, k[2], t0)
                return False
            registered = token is not None
            if token is None and self._HANDOFF:
                self._found_held(k)
                token = self._wait_token(k[2], self._grants_heard())
            if heard:
                # In line now, and a grant to us will be heard: sleep until it comes (or the
                # holder's lease ends) instead of asking again.
                park_until = time.monotonic() + (waiting.park_timeout(ttl, deadline) or 3600.0)
        return await self._wait(k, lease_ms, wait, park_until, t0, token, registered, deadline)

    def _wait_token(self, field: str, heard: bool) -> str:
        """A wait's token. Once this process's subscription to the lock's channels is
        confirmed, it ends in ``PROCESS_TOKEN_MARK``: a release grants it on this process's
        own channel for the lock, which no other process hears, and skips it if nobody
        listens there (the process died). Before that, the shared grant channel.

        Never on a cluster: a wait keeps the subscription it started with (invariant 28), so
        after its slot moved, a release on the new master would find nobody on the process
        channel and skip the waiter at every turn (sharded pub/sub), or skip it while the
        cluster still carried the grant to the old node's subscriber (classic pub/sub: the
        waiter would book a lock granted to the next one). The shared grant channel is heard
        wherever the subscription stands, and its grants are claimed (invariant 21)."""
        token = self._new_token(field)
        return token + PROCESS_TOKEN_MARK if heard and self._cluster is None else token

    async def _withdraw(self, k: HoldKey, token: str, deadline: float | None) -> None:
        try:
            r = await acall_once(self._client, RELEASE_SCRIPT, self._release_keys,
                                 self._withdraw_args(k[2], token))
        except Exception:
            self._withdraw_failed(token, deadline)
            raise
        self._withdrawn(r)

    async def _verified(self, k: HoldKey, late: bool = False) -> bool:
        """``RLock._verified`` for a task."""
        hold = self._in_doubt(k, late)
        if hold is None:
            return True
        keys, args, ms = self._check_args(hold)
        sent = time.monotonic()
        return self._checked(k, hold, sent, ms,
                             await acall_once(self._client, hold.renew_script, keys, args))

    async def _wait(self, k: HoldKey, lease_ms: int | None, wait: float | None,
                    park_until: float, t0: float, token: str | None = None,
                    registered: bool = False, deadline: float | None = None) -> bool:
        reg = self._note(k, deadline) if token is None else (token, deadline)

        async def attempt(claim: bool) -> int | None:
            return await self._attempt(k, lease_ms, t0, claim, reg)

        async def withdraw() -> None:
            assert token is not None
            await self._withdraw(k, token, deadline)

        async def verify() -> bool:
            return await self._verified(k)

        w = self._waiting(k, lease_ms, t0, token, registered, deadline=deadline)
        try:
            got = await waiting.await_(w, attempt, wait, self.unlock, park_until,
                                       None if token is None else withdraw, verify,
                                       self._parked(k, deadline, park_until, self._sync_client,
                                                    None if w.handoff is None
                                                    else w.handoff.info))
        except BaseException:
            if isinstance(reg, waiters.Note):  # a kind without a hand-off: its record out
                await asyncio.shield(waiters.aforget(self._client, reg))
            raise
        top_up = self._top_up(k) if got else None
        if top_up is not None:
            await acall_once(self._client, RENEW_SCRIPT, (self.key,), top_up)
        return got

    # -- releasing ------------------------------------------------------------------------
    async def unlock(self) -> None:
        """Release one hold of the calling task (see ``RLock.unlock``)."""
        target = await self._target()
        plan = self._release_plan((self._server, self.key, self._field()))
        plan.sent, task = time.monotonic(), identity.acting_task()
        try:
            if target[1] is None:  # one script, sent from this task (``ashielded``)
                r = await ashielded(self._client, self._RELEASE, self._release_keys, plan.args)
            else:
                r = await shielded_task(self._send_release(plan.args, *target))
        except Cut as cut:
            # The release goes on; book its outcome when it lands (hand-off, renewal, echo).
            cut.rest.add_done_callback(lambda f: self._book(plan, f, task))
            raise cut.cancel from None
        except asyncio.CancelledError:
            # Cancelled before anything was written: send it anyway, as a shielded release
            # would have been (invariant 8), and book it when it lands.
            fut = asyncio.ensure_future(self._send_release(plan.args, *target))
            fut.add_done_callback(lambda f: self._book(plan, f, task))
            taskholds.keep(fut)
            raise
        except BaseException as exc:
            if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
                replicas.forget(self._server)  # maybe a failover: count the replicas again
            self._release_failed(plan)
            raise
        orphan = self._settled(plan, r, task)
        if orphan is not None:
            await acall_once(self._client, RELEASE_SCRIPT, self._release_keys,
                             (orphan.owner, orphan.lease_ms, UNLOCK_MESSAGE))

    release = unlock

    async def release_as_lease(self, seconds: float) -> bool:
        """``RLock.release_as_lease`` for asyncio (shielded: a cancellation never leaves the
        hold both booked and leased)."""
        ms = leases.lease_ms(seconds, self.name)
        k = (self._server, self.key, self._field())
        hold = watchdog().get(k)
        if not ms or (hold is not None and hold.count > 1):
            await self.unlock()
            return False
        r = await asyncio.shield(acall_once(
            self._client, leases.LEASE_OUT_SCRIPT, (self.key, self._channel, self._release_keys[2]),
            (k[2], leases.lease_field(k[2], self._owner()), ms, leases.message_of(self))))
        return leases.booked(watchdog(), k, hold, r, self.name, self.key, self.label)

    def _settled(self, plan: Any, r: Any, task: Any) -> Any:
        orphan = self._release_done(plan, r)
        if plan.hold is not None and watchdog().get(plan.k) is not plan.hold:
            taskholds.unwatch(plan.k, plan.hold, task)  # (a cancelled release too, once it lands)
        return orphan

    def _book(self, plan: Any, fut: asyncio.Future[Any], task: Any) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._release_failed(plan)
            return
        try:
            orphan = self._settled(plan, fut.result(), task)
        except LockNotOwnedError:
            return
        if orphan is not None:
            self._spawn(acall_once(self._client, RELEASE_SCRIPT, self._release_keys,
                                   (orphan.owner, orphan.lease_ms, UNLOCK_MESSAGE)))

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters. True if a lock was deleted."""
        before = self._holds_now()
        return self._forced(await acall_once(self._client, self._FORCE, self._release_keys,
                                             self._force_args()), before)

    # -- inspecting -----------------------------------------------------------------------
    async def is_locked(self) -> bool:
        return bool(await self._reader.exists(self.key))

    async def is_held_by_current_task(self) -> bool:
        return bool(await self._reader.hexists(self.key, self._field()))

    async def hold_count(self) -> int:
        return int(await self._reader.hget(self.key, self._field()) or 0)

    async def remaining_ttl(self) -> float | None:
        """Seconds left on the lease; None when not locked, ``inf`` for a key without expiry."""
        return ttl_seconds(await self._reader.pttl(self.key))

    # -- context manager ------------------------------------------------------------------
    async def __aenter__(self) -> AsyncRLock:
        await self.lock()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is None:
            await self.unlock()
            return
        try:
            await self.unlock()
        except Exception as err:
            log_masked_release(self.name, exc_type, err)


KIND = declare(Kind(
    "lock", "hash",
    note="Its waiters are woken and one of them takes the lock; waiters in its hand-off line "
         "keep their places.",
    open=RLock, locks={None: RLock}, async_locks={None: AsyncRLock}))
