"""A worker's outgoing transition chunks: numbered, sent with a bounded window, kept
until the sink has taken them.

Each chunk gets the next sequence number of this sender (one per worker process), so the
sink stores them in order (:mod:`rlinf_user.runtime.learning.ordered_sink`). At most
``max_inflight`` sends are outstanding; a chunk whose send failed because the sink died
goes back to the backlog and is sent again to the next sink, so a learner crash loses
nothing a worker produced (at-least-once: the sink drops a copy it already stored).
While there is no live sink, the backlog keeps the newest ``max_backlog`` chunks.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from typing import Any

log = logging.getLogger(__name__)


def _actor_id(handle) -> Any:
    return getattr(handle, "_actor_id", handle)


class ChunkSender:
    def __init__(self, name: str, sink=None, max_inflight: int = 4, max_backlog: int = 500) -> None:
        self.sender = f"{name}-{uuid.uuid4().hex[:8]}"  # a restarted worker is a new sender
        self.sink = sink
        self.sink_alive = True
        self.max_inflight = max_inflight
        self.max_backlog = max_backlog
        self.next_seq = 0
        self.inflight: deque = deque()  # (ref, seq, chunk, sink) sent, not yet acknowledged
        self.backlog: deque = deque()  # (seq, chunk) waiting for a (live) sink, in order
        self.dropped_chunks = 0

    def put(self, chunk: dict) -> None:
        """Number ``chunk`` and send what the window allows."""
        self.backlog.append((self.next_seq, chunk))
        self.next_seq += 1
        self.send()

    def set_sink(self, sink) -> None:
        """A new (or restarted) sink: unsent chunks follow to it."""
        self.sink = sink
        self.sink_alive = True
        self.send()

    def send(self) -> None:
        import ray

        while self.inflight:  # reap finished sends in order
            ready, _ = ray.wait([self.inflight[0][0]], timeout=0)
            if not ready:
                break
            self._reap()
        if not self.sink_alive or self.sink is None:
            while len(self.backlog) > self.max_backlog:  # bounded memory while nobody takes data
                self.backlog.popleft()
                self.dropped_chunks += 1
                log.error(
                    "no sink for %d chunks: dropped the oldest (%d so far)", self.max_backlog, self.dropped_chunks
                )
            return
        while self.backlog and self.sink_alive:
            if len(self.inflight) >= self.max_inflight:  # back-pressure only if the sink is far behind
                self._reap()
                continue
            seq, chunk = self.backlog.popleft()
            base = min([seq] + [e[1] for e in self.inflight])  # lowest number not yet acknowledged
            self.inflight.append((self.sink.add.remote(chunk, self.sender, seq, base), seq, chunk, self.sink))

    def drain(self, timeout: float = 120.0) -> None:
        """Wait until every chunk so far has reached the sink (synchronous on-policy rounds:
        the learner must hold the whole rollout before it updates)."""
        import ray

        deadline = time.monotonic() + timeout
        while (self.inflight or self.backlog) and self.sink_alive and time.monotonic() < deadline:
            if self.inflight:
                ray.wait([self.inflight[0][0]], timeout=1.0)
            self.send()

    def close(self, timeout: float = 10.0) -> None:
        """Let the last sends land before the process goes."""
        import ray

        if self.inflight:
            ray.wait([e[0] for e in self.inflight], num_returns=len(self.inflight), timeout=timeout)

    def _reap(self) -> None:
        """Wait for the oldest outstanding send. If its sink died, the chunk goes back to
        the backlog (in sequence order) for the next sink; if that sink is the current one,
        every send still outstanding goes back with it and sending stops until a new sink
        is set (a failed send to a sink already replaced does not stop the new one)."""
        import ray

        ref, seq, chunk, sink = self.inflight.popleft()
        try:
            ray.get(ref)
            return
        except ray.exceptions.RayActorError:
            back = [(seq, chunk)]
        if _actor_id(sink) == _actor_id(self.sink):
            back += [(s, c) for _, s, c, _ in self.inflight]
            self.inflight.clear()
            self.sink_alive = False
        self.backlog = deque(sorted([*back, *self.backlog], key=lambda e: e[0]))
