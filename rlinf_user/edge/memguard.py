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
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import struct
import threading
import time
from collections import deque

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TCP_INFO_LEN = 232
_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received (u64) in struct tcp_info (Linux >= 4.1)
_ESTABLISHED = 1


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def tcp_connections(local_port: int | None = None) -> dict[tuple[int, int], int]:
    """(fd, socket inode) -> bytes received, for every established TCP connection of this
    process (accepted on ``local_port`` only, when given). The inode tells a new connection
    from an old one that had the same descriptor number."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
            if not link.startswith("socket:["):
                continue
            with socket.socket(fileno=os.dup(fd)) as s:
                if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                if local_port is not None and s.getsockname()[1] != local_port:
                    continue
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        except OSError:
            continue
        if len(info) >= _BYTES_RECEIVED + 8 and info[0] == _ESTABLISHED:
            out[(fd, int(link[8:-1]))] = struct.unpack_from("Q", info, _BYTES_RECEIVED)[0]
    return out


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class IngressGuard(threading.Thread):
    def __init__(self, budget_bytes: int, port: int, interval_s: float = 0.005, sample_s: float = 0.1,
                 history_s: float = 30.0):  # fmt: skip
        super().__init__(name="edge-ingress-guard", daemon=True)
        self.budget, self.port = budget_bytes, port
        self.interval_s, self.sample_s = interval_s, sample_s
        self.cut = 0
        self._stopping = threading.Event()
        self._history: deque[tuple[int, dict]] = deque(maxlen=max(2, int(history_s / sample_s)))
        self.baseline = rss_bytes()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        next_sample = 0.0
        while not self._stopping.wait(self.interval_s):
            try:
                now, rss = time.monotonic(), rss_bytes()
                if rss - self.baseline > self.budget:
                    self._cut_top_grower(rss)
                elif now >= next_sample:
                    self._history.append((rss, tcp_connections(self.port)))
                    next_sample = now + self.sample_s
            except Exception:  # noqa: BLE001 - a guard that dies silently guards nothing
                log.exception("ingress guard check failed")

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
        current = tcp_connections(self.port)
        growth = {key: n - ref.get(key, 0) for key, n in current.items()}
        key = max(growth, key=growth.get) if growth else None
        received = sum(max(0, n) for n in growth.values())
        if key is None or received < 3 * max(rss - ref_rss, self.budget // 8) // 4:
            log.info("memory grew %.0f MB over the baseline, not by a client's message: new baseline",
                     (rss - self.baseline) / 2**20)  # fmt: skip
            self.baseline = rss
            self._history.append((rss, current))
            return
        try:
            with socket.socket(fileno=os.dup(key[0])) as s:
                peer = s.getpeername()
                s.shutdown(socket.SHUT_RDWR)  # libzmq sees the drop and frees the message
            self.cut += 1
            log.warning("dropped the connection from %s: %.0f MB received in an unfinished "
                        "message (memory budget %.0f MB)", peer, growth[key] / 2**20,
                        self.budget / 2**20)  # fmt: skip
        except OSError as err:
            log.warning("could not drop connection fd %d: %s", key[0], err)
        time.sleep(0.05)  # let libzmq's I/O thread release it
        _trim()
        after = rss_bytes()
        self.baseline = max(self.baseline, after - self.budget // 2)  # what stays is not a peer's
        self._history.append((after, tcp_connections(self.port)))
