"""On-policy data: ordered rollout segments -> advantages.

Env workers send chunks of transitions (see :class:`rlinf_user.env.spec.Col`), each row
carrying its env (``env_id``), its place in that env's step sequence (``step``) and the
policy version, log-prob and value that produced it. The store orders rows per env by
``step`` and computes advantages:

* **GAE** (PPO): never across an episode boundary, nor across a gap in an env's step
  sequence (a lost or out-of-order chunk); a truncated episode, and the last row an env
  has so far, bootstrap from the value of their next observation (``value_fn``); a
  terminated one from zero.
* **Group-normalised returns** (GRPO): an episode is released when it ends; episodes of
  the same ``group`` (started from one reset seed) are normalised together once
  ``group_size`` of them have ended. ``baseline="episode"``: every step gets its
  episode's normalised return. ``baseline="step"``: step t gets its reward-to-go minus the
  mean reward-to-go at t of the group's other episodes (0 past an episode's end), so an
  action is credited only with what follows it; still no critic, and the baseline never
  depends on the episode's own actions (leave-one-out).

Rows from a policy more than ``max_lag`` versions behind the learner are dropped.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from rlinf_user.env.spec import Col

log = logging.getLogger(__name__)

ValueFn = Callable[[dict[str, np.ndarray]], np.ndarray]


def _concat(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(chunks) == 1:
        return dict(chunks[0])
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def _rows(cols: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[idx] for k, v in cols.items()}


def next_obs_columns(cols: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    """The ``next_obs/...`` columns of rows ``idx``, renamed ``obs/...`` (for a value pass)."""
    prefix = Col.NEXT_OBS + "/"
    return {Col.OBS + "/" + k[len(prefix) :]: v[idx] for k, v in cols.items() if k.startswith(prefix)}


def gae(cols: dict[str, np.ndarray], value_fn: ValueFn, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns for rows already sorted by (env, step)."""
    n = len(cols[Col.REWARD])
    env, step = cols[Col.ENV_ID], cols[Col.STEP]
    term = cols[Col.TERMINATED].astype(bool)
    done = term | cols[Col.TRUNCATED].astype(bool)
    value = cols[Col.VALUE].astype(np.float64)
    follows = np.zeros(n, bool)  # the next row is this env's next step
    follows[:-1] = (env[1:] == env[:-1]) & (step[1:] == step[:-1] + 1)
    cont = follows & ~done
    next_value = np.zeros(n)
    next_value[:-1] = value[1:]
    boot = ~term & ~cont  # truncated, or the last row of a run: V(next observation)
    if boot.any():
        next_value[boot] = value_fn(next_obs_columns(cols, np.flatnonzero(boot)))
    next_value[term] = 0.0
    delta = cols[Col.REWARD].astype(np.float64) + gamma * next_value - value
    adv = np.zeros(n)
    last = 0.0
    for i in range(n - 1, -1, -1):
        last = delta[i] + gamma * lam * (last if cont[i] else 0.0)
        adv[i] = last
    return adv.astype(np.float32), (adv + value).astype(np.float32)


