"""A TCP proxy that can make its target briefly unreachable, or freeze it.

The job talks to PostgreSQL through it. :meth:`TcpProxy.outage` closes every
connection at once (mid-transaction, mid-COMMIT: whatever was in flight) and
refuses new ones until the outage ends. :meth:`TcpProxy.freeze` stops
forwarding without closing or refusing anything, as a frozen network or a
hung peer does, until :meth:`TcpProxy.thaw`. The shared server itself is
never touched.

A freeze inside one process cannot fool the client's kernel: the proxy's
kernel would still acknowledge every byte and answer every keepalive probe,
so only the application would notice. Made with ``frozen_network=True`` (root
and Linux network namespaces needed, see :func:`frozen_network_available`),
the proxy listens in a network namespace of its own, reached over a veth
pair, and a freeze also takes the namespace's end of the pair down: packets
to it are dropped silently, so nothing is acknowledged, connection attempts
hang, and TCP keepalives and ``tcp_user_timeout`` see a dead peer exactly as
they would on a real network. Clients connect to :attr:`TcpProxy.host` (an
address of that pair) instead of 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import socket
import struct
import subprocess
import threading
import time

_CLONE_NEWNET = 0x40000000
_proxy_numbers = itertools.count()


def frozen_network_available() -> bool:
    """Whether this process may make network namespaces and veth pairs (root, ``ip``, Linux)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None and os.path.isdir("/proc/self/ns")


class _Namespace:
    """A network namespace reached from here over a private veth pair (a /30 of 10.213.0.0/16)."""

    def __init__(self) -> None:
        n = next(_proxy_numbers) % 100
        pid = os.getpid() % 100_000
        self.name = f"txstore-freeze-{pid}-{n}"
        self.outside = f"txf{pid}x{n}o"  # at most 15 characters
        self.inside = f"txf{pid}x{n}i"
        used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
        block = next(
            b
            for b in itertools.chain(range((pid * 100 + n) % 16_000, 16_000), range(16_000))
            if f" 10.213.{b // 64}.{(b % 64) * 4 + 1}/" not in used
        )
        base = f"10.213.{block // 64}.{(block % 64) * 4}"
        prefix = base.rsplit(".", 1)[0]
        last = int(base.rsplit(".", 1)[1])
        self.outside_address = f"{prefix}.{last + 1}"
        self.address = f"{prefix}.{last + 2}"
        self._probe: socket.socket | None = None
        self._remove()
        try:
            self._ip("netns", "add", self.name)
            self._ip("link", "add", self.outside, "type", "veth", "peer", "name", self.inside)
            self._ip("link", "set", self.inside, "netns", self.name)
            self._ip("addr", "add", f"{self.outside_address}/30", "dev", self.outside)
            self._ip("link", "set", self.outside, "up")
            self._ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", self.inside)
            self._ip("-n", self.name, "link", "set", "lo", "up")
            self.set_up(True)
        except BaseException:
            self._remove()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    def set_up(self, up: bool) -> None:
        self._ip("-n", self.name, "link", "set", self.inside, "up" if up else "down")
        if up:
            self._wait_reachable()

    def _wait_reachable(self, seconds: float = 5.0) -> None:
        """Until a connection to the namespace gets through: the first attempts after the
        link comes back can fail at once (the neighbour entry that failed while it was down)."""
        if self._probe is None:
            self._probe = self.listener()
            self._probe.settimeout(0)
        deadline = time.monotonic() + seconds
        while True:
            try:
                socket.create_connection(self._probe.getsockname()[:2], timeout=0.5).close()
                with contextlib.suppress(OSError):
                    self._probe.accept()[0].close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def listener(self) -> socket.socket:
        """A listening socket inside the namespace (made by a thread that enters it, then ends)."""
        made: list[socket.socket | BaseException] = []

        def enter_and_listen() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
                try:
                    if libc.setns(fd, _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns failed")
                finally:
                    os.close(fd)
                made.append(socket.create_server((self.address, 0)))
            except BaseException as e:
                made.append(e)

        thread = threading.Thread(target=enter_and_listen)
        thread.start()
        thread.join()
        if isinstance(made[0], BaseException):
            raise made[0]
        return made[0]

    def _remove(self) -> None:
        for args in (("link", "del", self.outside), ("netns", "del", self.name)):
            subprocess.run(["ip", *args], capture_output=True, timeout=10)

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
        self._remove()


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, frozen_network: bool = False) -> None:
        self.target = (target_host, target_port)
        self._namespace = _Namespace() if frozen_network else None
        try:
            if self._namespace is not None:
                self.host = self._namespace.address
                self._listener = self._namespace.listener()
            else:
                self.host = "127.0.0.1"
                self._listener = socket.create_server(("127.0.0.1", 0))
        except BaseException:
            if self._namespace is not None:
                self._namespace.close()
            raise
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._refuse_until = 0.0
        self._flowing = threading.Event()  # cleared while frozen
        self._flowing.set()
        self._closed = threading.Event()
        self.accepted = 0  # connections forwarded (or waiting for a thaw to be)
        self.dropped = 0
        self.refused = 0
        self.freezes = 0
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
        self.thaw()

    def freeze(self) -> int:
        """Stop forwarding in both directions, closing and refusing nothing; return the open connections.

        New connections are accepted but not forwarded either (with
        ``frozen_network``, their handshake does not even complete).
        """
        self._flowing.clear()
        if self._namespace is not None:
            self._namespace.set_up(False)
        self.freezes += 1
        with self._lock:
            return len(self._sockets) // 2

    def thaw(self) -> None:
        """Forward again; connections the clients have not given up on carry on where they were."""
        if self._flowing.is_set():
            return
        if self._namespace is not None:
            self._namespace.set_up(True)
        self._flowing.set()

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()  # lets frozen pumps see their sockets closed
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            victims = list(self._sockets)
            self._sockets.clear()
        for s in victims:
            _reset(s)
        if self._namespace is not None:
            self._namespace.close()

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
            self.accepted += 1
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        _watch_peer(client)
        self._flowing.wait()  # a connection accepted while frozen reaches the server after the thaw
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)
            return
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
                self._flowing.wait()
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


def _watch_peer(s: socket.socket) -> None:
    """Keepalives and a user timeout on the client's side, as the server itself sets on its
    sockets (txstore asks for them, ``txstore.postgres.db``): the proxy stands where the server would.

    Without them a client that vanished while the network was frozen (a killed driver's FIN
    lost on the downed link) stays connected here for good, and the proxy keeps its server
    session open: that session's job lock then refused every ``txstore reset`` (chaos seed
    4037, which looped restarting instances until it was stopped).
    """
    with contextlib.suppress(OSError, AttributeError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 2)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 4000)


def _reset(s: socket.socket) -> None:
    """Close with RST, as a crashed or unreachable server would."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)  # wakes a pump thread blocked in recv on it
    with contextlib.suppress(OSError):
        s.close()
