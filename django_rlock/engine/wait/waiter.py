"""One waiting thread or asyncio task, and the state it is in.

A waiter is in exactly one ``State``; ``Waiter.move`` is the one place that changes it, and it
refuses a move the table below does not allow. Every move is made under the lock of the
waiter's server (``channel.Channels.lock``, invariant 5).
"""

from __future__ import annotations

import asyncio
import enum
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import settings


class State(enum.Enum):
    #: In its channel's queue, parked or about to attempt: the one state a releasing thread of
    #: this process may hand the lock to (invariant 5).
    QUEUED = "queued"
    #: In the queue with its own acquire in flight: never handed the lock meanwhile; a grant
    #: from Redis may still come (invariants 2, 22).
    ATTEMPTING = "attempting"
    #: Woken (out of the queue, counted in its channel's ``active``): its retry's outcome is
    #: not known yet (invariant 3).
    SIGNALED = "signaled"
    #: Chosen by a releasing thread of this process; the hand-off's outcome is not known yet
    #: (counted in ``active``, invariant 5).
    RESERVED = "reserved"
    #: Handed or granted the lock: its hold is booked, without a command of its own
    #: (invariants 5, 22).
    GRANTED = "granted"
    #: Took the lock with its own attempt.
    ACQUIRED = "acquired"
    #: Gone while a hand-off to it was in flight (cancelled twice), or its event loop closed:
    #: whoever settles the hand-off releases for it (invariant 7).
    ABANDONED = "abandoned"
    #: Out of the wait.
    LEFT = "left"


_Q, _A, _S, _R = State.QUEUED, State.ATTEMPTING, State.SIGNALED, State.RESERVED
_G, _D, _X, _L = State.GRANTED, State.ACQUIRED, State.ABANDONED, State.LEFT

#: The moves a waiter may make (ABANDONED and LEFT are final).
MOVES: dict[State, frozenset[State]] = {
    _Q: frozenset({_A, _S, _R, _G, _L, _X}),
    _A: frozenset({_Q, _S, _G, _D, _L, _X}),
    _S: frozenset({_Q, _G, _D, _L, _X}),
    _R: frozenset({_G, _S, _Q, _X}),  # QUEUED: detached after HANDOFF_TIMEOUT (invariant 12)
    _G: frozenset({_Q, _L}),          # QUEUED: the grant was found gone (invariant 31)
    _D: frozenset({_L}),
    _X: frozenset(),
    _L: frozenset(),
}


#: Per thread: the asyncio wakes held back until its server's lock is released
#: (``hold_wakes``); None: each wake is written at once.
_held = threading.local()


def hold_wakes() -> None:
    """From now on, this thread's wakes of asyncio waiters of other threads' loops are held
    back (one check that the loop is open stands for the write) until ``send_held_wakes``.

    The pub/sub listener holds them while it books a grant under its server's lock: a wake
    written there woke the waiter's loop, which then ran into that lock (still held, the
    listener waiting for the interpreter), so every grant cost two more thread switches. A
    loop that closes before the held wake is written is a loop that closed just after its
    wake: its task never runs either way (invariant 49)."""
    _held.wakes = []


def send_held_wakes() -> None:
    """Write the wakes held since ``hold_wakes`` (call it with no lock held) and stop
    holding them."""
    wakes, _held.wakes = getattr(_held, "wakes", None), None
    for loop, wake in wakes or ():
        try:
            loop.call_soon_threadsafe(wake)
        except RuntimeError:  # closed since: as if it closed just after the wake
            pass


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class IllegalMove(RuntimeError):
    """A waiter was moved in a way ``MOVES`` does not allow: a bug in the waiting side."""


@dataclass(slots=True, eq=False)
class HandOff:
    """What a release needs to hand the lock to a waiter (kinds with a hand-off, RLock's).
    Made once per wait and never changed (not ``frozen``: see ``loop.Wait``).

    ``owner``, ``lease_ms``, ``on_grant`` and ``info``: a releasing thread of this process may
    hand the lock straight to the waiter (invariant 5); ``on_grant(grant_ms, since)`` books the
    hold. ``grant`` (the lock's grant channel), ``token``, ``grant_ms``: any process's release
    may grant it the lock (invariants 20-22); ``registered``: its first attempt already put it
    in line. ``line``: the thread's own wake line, where grants to ``token`` arrive (invariant
    25). ``deadline`` (monotonic; None: no budget) and ``slack_ms``: what a release that puts
    the waiter in line writes in its entry (invariant 44).
    """

    owner: str
    lease_ms: int
    on_grant: Callable[..., Any] | None = None
    info: str = ""
    grant: bytes | None = None
    token: bytes | None = None
    registered: bool = False
    grant_ms: int = 0
    line: Any = None
    deadline: float | None = None
    slack_ms: int = 0

    def register_args(self) -> tuple[int, int, int]:
        """ARGV[11:14] of a release that may put this waiter in line: budget ms (-1: none),
        grant lease ms, and the slack past the new holder's grant lease: the registration
        slack plus a grant lease, the longest the waiter then parks before it attempts and
        renews the entry itself (``loop``)."""
        budget = -1 if self.deadline is None else max(
            0, math.ceil((self.deadline - time.monotonic()) * 1000))
        return budget, self.grant_ms, self.slack_ms + math.ceil(settings.GRANT_LEASE * 1000)


