"""Bounding what clients can make the edge daemon do: token buckets and throttled logs.

:class:`PeerLimiter` keeps one token bucket per peer (a CURVE public key, else a ZMQ
connection identity) plus one shared bucket for all of them, so neither one peer nor many
can make the daemon spend more than a fixed budget on requests. The peer table is
bounded (least recently seen peers are forgotten first).

:class:`LogThrottle` turns a burst of identical warnings (refused handshakes, rejected
messages) into one line per interval with a count.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Hashable


class TokenBucket:
    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float | None = None):
        self.rate, self.burst = float(rate), float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic() if now is None else now

    def refill(self, now: float) -> bool:
        """Top up to ``now``; True when a token is there to take."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)
        return self.tokens >= 1.0

    def take(self, now: float) -> bool:
        if self.refill(now):
            self.tokens -= 1.0
            return True
        return False


class PeerLimiter:
    def __init__(self, per_peer_hz: float, total_hz: float, max_peers: int = 1024):
        self.per_peer_hz, self.total_hz = per_peer_hz, total_hz
        self.max_peers = max_peers
        self.total = TokenBucket(total_hz, 2 * total_hz)
        self.peers: collections.OrderedDict[Hashable, TokenBucket] = collections.OrderedDict()
        self.limited = 0

    def allow(self, peer: Hashable, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        bucket = self.peers.get(peer)
        if bucket is None:
            bucket = self.peers[peer] = TokenBucket(self.per_peer_hz, 2 * self.per_peer_hz, now)
            if len(self.peers) > self.max_peers:
                self.peers.popitem(last=False)
        else:
            self.peers.move_to_end(peer)
        if bucket.refill(now) and self.total.refill(now):  # spend from neither unless both allow
            bucket.tokens -= 1.0
            self.total.tokens -= 1.0
            return True
        self.limited += 1
        return False


class LogThrottle:
    """``warn(key, msg, *args)`` logs the first occurrence of ``key`` per ``interval_s``
    at once and summarises the rest when the interval ends (``flush`` from a timer)."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0):
        self.log, self.interval_s = logger, interval_s
        self.counts: dict[str, int] = {}
        self.first: dict[str, float] = {}

    def warn(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        self.flush(now)
        if key not in self.first:
            self.first[key] = now
            self.counts[key] = 0
            self.log.warning(msg, *args)
        else:
            self.counts[key] += 1

    def flush(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for key in [k for k, t in self.first.items() if now - t >= self.interval_s]:
            n = self.counts.pop(key)
            del self.first[key]
            if n:
                self.log.warning("%s: %d more in the last %.0f s", key, n, self.interval_s)
