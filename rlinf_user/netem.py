"""Application-level emulation of a network link (delay, jitter, bandwidth) for TCP.

:class:`EmulatedLink` is a TCP relay: clients connect to its port and it forwards every
byte to the target, in each direction through a model of a bottleneck link: bytes queue
behind each other at ``mbit`` (serialisation), then travel ``delay_ms`` plus a jitter
sample (normal, ``jitter_ms`` standard deviation, never below zero). Bytes are delivered
in order (TCP does not reorder), so jitter stretches gaps rather than swapping packets.
The queue holds at most ``queue_bytes`` per direction; beyond that the relay stops reading
and the sender's TCP window closes, as behind a real bottleneck.

Used by tests and benchmarks, and by ``env.edge.link`` (the env worker reaches its edge
daemon through a link emulated in its own process) to rehearse a cloud GPU driving a
robot far away without leaving one machine. Nothing about the peers changes: they see an
ordinary TCP connection.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass

log = logging.getLogger(__name__)

PIECE = 16 * 1024  # bytes read at a time: at 20 Mbit/s one piece is 6.6 ms on the wire


@dataclass(frozen=True)
class LinkSpec:
    """One direction's properties (both directions get the same)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    mbit: float | None = None  # None: no bandwidth limit
    queue_bytes: int = 4 * 2**20

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise ValueError(f"link delay_ms and jitter_ms must be >= 0, got {self.delay_ms}, {self.jitter_ms}")
        if self.mbit is not None and self.mbit <= 0:
            raise ValueError(f"link mbit must be > 0 (or null for no limit), got {self.mbit}")
        if self.queue_bytes < PIECE:
            raise ValueError(f"link queue_bytes must be >= {PIECE}")

    @classmethod
    def from_config(cls, cfg) -> LinkSpec | None:
        if cfg is None:
            return None
        d = dict(cfg)
        unknown = set(d) - {"delay_ms", "jitter_ms", "mbit", "queue_bytes"}
        if unknown:
            raise ValueError(f"link: unknown key(s) {sorted(unknown)}; use delay_ms, jitter_ms, mbit, queue_bytes")
        return cls(
            delay_ms=float(d.get("delay_ms") or 0.0), jitter_ms=float(d.get("jitter_ms") or 0.0),
            mbit=None if d.get("mbit") is None else float(d["mbit"]), queue_bytes=int(d.get("queue_bytes") or 4 * 2**20),
        )  # fmt: skip


class _Direction:
    """One direction of one connection: a reader fills the queue, a writer drains it on time."""

    def __init__(self, src: socket.socket, dst: socket.socket, spec: LinkSpec, rng: random.Random, link: EmulatedLink):
        self.src, self.dst, self.spec, self.rng, self.link = src, dst, spec, rng, link
        self.queue: deque[tuple[float, bytes]] = deque()
        self.queued = 0
        self.cv = threading.Condition()
        self.eof = False
        self.link_free = 0.0  # when the bottleneck finishes sending what it holds
        self.last_due = 0.0

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True, name="netem-read").start()
        threading.Thread(target=self._write, daemon=True, name="netem-write").start()

    def _due(self, n: int) -> float:
        now = time.monotonic()
        start = max(now, self.link_free)
        done = start + (n * 8 / (self.spec.mbit * 1e6) if self.spec.mbit else 0.0)
        self.link_free = done
        jitter = self.rng.gauss(0.0, self.spec.jitter_ms) if self.spec.jitter_ms else 0.0
        due = done + max(0.0, self.spec.delay_ms + jitter) / 1e3
        self.last_due = max(self.last_due, due)  # in order
        return self.last_due

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(PIECE)
                if not data:
                    break
                size = len(data)
                with self.cv:
                    self.cv.wait_for(lambda size=size: self.queued + size <= self.spec.queue_bytes or self.eof)
                    self.queue.append((self._due(len(data)), data))
                    self.queued += len(data)
                    self.cv.notify_all()
        except OSError:
            pass
        finally:
            with self.cv:
                self.eof = True
                self.cv.notify_all()

    def _write(self) -> None:
        try:
            while True:
                with self.cv:
                    self.cv.wait_for(lambda: self.queue or self.eof)
                    if not self.queue:
                        break
                    due, data = self.queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                with self.link._lock:
                    self.link.stats["bytes"] += len(data)
                self.dst.sendall(data)
                with self.cv:
                    self.queue.popleft()
                    self.queued -= len(data)
                    self.cv.notify_all()
        except OSError:
            pass
        finally:
            for s in (self.dst, self.src):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class EmulatedLink:
    """``listen_host:port`` -> ``target_host:target_port`` through an emulated link; with
    ``offsets``, ``port + k`` -> ``target_port + k`` too, through the same kind of link (a
    daemon reached at one port and told to use a neighbour, as the edge daemon's controller
    socket at ``port + 2``)."""

    BIND_TRIES = 50

    def __init__(
        self, target_host: str, target_port: int, spec: LinkSpec, listen_host: str = "127.0.0.1",
        listen_port: int = 0, seed: int | None = None, offsets: tuple[int, ...] = (),
    ):  # fmt: skip
        self.target = (target_host, int(target_port))
        self.spec = spec
        self._rng = random.Random(seed)
        self._servers = self._bind(listen_host, listen_port, tuple(offsets))
        self.host, self.port = listen_host, self._servers[0][1].getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.stats = {"connections": 0, "bytes": 0}
        for k, srv in self._servers:
            threading.Thread(target=self._accept, args=(srv, (target_host, int(target_port) + k)),
                             daemon=True, name="netem-accept").start()  # fmt: skip
        log.info(
            "emulated link %s:%d -> %s:%d%s (delay %.1f ms, jitter %.1f ms, %s)", listen_host, self.port,
            target_host, target_port, f" (and +{', +'.join(map(str, offsets))})" if offsets else "",
            spec.delay_ms, spec.jitter_ms, f"{spec.mbit} Mbit/s" if spec.mbit else "no bandwidth limit",
        )  # fmt: skip

    @classmethod
    def _bind(cls, host: str, port: int, offsets: tuple[int, ...]) -> list[tuple[int, socket.socket]]:
        """Listening sockets at ``port`` and ``port + k``; with ``port`` 0, a free base whose
        neighbours are free too."""
        for _ in range(cls.BIND_TRIES if port == 0 else 1):
            first = socket.create_server((host, port))
            base = first.getsockname()[1]
            servers = [(0, first)]
            try:
                for k in offsets:
                    servers.append((k, socket.create_server((host, base + k))))
                return servers
            except OSError:
                for _, srv in servers:
                    srv.close()
                if port != 0:
                    raise
        raise OSError(f"no free port on {host} with free neighbours at +{offsets}")

    def _accept(self, srv: socket.socket, target: tuple[str, int]) -> None:
        while not self._closed:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(target, timeout=10)
                server.settimeout(None)
            except OSError as err:
                log.warning("emulated link: target %s:%d unreachable (%s)", *target, err)
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._socks += [client, server]
                self.stats["connections"] += 1
            _Direction(client, server, self.spec, self._rng, self).start()
            _Direction(server, client, self.spec, self._rng, self).start()

    def close(self) -> None:
        self._closed = True
        for _, srv in self._servers:
            try:
                srv.close()
            except OSError:
                pass
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._socks.clear()

    def __enter__(self) -> EmulatedLink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