class Waiter:
    """One waiting thread, or one waiting asyncio task (``loop`` given)."""

    __slots__ = ("state", "key", "handoff", "token", "line", "registered", "seen", "pending",
                 "deliver", "_park", "_loop", "_woken", "_fut", "_tid")

    def __init__(self, key: str = "", handoff: HandOff | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.state = State.QUEUED
        self.key = key  # channels are shared by {K} and K: a hand-off must match the key
        self.handoff = handoff
        self.token = None if handoff is None else handoff.token
        #: Whether an entry of ours may be live in the hand-off queue in Redis (a waiter that
        #: gives up must withdraw it, invariant 24).
        self.registered = False if handoff is None else handoff.registered
        self.seen = 0  # its channel's message count when its last attempt began
        #: A thread with a wake line sleeps on it, not on a lock: a wake is then ``pending``
        #: plus a poke, and a grant read there is ``deliver``-ed (invariant 25).
        self.line = None if handoff is None else handoff.line
        self.pending = False
        self.deliver: Callable[[bytes], Any] | None = None
        self._loop = loop
        if loop is not None:
            # A wake not yet seen by a park (``apark`` clears it), and the future the task
            # parks on: one future and at most one timer per park (an ``asyncio.Event`` and
            # ``asyncio.timeout`` cost twice as much per park on the bench host).
            self._woken = False
            self._fut: asyncio.Future[None] | None = None
            self._tid = threading.get_ident()  # its loop's thread (it joins from there)
        elif self.line is None:
            self._park = threading.Lock()
            self._park.acquire()

    def move(self, to: State) -> None:
        """The one place a waiter's state changes (under its server's lock)."""
        if to not in MOVES[self.state]:
            raise IllegalMove(f"a waiter for {self.key!r} cannot go from {self.state.name} "
                              f"to {to.name}")
        self.state = to

    # -- what a releasing thread reads (``reserve``) -----------------------------------------
    @property
    def aio(self) -> bool:
        """An asyncio task's wait (a release of its process may put it in line, invariant 44)."""
        return self._loop is not None

    @property
    def owner(self) -> str:
        return "" if self.handoff is None else self.handoff.owner

    @property
    def lease_ms(self) -> int:
        return 0 if self.handoff is None else self.handoff.lease_ms

    @property
    def info(self) -> str:
        return "" if self.handoff is None else self.handoff.info

    # -- parking and waking --------------------------------------------------------------
    def park(self, timeout: float | None) -> None:
        if self.line is not None:
            self.line.park(self, timeout, self.deliver)
            return
        if timeout is None:
            self._park.acquire()
        elif timeout > 0:
            self._park.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))
        else:
            self._park.acquire(blocking=False)

    async def apark(self, timeout: float | None) -> None:
        if not self._woken and (timeout is None or timeout > 0):
            # Not ``wait_for`` (a task per park on 3.11); and the bound resolves the future
            # instead of cancelling the task, so no cancellation of the caller's is mistaken
            # for it or swallowed: a cancellation propagates as is.
            loop = self._loop
            assert loop is not None
            fut = self._fut = loop.create_future()
            timer = None if timeout is None or timeout == math.inf else loop.call_later(
                timeout, _resolve, fut)
            try:
                await fut
            finally:
                self._fut = None
                if timer is not None:
                    timer.cancel()
        # No await between the wake and this clear: a wake cannot slip in and be lost
        # (invariant 4).
        self._woken = False

    def _set(self) -> None:
        """The wake, on its loop's thread."""
        self._woken = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def wake(self) -> bool:
        """Wake it (under the lock); False if it is gone (its event loop closed under it),
        and then it is ``ABANDONED``."""
        if self._loop is not None:
            if threading.get_ident() == self._tid and not self._loop.is_closed():
                # A task of its own loop woke it (its release granted or handed it the lock):
                # no self-pipe write, no extra turn of the loop.
                self._set()
                return True
            held = getattr(_held, "wakes", None)
            if held is not None and not self._loop.is_closed():
                held.append((self._loop, self._set))  # written by ``send_held_wakes``
                return True
            try:
                self._loop.call_soon_threadsafe(self._set)
            except RuntimeError:  # its loop is closed: the waiter is gone
                if self.state is not State.ABANDONED:
                    self.move(State.ABANDONED)
                return False
            return True
        if self.line is not None:
            self.pending = True
            self.line.poke()
            return True
        try:
            self._park.release()
        except RuntimeError:  # already released: a wake is pending anyway
            pass
        return True

    def signal(self) -> bool:
        """Wake it for a retry (it is out of the queue, counted ``active``); False if gone."""
        if not self.wake():
            return False
        self.move(State.SIGNALED)
        return True
