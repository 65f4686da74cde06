"""A TCP proxy on 127.0.0.1 that can make its target briefly unreachable.

The job talks to PostgreSQL through it; :meth:`TcpProxy.outage` closes every
connection at once (mid-transaction, mid-COMMIT: whatever was in flight) and
refuses new ones until the outage ends. The shared server itself is never
touched.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._refuse_until = 0.0
        self._closed = threading.Event()
        self.dropped = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._accept_loop, name="chaos-proxy", daemon=True)
        self._thread.start()

    def outage(self, seconds: float) -> int:
        """Drop every connection now and refuse new ones for ``seconds``; return how many dropped."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds
            victims = list(self._sockets)
            self._sockets.clear()
        for s in victims:
            _reset(s)
        dropped = len(victims) // 2
        self.dropped += dropped
        return dropped

    def heal(self) -> None:
        with self._lock:
            self._refuse_until = 0.0

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            victims = list(self._sockets)
            self._sockets.clear()
        for s in victims:
            _reset(s)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if time.monotonic() < self._refuse_until:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._sockets.discard(src)
            self._sockets.discard(dst)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def _reset(s: socket.socket) -> None:
    """Close with RST, as a crashed or unreachable server would."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)  # wakes a pump thread blocked in recv on it
    with contextlib.suppress(OSError):
        s.close()
