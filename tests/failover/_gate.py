"""A loopback TCP address in front of a redis-server that the test can cut or move.

    gate = Gate(server.socket)         # clients connect to 127.0.0.1:gate.port
    gate.cut()                         # every connection through it drops; new ones are refused
    gate.restore()                     # connections are accepted again
    gate.move(other.socket)            # a failover the client cannot see: same address, other
                                       # server (open connections drop, like a moved VIP)

A real network fault for processes other than the test's (they only get the port): the
server keeps every key, only the clients behind the gate lose it. ``tests/faultproxy.py``
loses single replies; this one loses the whole path.
"""

from __future__ import annotations

import socket
import threading


class Gate:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream  # a unix socket path
        self._open = True
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="gate-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if not self._open:
                    _close(client)  # refused: the client reads EOF at its handshake
                    continue
                try:
                    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    server.connect(self.upstream)
                except OSError:
                    _close(client)
                    continue
                pair = (client, server)
                self._pairs.append(pair)
            threading.Thread(target=self._pipe, args=(client, server, pair), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, pair), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket,
              pair: tuple[socket.socket, socket.socket]) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        self._drop(pair)

    def _drop(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
        for s in pair:
            _close(s)

    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> None:
        """Drop every connection through the gate and refuse new ones until ``restore()``."""
        with self._lock:
            self._open = False
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                _close(s)

    def restore(self) -> None:
        with self._lock:
            self._open = True

    def move(self, upstream: str) -> None:
        """Point the address at another server; open connections drop (a moved address)."""
        with self._lock:
            self.upstream = upstream
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                _close(s)

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        self.cut()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)  # close() alone leaves a blocked recv() waiting
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
