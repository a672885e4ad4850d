"""Bounding the memory a peer can make the daemon's network process hold.

libzmq hands a multipart message to the application only once every frame has arrived,
and ``ZMQ_MAXMSGSIZE`` bounds a single frame, not a message: a peer that sends many
frames under the cap without ever ending the message makes libzmq buffer all of them. No
socket option bounds that, so this guard watches from outside: a thread reads the
process's resident memory every ``interval_s`` (5 ms); when it has grown past ``budget_bytes``
over its baseline, the TCP connection that received the most bytes since the last sample
is shut down (libzmq then drops that peer's unfinished message and frees it) and the event
is counted and logged. Connections are found as this process's TCP sockets and their byte
counts read from the kernel (``TCP_INFO``), so nothing here touches libzmq's own state.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import struct
import threading
import time

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TCP_INFO_LEN = 232
_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received (u64) in struct tcp_info (Linux >= 4.1)
_ESTABLISHED = 1


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def tcp_connections(local_port: int | None = None) -> dict[int, int]:
    """fd -> bytes received, for every established TCP connection of this process (accepted
    on ``local_port`` only, when given)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
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
            out[fd] = struct.unpack_from("Q", info, _BYTES_RECEIVED)[0]
    return out


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class IngressGuard(threading.Thread):
    def __init__(self, budget_bytes: int, port: int, interval_s: float = 0.005, sample_s: float = 0.1):
        super().__init__(name="edge-ingress-guard", daemon=True)
        self.budget, self.port = budget_bytes, port
        self.interval_s, self.sample_s = interval_s, sample_s
        self.cut = 0
        self._stopping = threading.Event()
        self._samples: dict[int, int] = {}
        self.baseline = rss_bytes()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        next_sample = 0.0
        while not self._stopping.wait(self.interval_s):
            try:
                now = time.monotonic()
                if rss_bytes() - self.baseline > self.budget:
                    self._cut_top_grower()
                elif now >= next_sample:
                    self._samples, next_sample = tcp_connections(self.port), now + self.sample_s
            except Exception:  # noqa: BLE001 - a guard that dies silently guards nothing
                log.exception("ingress guard check failed")

    def _cut_top_grower(self) -> None:
        """Only a client connection that received a good share of the budget is cut; growth
        from anything else (the process's own allocations) raises the baseline instead."""
        current = tcp_connections(self.port)
        growth = {fd: n - self._samples.get(fd, 0) for fd, n in current.items()}
        fd = max(growth, key=growth.get) if growth else None
        if fd is not None and growth[fd] >= self.budget // 4:
            try:
                with socket.socket(fileno=os.dup(fd)) as s:
                    peer = s.getpeername()
                    s.shutdown(socket.SHUT_RDWR)  # libzmq sees the drop and frees the message
                self.cut += 1
                log.warning("dropped the connection from %s: %.0f MB received in an unfinished "
                            "message (memory budget %.0f MB)", peer, growth[fd] / 2**20,
                            self.budget / 2**20)  # fmt: skip
            except OSError as err:
                log.warning("could not drop connection fd %d: %s", fd, err)
        else:
            log.info("memory grew %.0f MB over the baseline, not by a client's message: new baseline",
                     (rss_bytes() - self.baseline) / 2**20)  # fmt: skip
            self.baseline = rss_bytes()
            self._samples = tcp_connections(self.port)
            return
        time.sleep(0.05)  # let libzmq's I/O thread release it
        _trim()
        self._samples = tcp_connections(self.port)
        self.baseline = max(self.baseline, rss_bytes() - self.budget // 2)  # what stays is not a peer's
