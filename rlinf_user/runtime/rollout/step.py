"""One step of a worker's envs as it travels through the rollout stages, and the
interface of the hooks that act around ``envs.step``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Step:
    obs: dict[str, Any]  # what the policy saw (the learner's layout; frame features in place of frames)
    actions: np.ndarray  # (N, contract dims): what the envs are sent
    extras: dict[str, np.ndarray]  # the policy's per-row outputs (log-prob, value, sample)
    version: int  # the policy version that acted
    random: bool  # uniformly random actions (before learning starts)
    intervention: np.ndarray  # (N,) a person's action replaced the policy's
    reset_seeds: list[int] | None = None  # each env's seed should its episode end now
    group: np.ndarray | None = None  # each env's episode group (GRPO)
    active: np.ndarray | None = None  # (N,) envs stepped (a held env is not); None: all
    next_obs: dict[str, Any] = field(default_factory=dict)
    reward: np.ndarray | None = None
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None
    infos: list[dict[str, Any]] = field(default_factory=list)

    @property
    def live(self) -> np.ndarray:
        return np.ones(len(self.actions), dtype=bool) if self.active is None else self.active

    @property
    def done(self) -> np.ndarray:
        return np.asarray(self.terminated, bool) | np.asarray(self.truncated, bool)


class StepHook:
    """Acts around ``envs.step``: :meth:`before` may change the actions, flag
    interventions, pick reset seeds and hold envs; :meth:`after` may change rewards and
    episode ends. :meth:`episode_record` adds to an ended episode's statistics."""

    def before(self, step: Step) -> None:
        pass

    def after(self, step: Step) -> None:
        pass

    def episode_record(self, i: int) -> dict[str, Any]:
        return {}

    def restart(self) -> None:
        """The episodes in progress were cut short (an evaluation ran on these envs)."""

    def close(self) -> None:
        pass
