"""Who owns a lock: ``<uuid4 of this process>:<serial>``, and what to show about it.

The serial is handed to each thread (and each asyncio task) on first use and is never reused
within one process uuid. An OS thread id would be: Python reuses ``threading.get_ident()``
as soon as a thread ends, so the next thread (a new request on runserver) would "inherit" a
dead thread's lock, see it as its own, re-enter and unlock it.

The uuid is made anew in a forked child (Celery prefork, gunicorn), so a child never
inherits, renews or releases its parent's locks. Modules with per-process state (the
watchdog thread, the pub/sub connection) register a reset hook here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import os
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

_process_id = str(uuid.uuid4())
_fork_hooks: list[Callable[[], None]] = []
_label_hooks: list[Callable[[], None]] = []
#: One counter for threads and tasks: both name owners as ``<uuid>:<n>``, so they never clash.
_serials = itertools.count(1)
_local = threading.local()
_process_label: str | None = None
_process_parts: str | None = None


def process_id() -> str:
    """The uuid that names this process in lock hashes."""
    return _process_id


def thread_owner() -> str:
    """The hash field of the calling thread: Redisson's ``<client uuid>:<thread id>``, with a
    per-process serial for the thread id (never reused, unlike the OS thread id)."""
    try:
        return _local.owner  # type: ignore[no-any-return]
    except AttributeError:
        owner = _local.owner = f"{_process_id}:{next(_serials)}"
        return owner


_task_ids: weakref.WeakKeyDictionary[asyncio.Task[object], int] = weakref.WeakKeyDictionary()


#: The task child tasks act for (``acting_for``): an async MultiLock takes its members in
#: child tasks, concurrently, but they are the calling task's holds.
_acting: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar(
    "django_rlock_acting_task", default=None)


def acting_task() -> asyncio.Task[Any] | None:
    """The task that owns what the running task acquires: itself, unless it acts for another."""
    return _acting.get() or asyncio.current_task()


@contextlib.contextmanager
def acting_for(task: asyncio.Task[Any] | None) -> Iterator[None]:
    """Tasks created inside (which copy the context) acquire and release as ``task``."""
    token = _acting.set(task)
    try:
        yield
    finally:
        _acting.reset(token)


def task_owner() -> str:
    """The hash field of the running asyncio task: ``<client uuid>:<serial>``.

    Concurrent tasks share a thread (and ``sync_to_async`` runs many calls on one thread), so
    a thread's serial would let them "re-enter" each other's lock. Each task gets its own
    serial, never reused in this process; a child task is a different owner from its parent
    (unless it acts for it: ``acting_for``).
    """
    task = acting_task()
    if task is None:
        raise RuntimeError("AsyncRLock must be used from inside an asyncio task")
    n = _task_ids.get(task)
    if n is None:
        n = _task_ids[task] = next(_serials)
    return f"{_process_id}:{n}"


# -- what listings show about an owner --------------------------------------------------------
def set_process_label(label: str | None) -> None:
    """Name this process in lock listings (default: guessed from ``sys.argv``, see
    ``process_label``). ``None`` goes back to the guess."""
    global _process_label, _process_parts
    _process_label = label
    _process_parts = None
    for hook in _label_hooks:
        hook()  # the process records say the new label (``records``)


def on_label(hook: Callable[[], None]) -> None:
    """Run ``hook`` after every ``set_process_label``."""
    _label_hooks.append(hook)


def process_label() -> str:
    """A readable name for this process: ``runserver``, ``celery worker ForkPoolWorker-2``,
    ``gunicorn``, else the script's name."""
    if _process_label is not None:
        return _process_label
    argv = [a for a in sys.argv if a] or ["python"]
    prog = os.path.basename(argv[0])
    if prog == "-c":
        prog = "python -c"
    elif prog == "__main__.py" and len(sys.orig_argv) > 2 and sys.orig_argv[1] == "-m":
        prog = sys.orig_argv[2]  # python -m celery ... -> celery
    words = [a for a in argv[1:] if not a.startswith("-")]
    if prog in ("manage.py", "django-admin", "django-admin.py") and words:
        return words[0]
    if prog == "celery" or prog.endswith("celery"):
        label = "celery " + (next((w for w in words if w in ("worker", "beat", "flower")), "")
                             or " ".join(words[:1]))
        mp = sys.modules.get("billiard.process") or sys.modules.get("multiprocessing")
        current = getattr(mp, "current_process", None)
        name = current().name if current is not None else ""
        if name and name != "MainProcess":
            label += f" {name}"
        return label.strip()
    return prog


#: Separates an index entry's parts in format 2 (``lockinfo.parse_entry``): the entries that
#: carry their process inline (a leader, a task mark).
SEP = "\x1f"
#: Separates the parts of a format 3 entry, whose process is in its process record
#: (``records``); never inside a part.
SEP3 = "\x1e"
#: Thread and task names as a format 3 entry codes them: each text by one control character
#: (``lockinfo`` decodes them), so the names a server's threads get by default cost an entry a
#: few bytes: ``MainThread`` 1, ``ThreadPoolExecutor-0_12`` 5, runserver's ``Thread-12
#: (process_request_thread)`` 4. A real name's own control characters are replaced by ``?``.
NAME_CODES = (("\x01", "MainThread"), ("\x02", "ThreadPoolExecutor-"),
              ("\x03", " (process_request_thread)"), ("\x04", "Thread-"), ("\x05", "Task-"),
              ("\x06", "asyncio_"), ("\x07", "Dummy-"))
