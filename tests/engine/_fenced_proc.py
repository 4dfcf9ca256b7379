"""Run by tests/engine/test_fenced.py: `python -m tests.engine._fenced_proc SOCKET NAME THREADS ROUNDS`.

Each thread takes the fenced lock ROUNDS times (a reentrant acquire inside every other
hold) and, while holding it, appends each token it got to the Redis list ``order``: the list
is the acquisition order. Prints the JSON list of the tokens this process got.
"""

from __future__ import annotations

import json
import sys
import threading

import redis

from django_rlock.engine.fenced import FencedLock


def main(sock: str, name: str, threads: str, rounds: str) -> None:
    client = redis.Redis(unix_socket_path=sock)
    lock = FencedLock(client, name)  # one object shared by the threads
    got: list[int] = []
    start = threading.Barrier(int(threads))

    def work() -> None:
        start.wait()
        for i in range(int(rounds)):
            token = lock.lock_and_get_token()
            try:
                client.rpush("order", token)
                got.append(token)
                if i % 2:
                    again = lock.lock_and_get_token()
                    client.rpush("order", again)
                    got.append(again)
                    lock.unlock()
            finally:
                lock.unlock()

    workers = [threading.Thread(target=work) for _ in range(int(threads))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    print(json.dumps(got), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
