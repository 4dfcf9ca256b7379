"""A thread's own connection for lock scripts (``clients.own_connection``): what it must not
break. Each thread keeps one connection per pool; it goes with the thread, a forked child
makes its own, a connection the server closed while idle is replaced before use, a capped
pool is left to its cap, and a send that interrupts another on the same thread goes through
the pool."""

from __future__ import annotations

import gc
import os
import signal
import time
from typing import Any

import pytest
import redis

from django_rlock import RLock
from django_rlock.engine import clients


def _named(server: Any, name: str, **kwargs: Any) -> redis.Redis:
    return redis.Redis(unix_socket_path=server.socket, client_name=name, **kwargs)


def _connections(r: redis.Redis, name: str) -> int:
    return sum(1 for c in r.client_list() if c.get("name") == name)


def _pair(lock: RLock) -> None:
    lock.lock()
    lock.unlock()


def test_each_thread_keeps_one_connection_which_closes_with_the_thread(r, redis_server, holders):
    client = _named(redis_server, "kept")
    workers = [holders() for _ in range(3)]
    for i, h in enumerate(workers):
        lock = RLock(client, f"k{i}")
        for _ in range(20):
            h.call(lambda lock=lock: _pair(lock))
    during = _connections(r, "kept")
    for h in workers:
        h.close()
    gc.collect()
    deadline = time.monotonic() + 10
    while _connections(r, "kept") > during - 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    # One connection per live thread, closed with it; the pool lent at most one (the replica
    # probe's INFO), which it keeps.
    after = _connections(r, "kept")
    assert during - after == 3 and after <= 1


def test_a_connection_the_server_closed_while_idle_is_replaced_before_use(r, redis_server,
                                                                          holders):
    client = _named(redis_server, "idle")
    lock = RLock(client, "idle")
    h = holders()
    h.call(lambda: _pair(lock))
    # The thread's own, and the pool's one: this process's record (invariant 43) was written
    # through it before the first attempt (as the replica probe's INFO is).
    assert _connections(r, "idle") == 2
    r.client_kill_filter(_type="normal", skipme=True)  # as `timeout` or an admin would
    assert _connections(r, "idle") == 0
    time.sleep(clients.OWN_IDLE_CHECK * 3)
    for _ in range(3):
        h.call(lambda: _pair(lock))  # no ConnectionError: the closed one was noticed
    assert _connections(r, "idle") == 1


def test_a_capped_pool_keeps_lock_traffic_within_its_cap(r, redis_server, holders):
    pool = redis.ConnectionPool(path=redis_server.socket, client_name="capped",
                                connection_class=redis.UnixDomainSocketConnection,
                                max_connections=1)
    client = redis.Redis(connection_pool=pool)
    lock = RLock(client, "capped")
    a, b = holders(), holders()
    a.call(lambda: _pair(lock))
    b.call(lambda: _pair(lock))
    assert _connections(r, "capped") == 1  # both threads were lent the pool's one connection


class _Interrupting(redis.UnixDomainSocketConnection):
    """Runs ``hook`` once, between sending a command and reading its reply: what a signal
    handler or a finalizer on the same thread can do."""

    hook: Any = None

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        hook, type(self).hook = type(self).hook, None
        if hook is not None:
            hook()
        return super().read_response(*args, **kwargs)


def test_a_lock_taken_while_the_thread_s_connection_awaits_a_reply_uses_the_pool(r, redis_server,
                                                                                 holders):
    pool = redis.ConnectionPool(path=redis_server.socket, connection_class=_Interrupting)
    client = redis.Redis(connection_pool=pool)
    outer, inner = RLock(client, "outer"), RLock(client, "inner")
    seen: list[Any] = []

    def interrupt() -> None:
        inner.lock()
        seen.append(inner.hold_count())
        inner.unlock()
        seen.append(inner.is_locked())

    def run() -> None:
        _pair(outer)  # the thread's connection exists now
        _Interrupting.hook = interrupt
        outer.lock()  # the inner pair runs after this acquire was sent, before its reply
        seen.append(outer.hold_count())
        outer.unlock()

    holders().call(run)
    assert seen == [1, False, 1]
    assert not r.exists("outer") and not r.exists("inner")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_shares_its_parent_s_connection(r, redis_server):
    client = redis_server.client(socket_timeout=10)  # mixed-up replies fail, never hang
    parent, child_lock = RLock(client, "p-side"), RLock(client, "c-side")
    _pair(parent)  # this thread's connection exists before the fork
    pid = os.fork()
    if pid == 0:  # child: the same client object, the same thread's slot
        code = 1
        try:
            for _ in range(300):
                child_lock.lock()
                assert child_lock.hold_count() == 1
                child_lock.unlock()
            code = 0
        finally:
            os._exit(code)
    status = None
    try:
        for _ in range(300):  # at the same time: on one shared socket the replies would mix
            parent.lock()
            assert parent.hold_count() == 1
            parent.unlock()
    finally:
        deadline = time.monotonic() + 60
        while status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung")
            else:
                time.sleep(0.02)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert not r.exists("p-side") and not r.exists("c-side")