_UNSAFE = {ord(c): "?" for c in (SEP, SEP3, *(code for code, _ in NAME_CODES))}


def _part(value: str) -> str:
    """A name as one part of an entry: the separators (never in a real name) are replaced."""
    return value.replace(SEP, "?")


def coded_name(name: str) -> str:
    """A thread or task name as a format 3 entry carries it (``NAME_CODES``)."""
    name = name.translate(_UNSAFE)
    for code, text in NAME_CODES:
        if text in name:
            name = name.replace(text, code)
    return name


def short_owner(owner: str) -> str:
    """``owner`` as an index entry names it: ``<uuid>:<serial>`` with the uuid cut to 8
    characters (``lockinfo.describes`` matches it against the hash's fields; two processes
    holding one lock at once with the same 8 leading characters and serial: 1 in 2**32)."""
    head, sep, serial = owner.rpartition(":")
    if sep and len(head) > 8 and serial.isdigit() and ":" not in head:
        return f"{head[:8]}:{serial}"
    return owner


def _process_part() -> str:
    """The parts of a format 2 entry that describe this process, computed once per process."""
    global _process_parts
    if _process_parts is None:
        _process_parts = (f"{os.getpid()}{SEP}{_part(process_label())}"
                         f"{SEP}{_part(socket.gethostname())}")
    return _process_parts


def process_record() -> str:
    """This process's record (``records``): ``<pid>␞<process label>␞<host>``."""
    return SEP3.join((str(os.getpid()), process_label().translate(_UNSAFE),
                      socket.gethostname().translate(_UNSAFE)))


def _stamp() -> str:
    # The holder's clock, in ms: a placeholder in a format 2 entry's "since" field, which every
    # script that writes the entry replaces with the server's TIME (lua/_stamped.lua).
    return str(int(time.time() * 1000))


def thread_info(owner: str) -> str:
    """What an index entry says about ``owner``, the calling thread (format 3, without its
    time: ``␞<uuid8>:<serial>␞<coded thread name>␞<thread ident, base 36>``). The script that
    writes it puts the server's TIME in front (``lua/_stamped.lua``); the process's pid, label
    and host are in its process record (``records``), not in the entry."""
    t = threading.current_thread()
    cached = getattr(_local, "info3", None)
    if cached is not None and cached[0] is t.name and cached[1] == owner:
        return cached[2]  # type: ignore[no-any-return]
    info = f"{SEP3}{short_owner(owner)}{SEP3}{coded_name(t.name)}{SEP3}{_ident36()}"
    _local.info3 = (t.name, owner, info)
    return info


def task_info(owner: str) -> str:
    """``thread_info`` for the running asyncio task: its name, and the thread it runs on."""
    task = acting_task()
    name = task.get_name() if task is not None else "?"
    return f"{SEP3}{short_owner(owner)}{SEP3}{coded_name(name)}{SEP3}{_ident36()}"


_DIGITS36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _ident36() -> str:
    """The calling thread's ``threading.get_ident()`` in base 36 (10 characters where hex
    takes 12: a pthread address), made once per thread."""
    try:
        return _local.ident36  # type: ignore[no-any-return]
    except AttributeError:
        n, out = threading.get_ident(), ""
        while True:
            n, d = divmod(n, 36)
            out = _DIGITS36[d] + out
            if not n:
                break
        _local.ident36 = out
        return out


def thread_info_inline(owner: str) -> str:
    """``thread_info`` with the process inline (format 2: ``<ms>␟<uuid8>:<serial>␟<thread>␟
    <os thread id>␟<pid>␟<process>␟<host>``): for the entries read without the process
    record (a leader's, read by ``Leader.info`` in one round trip; a task mark's, whose
    writer is often gone)."""
    t = threading.current_thread()
    cached = getattr(_local, "info", None)
    if cached is not None and cached[0] is t.name and cached[1] == owner:
        return _stamp() + cached[2]  # type: ignore[no-any-return]
    info = f"{SEP}{short_owner(owner)}{SEP}{_part(t.name)}{SEP}{t.ident}{SEP}{_process_part()}"
    _local.info = (t.name, owner, info)
    return _stamp() + info


def task_info_inline(owner: str) -> str:
    """``thread_info_inline`` for the running asyncio task."""
    task = acting_task()
    name = task.get_name() if task is not None else "?"
    return (f"{_stamp()}{SEP}{short_owner(owner)}{SEP}{_part(name)}{SEP}{threading.get_ident()}"
            f"{SEP}{_process_part()}")


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook`` in every forked child, after the new process id is set. (The engine keeps
    its own per-process state in ``process``, reset by its one fork hook.)"""
    _fork_hooks.append(hook)


def renew() -> None:
    """A forked child's new identity: a new process uuid (so no owner id of the parent's is
    ever reused, invariant 9) and no thread's cached owner. Run by ``process``'s fork hook."""
    global _process_id, _local, _process_parts
    _process_id = str(uuid.uuid4())
    _local = threading.local()  # the forking thread's cached owner named the parent's uuid
    _process_parts = None  # new pid; the pool child's name is set after this hook runs
    for hook in _fork_hooks:
        hook()


def with_kind(info: str, kind: str) -> str:
    """An index entry's holder info for a lock kind other than RLock: listing reads the kind
    from it (none: a plain lock)."""
    return f"{info}{SEP3 if info.startswith(SEP3) else SEP}{kind}"
