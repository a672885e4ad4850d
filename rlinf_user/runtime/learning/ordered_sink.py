"""Per-sender ordering for transition sinks.

The learner and the replay service are threaded Ray actors (several calls run at once),
and Ray does not order calls to such actors, not even calls from one caller: a worker's
chunk ``n+1`` can be stored before its chunk ``n``. Readers of the log (n-step returns,
on-policy segments, episode exports) need each env stream in the order it ran, so
senders number their chunks and the sink applies them in that order.

A sender is one worker process (an id that a restarted worker does not reuse). Each
chunk carries its sequence number ``seq`` and ``base``, the lowest number the sender has
not yet seen acknowledged: everything below ``base`` was delivered or dropped for good,
so a sink (new or old) never waits for it. Chunks that arrive early are held; chunks
already applied (a resend after a lost reply) are dropped. If a gap stays open for
``max_held`` chunks (its sender died mid-send), the held ones are applied in order and
the gap is logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class SenderOrder:
    """Applies each sender's numbered chunks in sequence order (thread-safe)."""

    def __init__(self, max_held: int = 64) -> None:
        self.max_held = max_held
        self.lock = threading.Lock()
        self.next: dict[str, int] = {}  # sender -> next sequence number to apply
        self.held: dict[str, dict[int, Any]] = {}  # sender -> early chunks by number
        self.duplicates = 0
        self.gaps = 0

    def add(self, chunk: Any, sender: str | None, seq: int, base: int, apply: Callable[[Any], int]) -> int:
        """Apply ``chunk`` (and any held chunks it unblocks) in order; returns the rows
        ``apply`` stored now. ``sender=None`` applies at once (unnumbered callers)."""
        with self.lock:
            if sender is None:
                return apply(chunk)
            nxt = max(self.next.get(sender, base), base)
            if seq < nxt:
                self.duplicates += 1
                log.warning("chunk %d from %s was already applied: dropped the copy", seq, sender)
                return 0
            held = self.held.setdefault(sender, {})
            held[seq] = chunk
            stored = 0
            if len(held) > self.max_held and nxt not in held:
                first = min(held)
                self.gaps += 1
                log.error(
                    "chunks %d..%d from %s never arrived: applying the %d after them", nxt, first - 1, sender, len(held)
                )
                nxt = first
            while nxt in held:
                stored += apply(held.pop(nxt))
                nxt += 1
            self.next[sender] = nxt
            if not held:
                del self.held[sender]
            return stored

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {
                "held_chunks": sum(len(h) for h in self.held.values()),
                "duplicate_chunks": self.duplicates,
                "chunk_gaps": self.gaps,
            }
