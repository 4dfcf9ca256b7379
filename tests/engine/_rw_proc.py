"""Run by the read-write lock tests: `python -m tests.engine._rw_proc MODE SOCKET ...`."""

from __future__ import annotations

import random
import sys
import threading
import time

import redis

from django_rlock.engine.rwlock import ReadWriteLock

# Checks and records, atomically, what a reader or writer sees as it enters.
# KEYS: readers, writers, bad, max readers. ARGV[1]: "read" or "write".
ENTER = """
if ARGV[1] == 'read' then
  local n = redis.call('incr', KEYS[1])
  if tonumber(redis.call('get', KEYS[2]) or '0') ~= 0 then redis.call('incr', KEYS[3]) end
  if n > tonumber(redis.call('get', KEYS[4]) or '0') then redis.call('set', KEYS[4], n) end
else
  local n = redis.call('incr', KEYS[2])
  if n ~= 1 or tonumber(redis.call('get', KEYS[1]) or '0') ~= 0 then redis.call('incr', KEYS[3]) end
end
"""


def hold_read(sock: str, name: str, watchdog_timeout: str) -> None:
    """Take a read hold in watchdog mode, say so, and hold it until killed."""
    rw = ReadWriteLock(redis.Redis(unix_socket_path=sock), name,
                       watchdog_timeout=float(watchdog_timeout))
    rw.read_lock().lock()
    print("locked", flush=True)
    while True:
        time.sleep(1)


def mix(sock: str, name: str, threads: str, iterations: str, seed: str) -> None:
    """Threads taking the read or the write lock at random; each entry is checked in Redis."""
    client = redis.Redis(unix_socket_path=sock)
    rw = ReadWriteLock(client, name, watchdog_timeout=5.0)
    enter = client.register_script(ENTER)
    keys = ["rw:readers", "rw:writers", "rw:bad", "rw:maxread"]

    def work(rng: random.Random) -> None:
        for _ in range(int(iterations)):
            write = rng.random() < 0.3
            lock = rw.write_lock() if write else rw.read_lock()
            with lock:
                enter(keys=keys, args=["write" if write else "read"])
                time.sleep(0.002 if write else 0.004)
                client.decr(keys[1] if write else keys[0])
            time.sleep(rng.random() * 0.003)

    workers = [threading.Thread(target=work, args=(random.Random(f"{seed}:{i}"),))
               for i in range(int(threads))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    print("done", flush=True)


if __name__ == "__main__":
    {"hold_read": hold_read, "mix": mix}[sys.argv[1]](*sys.argv[2:])
