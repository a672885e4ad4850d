"""Chunked execution on the edge: actions scheduled by control tick.

A client sends a chunk of H actions computed from the observation of tick ``s``; action
``k`` is meant for tick ``s + 1 + k``. The control loop runs one scheduled action per tick
(every one through the backend's safety checks), so the robot keeps moving while the next
chunk is being computed, however slow or distant the model:

* actions whose tick has already passed when the chunk arrives (the inference latency)
  are dropped and counted as ``late``, so the robot never replays the past;
* ticks the new chunk does not cover yet keep the previous chunk's actions;
* over the first ``blend`` ticks the two chunks overlap, the executed action moves
  linearly from the old chunk's to the new one's (weights ``(i + 1) / (blend + 1)``), a
  simple form of real-time chunking's soft masking that removes the jump at the seam;
* when the schedule runs dry the loop's watchdog holds the arm as it does for single
  actions.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ActionPlan:
    def __init__(self, dim: int = 7):
        self.first = 0  # the tick of actions[0]
        self.actions = np.zeros((0, dim))
        self.rid = 0  # the chunk request the current actions came from

    def __len__(self) -> int:
        return len(self.actions)

    def left(self, tick: int) -> int:
        """Actions scheduled for ``tick`` and later."""
        return max(0, self.first + len(self.actions) - max(tick, self.first))

    def clear(self) -> int:
        n = len(self.actions)
        self.actions = self.actions[:0]
        return n

    def replace(self, actions: np.ndarray, first_tick: int, next_tick: int, blend: int, rid: int) -> dict[str, Any]:
        """Schedule ``actions`` from ``first_tick`` on; ``next_tick`` is the next tick the
        loop will run. Returns what was queued and dropped."""
        actions = np.asarray(actions, dtype=np.float64)
        late = max(0, next_tick - first_tick)
        new = actions[late:].copy()
        first = first_tick + late
        if len(new) == 0:
            return {"queued": 0, "late": late, "first_tick": first, "blended": 0}
        keep_from = max(next_tick, self.first)
        old = self.actions[keep_from - self.first :] if len(self.actions) else self.actions
        # the old chunk's actions for ticks [keep_from, first) run first; from ``first`` on
        # the new chunk, blended with the old one's where both cover a tick
        head = old[: max(0, first - keep_from)]
        overlap = old[max(0, first - keep_from) :]
        n = min(int(blend), len(overlap), len(new))
        if n:
            w = (np.arange(n) + 1.0)[:, None] / (n + 1.0)
            new[:n] = (1.0 - w) * overlap[:n] + w * new[:n]
        self.actions = np.concatenate([head, new]) if len(head) else new
        self.first = keep_from if len(head) else first
        self.rid = rid
        return {"queued": len(new), "late": late, "first_tick": first, "blended": n}

    def pop(self, tick: int) -> np.ndarray | None:
        """The action scheduled for ``tick`` (earlier ones are dropped), or None."""
        if tick < self.first or not len(self.actions):
            return None
        i = tick - self.first
        if i >= len(self.actions):
            self.clear()
            return None
        action = self.actions[i]
        self.actions = self.actions[i + 1 :]
        self.first = tick + 1
        return action