def gae_actions(cols: dict[str, np.ndarray], value_fn: ValueFn, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Action-level GAE for rows sorted by (env, step) that each hold a chunk: action ``k``
    of a row (``k < chunk_steps``) has reward ``step_rewards[:, k]`` and value
    ``value[:, k]`` (the value head's ``k``-th output, from the chunk's observation); GAE
    runs over the env's sequence of single actions, chunk after chunk, with the same
    episode and gap rules as :func:`gae`. Advantages and returns are (rows, H), zero past
    the actions that ran."""
    r = cols[Col.STEP_REWARDS].astype(np.float64)
    n, h = r.shape
    value = cols[Col.VALUE].astype(np.float64).reshape(n, -1)
    if value.shape[1] != h:
        raise ValueError(f"action-level credit: {value.shape[1]} values per row for chunks of {h} actions")
    ran = cols[Col.CHUNK_STEPS].astype(np.int64)
    env, step = cols[Col.ENV_ID], cols[Col.STEP]
    term = cols[Col.TERMINATED].astype(bool)
    done = term | cols[Col.TRUNCATED].astype(bool)
    follows = np.zeros(n, bool)
    follows[:-1] = (env[1:] == env[:-1]) & (step[1:] == step[:-1] + 1)
    cont = follows & ~done
    after = np.zeros(n)  # the value after a row's last action: the next chunk's first value
    after[:-1] = value[1:, 0]
    boot = ~term & ~cont
    if boot.any():
        after[boot] = np.asarray(value_fn(next_obs_columns(cols, np.flatnonzero(boot)))).reshape(int(boot.sum()), -1)[:, 0]
    after[term] = 0.0
    adv = np.zeros((n, h))
    carry_next = 0.0  # the advantage of the next row's first action
    for i in range(n - 1, -1, -1):
        carry = carry_next if cont[i] else 0.0
        nv = after[i]
        for k in range(int(ran[i]) - 1, -1, -1):
            carry = r[i, k] + gamma * nv - value[i, k] + gamma * lam * carry
            adv[i, k] = carry
            nv = value[i, k]
        carry_next = carry
    ret = np.where(np.arange(h)[None] < ran[:, None], adv + value, 0.0)
    return adv.astype(np.float32), ret.astype(np.float32)


class OnPolicyStore:
    def __init__(self, gamma: float, lam: float, group_size: int | None = None, reward_scale: float = 1.0,
                 baseline: str = "episode"):  # fmt: skip
        if baseline not in ("episode", "step"):
            raise ValueError(f"baseline={baseline!r}: expected 'episode' or 'step'")
        self.gamma, self.lam = float(gamma), float(lam)
        self.group_size = int(group_size) if group_size else None
        self.baseline = baseline
        self.reward_scale = float(reward_scale)
        self.chunks: list[dict[str, np.ndarray]] = []
        self.dropped_stale = 0
        # the learner stores chunks from its sink's calls while its training loop takes them:
        # a chunk appended while take() concatenates would join some columns and not others
        self._lock = threading.RLock()
        # GRPO: rows of episodes in progress, per env; ended episodes per group
        self._open: dict[int, list[dict[str, np.ndarray]]] = defaultdict(list)
        self._groups: dict[int, list[tuple[dict[str, np.ndarray], float]]] = defaultdict(list)

    def add(self, chunk: dict[str, np.ndarray]) -> int:
        with self._lock:
            return self._add(chunk)

    def _add(self, chunk: dict[str, np.ndarray]) -> int:
        missing = [c for c in (Col.ENV_ID, Col.STEP, Col.LOG_PROB, Col.SAMPLE, Col.POLICY_VERSION) if c not in chunk]
        if self.group_size is None and Col.VALUE not in chunk:
            missing.append(Col.VALUE)
        if self.group_size is not None and Col.GROUP not in chunk:
            missing.append(Col.GROUP)
        if missing:
            raise ValueError(f"an on-policy chunk lacks {missing} (was it collected by an on-policy env worker?)")
        n = len(chunk[Col.REWARD])
        if self.group_size is None:
            self.chunks.append(chunk)
        else:
            self._add_episodes(chunk)
        return n

    def rows(self) -> int:
        """Rows ready for an update."""
        with self._lock:
            return self._rows_ready()

    def _rows_ready(self) -> int:
        if self.group_size is None:
            return int(sum(len(c[Col.REWARD]) for c in self.chunks))
        return int(sum(len(ep[Col.REWARD]) for g in self._ready_groups() for ep, _ in self._groups[g]))

    def _fresh(self, cols: dict[str, np.ndarray], version: int, max_lag: int | None) -> dict[str, np.ndarray]:
        if max_lag is None:
            return cols
        keep = cols[Col.POLICY_VERSION] >= version - int(max_lag)
        if not keep.all():
            self.dropped_stale += int((~keep).sum())
            cols = _rows(cols, np.flatnonzero(keep))
        return cols

    def take(self, value_fn: ValueFn, version: int, max_lag: int | None = None) -> dict[str, np.ndarray] | None:
        """Every ready row with ``advantage`` and ``return`` columns (None: nothing ready)."""
        with self._lock:
            if self.group_size is not None:
                return self._take_groups(version, max_lag)
            chunks, self.chunks = self.chunks, []
            if not chunks:
                return None
            cols = self._fresh(_concat(chunks), version, max_lag)
        if len(cols[Col.REWARD]) == 0:
            return None
        cols = _rows(cols, np.lexsort((cols[Col.STEP], cols[Col.ENV_ID])))
        if self.reward_scale != 1.0:
            cols[Col.REWARD] = cols[Col.REWARD] * self.reward_scale
            if Col.STEP_REWARDS in cols:
                cols[Col.STEP_REWARDS] = cols[Col.STEP_REWARDS] * self.reward_scale
        credit = gae_actions if Col.STEP_REWARDS in cols else gae
        cols[Col.ADVANTAGE], cols[Col.RETURN] = credit(cols, value_fn, self.gamma, self.lam)
        return cols

    # -- GRPO ------------------------------------------------------------------------------
    def _add_episodes(self, chunk: dict[str, np.ndarray]) -> None:
        order = np.lexsort((chunk[Col.STEP], chunk[Col.ENV_ID]))
        chunk = _rows(chunk, order)
        done = chunk[Col.TERMINATED].astype(bool) | chunk[Col.TRUNCATED].astype(bool)
        for env in np.unique(chunk[Col.ENV_ID]):
            idx = np.flatnonzero(chunk[Col.ENV_ID] == env)
            start = 0
            for end in np.flatnonzero(done[idx]):
                self._open[int(env)].append(_rows(chunk, idx[start : end + 1]))
                self._close_episode(int(env))
                start = end + 1
            if start < len(idx):
                self._open[int(env)].append(_rows(chunk, idx[start:]))

    def _close_episode(self, env: int) -> None:
        ep = _concat(self._open.pop(env))
        steps = ep[Col.STEP]
        groups = np.unique(ep[Col.GROUP])
        if len(groups) != 1 or (len(steps) > 1 and np.any(np.diff(steps) != 1)):
            log.warning("GRPO: dropped an episode of env %d with a gap in its steps or two groups", env)
            return
        self._groups[int(groups[0])].append((ep, float(ep[Col.REWARD].sum()) * self.reward_scale))

    def _ready_groups(self) -> list[int]:
        return [g for g, eps in self._groups.items() if len(eps) >= self.group_size]

    def _take_groups(self, version: int, max_lag: int | None) -> dict[str, np.ndarray] | None:
        parts = []
        for g in self._ready_groups():
            eps = self._groups.pop(g)[: self.group_size]
            advantages = self._step_advantages(eps) if self.baseline == "step" else self._episode_advantages(eps)
            for (ep, r), adv in zip(eps, advantages):
                n = len(ep[Col.REWARD])
                parts.append({**ep, Col.ADVANTAGE: adv, Col.RETURN: np.full(n, r, np.float32)})
        if not parts:
            return None
        cols = self._fresh(_concat(parts), version, max_lag)
        return cols if len(cols[Col.REWARD]) else None

    @staticmethod
    def _episode_advantages(eps: list[tuple[dict[str, np.ndarray], float]]) -> list[np.ndarray]:
        returns = np.array([r for _, r in eps])
        std = returns.std()
        adv = (returns - returns.mean()) / (std + 1e-8) if std > 1e-8 else np.zeros_like(returns)
        return [np.full(len(ep[Col.REWARD]), a, np.float32) for (ep, _), a in zip(eps, adv)]

    def _step_advantages(self, eps: list[tuple[dict[str, np.ndarray], float]]) -> list[np.ndarray]:
        lengths = [len(ep[Col.REWARD]) for ep, _ in eps]
        togo = np.zeros((len(eps), max(lengths)))  # reward-to-go; 0 past an episode's end
        for i, (ep, _) in enumerate(eps):
            acc = 0.0
            rewards = ep[Col.REWARD].astype(np.float64) * self.reward_scale
            for t in range(lengths[i] - 1, -1, -1):
                acc = rewards[t] + self.gamma * acc
                togo[i, t] = acc
        others = (togo.sum(axis=0, keepdims=True) - togo) / max(len(eps) - 1, 1)
        resid = [(togo[i] - others[i])[: lengths[i]] for i in range(len(eps))]
        std = np.concatenate(resid).std()
        if std <= 1e-8:
            return [np.zeros(n, np.float32) for n in lengths]
        return [(r / std).astype(np.float32) for r in resid]

    def pending_groups(self) -> int:
        return len(self._groups)
