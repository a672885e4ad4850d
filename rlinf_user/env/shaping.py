"""Env-level reward shaping, applied in one place: every batched env a training run steps
(:func:`rlinf_user.env.registry.make_vector_env`: lists of single envs and GPU-parallel
simulators alike) is wrapped by :class:`ShapedVectorEnv`, and every single env whose
rewards are recorded (``teleop``, ``hg-dagger``: a dataset's ``next.reward``) by
:class:`ShapedEnv`, so that a demonstration's rewards are the ones its training run sees.

``success_bonus``: reward added on a step that ends the episode in success. With a dense
reward and success terminating the episode, a learner otherwise prefers to hover just
short of success and keep collecting reward; about ``r_max / (1 - gamma)`` removes that
incentive.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def success_bonus(rewards: np.ndarray, terminated: np.ndarray, infos: Sequence[dict], bonus: float) -> np.ndarray:
    """``rewards`` plus ``bonus`` where the step terminated in success."""
    if not bonus:
        return rewards
    success = np.array([bool(i.get("success", False)) for i in infos])
    return (np.asarray(rewards, np.float32) + np.float32(bonus) * (np.asarray(terminated, bool) & success)).astype(np.float32)


class ShapedVectorEnv:
    """A batched env (:class:`rlinf_user.env.vector.VectorEnv`) with the run's shaping."""

    def __init__(self, venv, bonus: float = 0.0):
        self.venv = venv
        self.bonus = float(bonus)

    def step(self, actions: np.ndarray, reset_seeds: Sequence[int | None] | None = None, **kw):
        obs, rewards, terms, truncs, infos = self.venv.step(actions, reset_seeds=reset_seeds, **kw)
        return obs, success_bonus(rewards, terms, infos, self.bonus), terms, truncs, infos

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped env's
        return getattr(self.venv, name)


class ShapedEnv:
    """One contract env with the run's shaping (what a recorded dataset's rewards follow)."""

    def __init__(self, env, bonus: float = 0.0):
        self.env = env
        self.bonus = float(bonus)

    def step(self, action, **kw):
        obs, reward, terminated, truncated, info = self.env.step(action, **kw)
        reward = float(success_bonus(np.array([reward]), np.array([terminated]), [info], self.bonus)[0])
        return obs, reward, terminated, truncated, info

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped env's
        return getattr(self.env, name)
