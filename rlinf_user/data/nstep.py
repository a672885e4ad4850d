"""n-step returns over a ring replay buffer, kept up to date as rows arrive.

For each stored row ``t`` of an env stream, with ``k = min(n, rows of its episode stored
from t on)``:

* ``return``   = ``sum_{i<k} gamma^i r_{t+i}``
* ``discount`` = ``gamma^k``, or 0 when the episode terminated within those ``k`` rows
* ``boot``     = the buffer position of row ``t+k-1``, whose ``next_obs`` is the state
  the target bootstraps from

A row whose window is still open (its stream's newest ``n-1`` rows) carries its ``k < n``
step values, which are a valid target too; they grow as the stream's next rows arrive.

Rows continue a stream when their ``env_id`` matches, their ``step`` is the previous
row's plus one (a restarted worker, or a demonstration with the policy's steps left out,
starts a new stream) and the previous row did not end its episode. This needs each
stream's rows in the order they ran, which the sinks guarantee per sender
(:mod:`rlinf_user.runtime.learning.ordered_sink`). The bootstrap row of ``t`` is newer than ``t``,
so it is still in the ring as long as ``t`` is.
"""

from __future__ import annotations

import numpy as np

from rlinf_user.env.spec import Col

COLUMNS = ("nstep/return", "nstep/discount", "nstep/boot")


class NStepReturns:
    def __init__(self, n: int, gamma: float, capacity: int) -> None:
        if int(n) < 1:
            raise ValueError(f"n-step returns need n >= 1, got {n}")
        self.n = int(n)
        self.gamma = float(gamma)
        self.capacity = int(capacity)
        self.ret = np.zeros(self.capacity, np.float32)
        self.disc = np.zeros(self.capacity, np.float32)
        self.boot = np.zeros(self.capacity, np.int64)
        self.steps_in = np.zeros(self.capacity, np.int16)  # k of each row
        self.open: dict[int, list[int]] = {}  # stream -> absolute row numbers whose window is open
        self.last_step: dict[int, int] = {}
        self.total = 0  # absolute number of the next row

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        """Account for ``chunk``'s rows, stored at the ring positions that follow the
        previous chunk's (as :class:`~rlinf_user.data.replay.ReplayBuffer` stores them)."""
        reward = np.asarray(chunk[Col.REWARD], np.float64)
        term = np.asarray(chunk[Col.TERMINATED]) > 0
        trunc = np.asarray(chunk[Col.TRUNCATED]) > 0 if Col.TRUNCATED in chunk else np.zeros(len(reward), bool)
        env_id = np.asarray(chunk[Col.ENV_ID]) if Col.ENV_ID in chunk else np.zeros(len(reward), np.int64)
        step = np.asarray(chunk[Col.STEP]) if Col.STEP in chunk else None
        g, n, cap = self.gamma, self.n, self.capacity
        oldest = self.total + len(reward) - cap  # rows below this are overwritten by the end of the chunk
        for j in range(len(reward)):
            a, pos = self.total + j, (self.total + j) % cap
            s = int(env_id[j])
            window = self.open.get(s)
            if window and step is not None and int(step[j]) != self.last_step[s] + 1:
                window.clear()  # not the next step of that stream: a new stream
            r, done = float(reward[j]), bool(term[j])
            if window:
                keep = []
                for a0 in window:
                    if a0 < oldest:
                        continue
                    p0 = a0 % cap
                    k = int(self.steps_in[p0])
                    self.ret[p0] += (g**k) * r
                    self.steps_in[p0] = k + 1
                    self.disc[p0] = 0.0 if done else g ** (k + 1)
                    self.boot[p0] = pos
                    if k + 1 < n:
                        keep.append(a0)
                window[:] = keep
            self.ret[pos], self.steps_in[pos], self.boot[pos] = r, 1, pos
            self.disc[pos] = 0.0 if done else g
            if done or bool(trunc[j]):
                self.open.pop(s, None)
            elif n > 1:
                self.open.setdefault(s, []).append(a)
            if step is not None:
                self.last_step[s] = int(step[j])
        self.total += len(reward)

    def columns(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {"nstep/return": self.ret[idx], "nstep/discount": self.disc[idx], "nstep/boot": self.boot[idx]}

