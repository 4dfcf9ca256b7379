"""A TCP proxy in front of the test redis-server that can lose one reply.

It makes the network fault behind Redisson #4822/#7367 real: the server runs a command,
the client never hears back, times out, and a client-side retry would run it again.
"""

from __future__ import annotations

import socket
import threading
import time


class FaultProxy:
    def __init__(self, upstream_socket: str) -> None:
        self.upstream = upstream_socket
        self.swallow_replies = threading.Event()
        self.delay_next_reply = 0.0  # seconds to hold back the next reply (once)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.upstream)
            self._socks += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self.swallow_replies.is_set():
                    self.swallow_replies.clear()  # lose this one reply, like a dropped packet
                    continue
                if replies and self.delay_next_reply:
                    delay, self.delay_next_reply = self.delay_next_reply, 0.0
                    time.sleep(delay)  # a slow network: the command ran, its reply is late
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)  # close() alone leaves a blocked recv() waiting
                s.close()
            except OSError:
                pass
