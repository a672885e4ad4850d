"""Action chunks executed step by step.

A policy returns ``H`` actions per env at once (:class:`rlinf_user.policies.base.PolicyOutput`);
the queue hands them out one step at a time and asks for a new chunk for an env once its
chunk is used up or its episode ended (a chunk never crosses an episode boundary). Per-row
extras (log-prob, value) belong to the step that queried them.
"""

from __future__ import annotations

import numpy as np

from rlinf_user.env.spec import Col


class ChunkQueue:
    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self.actions: np.ndarray | None = None  # (N, H, A)
        self.pos = np.zeros(num_envs, dtype=np.int64)
        self.length = np.zeros(num_envs, dtype=np.int64)  # 0: no chunk
        self.extras: dict[str, np.ndarray] = {}
        self.version = np.full(num_envs, -1, dtype=np.int64)

    def empty_rows(self) -> np.ndarray:
        return np.flatnonzero(self.pos >= self.length)

    def due(self, lookahead: int = 0) -> np.ndarray:
        """Per env: its chunk has at most ``lookahead`` actions left (0: none left), so the
        next step asks for a new one. Asking that early lets the edge run the rest of this
        chunk while the model computes (never before a chunk's first action ran); the
        chunk's decision ends with this step either way."""
        left = self.length - self.pos
        return (left <= 0) | (left <= np.minimum(lookahead, self.length - 1))

    def due_rows(self, lookahead: int = 0) -> np.ndarray:
        return np.flatnonzero(self.due(lookahead))

    def put(self, rows: np.ndarray, actions: np.ndarray, extras: dict[str, np.ndarray], version: int) -> None:
        actions = np.asarray(actions, np.float32)
        if actions.ndim == 2:
            actions = actions[:, None]
        if not np.isfinite(actions).all():
            raise FloatingPointError("the policy produced non-finite actions")
        if self.actions is None or self.actions.shape[1:] != actions.shape[1:]:
            self.actions = np.zeros((self.num_envs, *actions.shape[1:]), np.float32)
        self.actions[rows] = actions
        for k, v in extras.items():
            v = np.asarray(v)
            if k not in self.extras or self.extras[k].shape[1:] != v.shape[1:]:
                self.extras[k] = np.zeros((self.num_envs, *v.shape[1:]), v.dtype)
            self.extras[k][rows] = v
        self.pos[rows] = 0
        self.length[rows] = actions.shape[1]
        self.version[rows] = version

    def pop(self) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
        """This step's action per env, the extras, and the oldest version among them.

        Everything returned is a copy: the caller keeps it (a pending transition) while
        :meth:`put` overwrites the queue's arrays in place for the next chunk."""
        if len(self.empty_rows()):
            raise RuntimeError("an env has no queued action")
        a = self.actions[np.arange(self.num_envs), self.pos]
        self.pos += 1
        return a, {k: v.copy() for k, v in self.extras.items()}, int(self.version.min())

    def drop(self, rows) -> None:
        self.length[rows] = 0
        self.pos[rows] = 0

    def clear(self) -> None:
        self.length[:] = 0
        self.pos[:] = 0


class DecisionRows:
    """On-policy rows per policy decision: the steps one chunk ran become one row.

    A chunk is one action of the policy (its log-prob and value were computed once, for the
    whole chunk), so PPO and GRPO score it once: the row keeps the columns of the chunk's
    first step (observation, extras, policy version), the ``next_obs/...`` columns,
    ``terminated`` and ``truncated`` of its last step, the sum of its rewards, whether a
    human intervened on any step, and a per-env decision sequence number as ``step``
    (chunk-level credit). With chunks of one step this is exactly one row per step.
    """

    def __init__(self, num_envs: int, per_action: bool = False):
        self.open: list[dict[str, np.ndarray] | None] = [None] * num_envs
        self.seq = np.zeros(num_envs, dtype=np.int64)
        # action-level credit: rows also keep each action's reward (``step_rewards``, zero
        # past the actions that ran) and how many ran (``chunk_steps``); ``width`` is the
        # policy's chunk length (set once its first chunk is known)
        self.per_action = per_action
        self.width = 1

    def _step_columns(self, rows: dict[str, np.ndarray]) -> None:
        n = len(rows[Col.REWARD])
        sr = np.zeros((n, self.width), np.float32)
        sr[:, 0] = rows[Col.REWARD]
        rows[Col.STEP_REWARDS], rows[Col.CHUNK_STEPS] = sr, np.ones(n, np.int64)

    def add(self, cols: dict[str, np.ndarray], live: np.ndarray, closes: np.ndarray) -> dict[str, np.ndarray] | None:
        """Fold one step of every env (``cols`` rows in env order; ``live``: the env made a
        step) in; return the rows of the decisions that ``closes`` ends (None: none)."""
        if not np.array_equal(closes, live) or any(acc is not None for acc in self.open):
            return self._fold(cols, live, closes)
        # every stepping env's decision is this one step (per-step policies): no folding
        rows = {k: v[live] for k, v in cols.items()} if not live.all() else dict(cols)
        if not len(rows[Col.REWARD]):
            return None
        rows[Col.STEP] = self.seq[live].copy()
        self.seq[live] += 1
        if self.per_action:
            self._step_columns(rows)
        return rows

    def _fold(self, cols: dict[str, np.ndarray], live: np.ndarray, closes: np.ndarray) -> dict[str, np.ndarray] | None:
        out = []
        for i in np.flatnonzero(live):
            row = {k: v[i : i + 1] for k, v in cols.items()}
            acc = self.open[i]
            if acc is None:
                acc = {k: v.copy() for k, v in row.items()}
                if self.per_action:
                    self._step_columns(acc)
            else:
                for k, v in row.items():
                    if k.startswith(Col.NEXT_OBS + "/") or k in (Col.TERMINATED, Col.TRUNCATED):
                        acc[k] = v.copy()
                if self.per_action:
                    j = int(acc[Col.CHUNK_STEPS][0])
                    if j >= self.width:
                        raise ValueError(f"a chunk ran {j + 1} actions, more than the policy's {self.width}")
                    acc[Col.STEP_REWARDS][0, j] = row[Col.REWARD][0]
                    acc[Col.CHUNK_STEPS] = acc[Col.CHUNK_STEPS] + 1
                acc[Col.REWARD] = acc[Col.REWARD] + row[Col.REWARD]
                if Col.INTERVENTION in acc:
                    acc[Col.INTERVENTION] = acc[Col.INTERVENTION] | row[Col.INTERVENTION]
            if closes[i]:
                acc[Col.STEP] = np.array([self.seq[i]], dtype=np.int64)
                self.seq[i] += 1
                out.append(acc)
                acc = None
            self.open[i] = acc
        return self._stack(out)

    def close_all(self, truncate: bool = False) -> dict[str, np.ndarray] | None:
        """End every open decision (a synchronous round ends; its chunks are dropped).
        ``truncate``: the episodes themselves were cut short (an evaluation took the env),
        so each row ends its episode as truncated where it did not terminate."""
        out = []
        for i, acc in enumerate(self.open):
            if acc is not None:
                if truncate:
                    acc[Col.TRUNCATED] = np.maximum(acc[Col.TRUNCATED], 1 - acc[Col.TERMINATED])
                acc[Col.STEP] = np.array([self.seq[i]], dtype=np.int64)
                self.seq[i] += 1
                out.append(acc)
                self.open[i] = None
        return self._stack(out)

    @staticmethod
    def _stack(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
        if not rows:
            return None
        return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
