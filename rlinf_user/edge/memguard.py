"""Bounding the memory a peer can make the daemon's network process hold.

libzmq hands a multipart message to the application only once every frame has arrived,
and ``ZMQ_MAXMSGSIZE`` bounds a single frame, not a message: a peer that sends many
frames under the cap without ever ending the message makes libzmq buffer all of them. No
socket option bounds that, so this guard watches from outside: a thread reads the
process's resident memory every ``interval_s`` (5 ms) and, every ``sample_s``, each TCP
connection's received-byte count from the kernel (``TCP_INFO``), keeping ``history_s`` of
those samples. When memory has grown past ``budget_bytes`` over its baseline, the growth is
attributed from the last sample at which memory was still near the baseline (the oldest
kept, if memory has been high for longer). If the bytes the connections received since then
account for 3/4 of the growth (a hoarded message accounts for all of it), the connection that
received the most is shut down (libzmq then drops that peer's unfinished message and frees
it), and the next check takes the next one while memory stays high, so a flood split over
several connections is cut too. Otherwise the growth is the process's own and the baseline
rises. A flood is caught at any rate this way; nothing here touches libzmq's own state.

The same samples bound **pending connections**: connections that have not received the bytes
a finished handshake takes (``handshake_bytes``: a ZMTP greeting plus CURVE's HELLO and
INITIATE). libzmq drops an unfinished handshake after ``ZMQ_HANDSHAKE_IVL`` (the daemon sets
it), but a peer that opens connections faster than that would still hold a descriptor and
some 40 kB of libzmq buffers each. Beyond ``max_pending`` of them the oldest are shut down
(a legitimate client finishes its handshake within milliseconds, so it is never the oldest
pending one), which keeps descriptors for the controller and the daemon itself. The guard
itself opens no file once started: ``/proc/self/statm`` stays open, connections are read
through their own descriptors (never duplicated), and when the process is out of
descriptors the table is probed with ``readlink`` alone. A failing check is logged once per
interval with a count, never per check.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import socket
import struct
import threading
import time
from collections import deque

from rlinf_user.edge.ratelimit import LogThrottle

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TCP_INFO_LEN = 232
_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received (u64) in struct tcp_info (Linux >= 4.1)
_ESTABLISHED = 1


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _Statm:
    """``/proc/self/statm`` opened once; each read is one ``pread`` (no descriptor needed)."""

    def __init__(self) -> None:
        self.fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)

    def rss(self) -> int:
        return int(os.pread(self.fd, 128, 0).split()[1]) * _PAGE

    def close(self) -> None:
        os.close(self.fd)


def _fds(max_fd: int) -> list[int]:
    """This process's open descriptors; without a descriptor to spare for listing
    ``/proc/self/fd``, probed one by one with ``readlink`` (which needs none)."""
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        out = []
        for fd in range(max_fd):
            try:
                os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            out.append(fd)
        return out


def tcp_connections(local_ports=None, max_fd: int = 4096) -> dict[tuple[int, int], int]:
    """(fd, socket inode) -> bytes received, for every established TCP connection of this
    process (accepted on one of ``local_ports`` only, when given: a port or a collection).
    The inode tells a new connection from an old one that had the same descriptor number.
    Each socket is read through its own descriptor (no ``dup``: nothing is opened)."""
    if isinstance(local_ports, int):
        local_ports = (local_ports,)
    out = {}
    for fd in _fds(max_fd):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not link.startswith("socket:["):
            continue
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if local_ports is not None and s.getsockname()[1] not in local_ports:
                continue
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        except OSError:
            continue
        finally:
            s.detach()  # the descriptor stays libzmq's
        if len(info) >= _BYTES_RECEIVED + 8 and info[0] == _ESTABLISHED:
            out[(fd, int(link[8:-1]))] = struct.unpack_from("Q", info, _BYTES_RECEIVED)[0]
    return out


def _shutdown(key: tuple[int, int]) -> str | None:
    """Shut a connection down (libzmq sees the end and closes it); the peer, or None when
    the descriptor no longer holds that socket."""
    fd, inode = key
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != f"socket:[{inode}]":
            return None  # closed meanwhile (and the number perhaps reused): leave it alone
        s = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        peer = s.getpeername()
        s.shutdown(socket.SHUT_RDWR)
        return str(peer)
    except OSError:
        return None
    finally:
        s.detach()


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class IngressGuard(threading.Thread):
    def __init__(self, budget_bytes: int, ports, interval_s: float = 0.005, sample_s: float = 0.1,
                 history_s: float = 30.0, max_pending: int | None = None, handshake_bytes: int = 0,
                 log_interval_s: float = 10.0):  # fmt: skip
        super().__init__(name="edge-ingress-guard", daemon=True)
        self.budget = budget_bytes
        self.ports = (ports,) if isinstance(ports, int) else tuple(ports)
        self.interval_s, self.sample_s = interval_s, sample_s
        self.max_pending, self.handshake_bytes = max_pending, handshake_bytes
        self.cut = 0  # connections cut for hoarding memory
        self.pending_cut = 0  # connections cut for sitting in an unfinished handshake
        self.checks = self.failures = 0
        self.connections = self.pending = self.peak_connections = 0
        self._first_seen: dict[tuple[int, int], float] = {}
        self._stopping = threading.Event()
        self._history: deque[tuple[int, dict]] = deque(maxlen=max(2, int(history_s / sample_s)))
        self._statm = _Statm()
        self._max_fd = 4096
        self._log_interval_s, self._last_failure_log, self._unlogged = log_interval_s, -1e9, 0
        self._throttle = LogThrottle(log, log_interval_s)
        self.baseline = self._statm.rss()

    def stop(self) -> None:
        self._stopping.set()

    def status(self) -> dict:
        return {"checks": self.checks, "failures": self.failures, "cut_hoarding": self.cut,
                "cut_pending": self.pending_cut, "connections": self.connections, "pending": self.pending,
                "peak_connections": self.peak_connections}  # fmt: skip

    def _conns(self) -> dict:
        self._max_fd = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return tcp_connections(self.ports, self._max_fd)

    def run(self) -> None:
        next_sample = 0.0
        try:
            while not self._stopping.wait(self.interval_s):
                try:
                    now, rss = time.monotonic(), self._statm.rss()
                    self.checks += 1
                    if rss - self.baseline > self.budget:
                        self._cut_top_grower(rss)
                    elif now >= next_sample:
                        conns = self._conns()
                        self._history.append((rss, conns))
                        self._bound_pending(conns, now)
                        self._throttle.flush(now)
                        next_sample = now + self.sample_s
                except Exception as err:  # noqa: BLE001 - a guard that dies silently guards nothing
                    self._failed(err)
        finally:
            self._statm.close()

    def _failed(self, err: Exception) -> None:
        """One line per ``log_interval_s`` (with the count since the last), never one per check."""
        self.failures += 1
        now = time.monotonic()
        if now - self._last_failure_log < self._log_interval_s:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more failed checks since the last report)" if self._unlogged else ""
        log.error("ingress guard check failed: %s: %s%s", type(err).__name__, err, more)
        self._last_failure_log, self._unlogged = now, 0

    def _bound_pending(self, conns: dict, now: float) -> None:
        """Cut the oldest connections still short of a finished handshake beyond ``max_pending``."""
        seen = self._first_seen
        for key in [k for k in seen if k not in conns]:
            del seen[key]
        for key in conns:
            seen.setdefault(key, now)
        pending = [k for k, n in conns.items() if n < self.handshake_bytes]
        dropped = self.peak_connections > 64 and len(conns) < self.peak_connections // 2
        self.connections, self.pending = len(conns), len(pending)
        self.peak_connections = max(self.peak_connections, len(conns))
        if self.max_pending is not None and len(pending) > self.max_pending:
            pending.sort(key=seen.get)
            victims = pending[: len(pending) - self.max_pending // 2]
            cut = sum(_shutdown(k) is not None for k in victims)
            self.pending_cut += cut
            self._throttle.warn("pending cut", "%d connections had not finished their handshake (at most %d may "
                                "wait): cut the %d oldest (%d cut so far)", len(pending), self.max_pending, cut,
                                self.pending_cut)  # fmt: skip
            dropped = True
        if dropped:  # after an attack: give libzmq's freed buffers back to the system
            time.sleep(0.02)
            _trim()
            if len(conns) < self.peak_connections // 2:
                self.peak_connections = len(conns)

    def _reference(self) -> tuple[int, dict]:
        """The last sample taken while memory was near the baseline, else the oldest kept."""
        for rss, conns in reversed(self._history):
            if rss - self.baseline <= self.budget // 4:
                return rss, conns
        return self._history[0] if self._history else (self.baseline, {})

    def _cut_top_grower(self, rss: int) -> None:
        """The top client connection is cut when the connections' bytes since the reference
        account for 3/4 of the memory growth; growth from anything else (the process's own
        allocations) raises the baseline instead."""
        ref_rss, ref = self._reference()
        current = self._conns()
        growth = {key: n - ref.get(key, 0) for key, n in current.items()}
        key = max(growth, key=growth.get) if growth else None
        received = sum(max(0, n) for n in growth.values())
        if key is None or received < 3 * max(rss - ref_rss, self.budget // 8) // 4:
            log.info("memory grew %.0f MB over the baseline, not by a client's message: new baseline",
                     (rss - self.baseline) / 2**20)  # fmt: skip
            self.baseline = rss
            self._history.append((rss, current))
            return
        peer = _shutdown(key)  # libzmq sees the drop and frees the message
        if peer is not None:
            self.cut += 1
            log.warning("dropped the connection from %s: %.0f MB received in an unfinished "
                        "message (memory budget %.0f MB)", peer, growth[key] / 2**20,
                        self.budget / 2**20)  # fmt: skip
        else:
            log.warning("could not drop connection fd %d (already closed)", key[0])
        time.sleep(0.05)  # let libzmq's I/O thread release it
        _trim()
        after = self._statm.rss()
        self.baseline = max(self.baseline, after - self.budget // 2)  # what stays is not a peer's
        self._history.append((after, self._conns()))
