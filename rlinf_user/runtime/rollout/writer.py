"""Transition writer: each step's rows as ``Col`` columns, stamped with the acting policy
version, env id, step number and intervention flag (plus the policy's log-prob, value and
sample for on-policy algorithms, a chunk's steps folded into one row by
:class:`~.chunks.DecisionRows`, as for replay plans with ``chunk_rows``), batched and sent to the sink as numbered chunks
(:class:`~.chunk_sender.ChunkSender`: windowed, resent after a sink dies)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_user.env.spec import Col, flat_obs
from rlinf_user.runtime.rollout.chunk_sender import ChunkSender
from rlinf_user.runtime.rollout.chunks import DecisionRows
from rlinf_user.runtime.rollout.step import Step

ON_POLICY_EXTRAS = (Col.LOG_PROB, Col.VALUE, Col.SAMPLE)
ENV_ID_STRIDE = 1000  # env j of worker w is env id w * ENV_ID_STRIDE + j


class TransitionWriter:
    def __init__(self, num_envs: int, worker_id: int, sink, *, on_policy: bool, per_action_credit: bool,
                 chunk_steps: int, replay_extras: tuple[str, ...] = (), chunk_rows: bool = False):  # fmt: skip
        self.env_ids = worker_id * ENV_ID_STRIDE + np.arange(num_envs, dtype=np.int64)
        self.env_step = np.zeros(num_envs, dtype=np.int64)  # per-env step sequence number
        self.on_policy = on_policy
        self.replay_extras = tuple(replay_extras)  # the policy's extras a replay row keeps (ReplayPlan.extras)
        # a row per chunk: on-policy, and replay rows of a chunk whose steps share one choice
        # (each action's reward kept: the target discounts them)
        self.decisions = DecisionRows(num_envs, per_action_credit or not on_policy) if on_policy or chunk_rows else None
        self.chunk_steps = int(chunk_steps)  # rows batched per chunk sent
        self.pending: list[dict[str, np.ndarray]] = []  # one entry of columns per step
        self.pending_rows = 0
        self.rows_sent = 0  # rows produced (on-policy: one per decision, a chunk's steps in one)
        self.out = ChunkSender(f"worker{worker_id}", sink)

    def write(self, step: Step, stored_next: dict[str, Any], chunk_ends: np.ndarray, chunk_width: int) -> None:
        """One step of every env; ``chunk_ends``: per env, the next step starts a new chunk
        (this one ran out, or its successor was asked for early: a chunk streamed to the edge)."""
        n = len(step.actions)
        cols = {**flat_obs(Col.OBS, step.obs), **flat_obs(Col.NEXT_OBS, stored_next)}
        cols.update({
            Col.ACTION: step.actions, Col.REWARD: np.asarray(step.reward, np.float32),
            Col.TERMINATED: np.asarray(step.terminated, np.float32), Col.TRUNCATED: np.asarray(step.truncated, np.float32),
            Col.POLICY_VERSION: np.full(n, step.version, np.int64), Col.INTERVENTION: step.intervention,
            Col.ENV_ID: self.env_ids, Col.STEP: self.env_step.copy(),
        })  # fmt: skip
        live = step.live
        if self.on_policy:
            cols.update({k: v for k, v in step.extras.items() if k in ON_POLICY_EXTRAS})
            if step.group is not None:
                cols[Col.GROUP] = step.group
            self.decisions.width = chunk_width
            closes = live & (step.done | (True if step.random else chunk_ends))
            self._pend(self.decisions.add(cols, live, closes))
        else:
            for k in self.replay_extras:
                if k not in step.extras:
                    raise RuntimeError(f"the algorithm keeps the policy's {k!r} in every replay row, but this step's "
                                       f"policy gave none (extras: {sorted(step.extras)})")  # fmt: skip
                cols[k] = np.asarray(step.extras[k])
            if self.decisions is not None:
                self.decisions.width = chunk_width
                self._pend(self.decisions.add(cols, live, live & (step.done | chunk_ends)))
            else:
                self._pend(cols if live.all() else {k: v[live] for k, v in cols.items()})
        self.env_step += live
        if self.pending_rows >= self.chunk_steps:
            self.flush()

    def cut_episodes(self) -> None:
        """The episodes in progress were cut short (an evaluation took the envs): their open
        decisions end here, truncated; the next chunk starts a new row."""
        if self.decisions is not None:
            self._pend(self.decisions.close_all(truncate=True))

    def end_round(self) -> None:
        """A synchronous round ends: its open decisions end with it."""
        if self.decisions is not None:
            self._pend(self.decisions.close_all())

    def _pend(self, cols: dict[str, np.ndarray] | None) -> None:
        if cols:
            self.pending.append(cols)
            self.pending_rows += len(cols[Col.REWARD])
            self.rows_sent += len(cols[Col.REWARD])

    def flush(self) -> None:
        """Send the batched transitions. Chunks stay here until the sink has taken them:
        one whose send failed (the learner died) is sent again to the next sink, so a
        learner crash loses nothing a worker produced (at-least-once: a chunk the dead
        learner had already logged may arrive twice)."""
        if self.pending:
            keys = self.pending[0].keys()
            self.out.put({k: np.concatenate([np.asarray(p[k]) for p in self.pending]) for k in keys})
            self.pending, self.pending_rows = [], 0
        else:
            self.out.send()

    def drain(self) -> None:
        """Return once every chunk has reached the sink."""
        self.out.drain()

    def close(self) -> None:
        self.out.close()
