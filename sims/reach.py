"""``reach``: a kinematic end-effector reach task in pure NumPy (no physics engine).

The smallest task behind the env contract: a tool-centre point moves inside a 40 x 40 x 30
cm workspace box by the contract's translation deltas (``max_translation`` metres per step
at ``|a| = 1``, rotation and gripper inactive) and must come within ``success_radius`` of a
goal drawn uniformly per episode. It steps in microseconds, so a learning run through the
whole runtime (Ray env workers, learner, weight sync, evaluation) takes seconds to minutes
on a CPU: the quick check of a config, an algorithm or a cluster before a long run, and the
easy task CI learns on. It says nothing about manipulation; the ManiSkill, gym_hil and
robosuite backends are the tasks that do.

Observation ``state`` (9): TCP position, goal position, goal - TCP (metres). Reward
``dense``: ``1 - tanh(10 * distance)``; ``sparse``: success as 0/1. Success terminates.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_user.env.base import ContractEnv
from rlinf_user.env.contract import ActionSpec, make_observation

TASKS = ("Reach",)
LOW = np.array([0.3, -0.2, 0.05])
HIGH = np.array([0.7, 0.2, 0.35])
KWARGS = ("max_translation", "success_radius")


class ReachEnv(ContractEnv):
    """Move the TCP to a goal drawn per episode (see the module docstring)."""

    def __init__(
        self,
        task: str = "Reach",
        *,
        reward: str = "dense",
        max_episode_steps: int = 50,
        control_hz: float = 10.0,
        seed: int | None = None,
        max_translation: float = 0.02,
        success_radius: float = 0.03,
        cameras=(),
    ) -> None:
        self.validate(task, reward, cameras)
        self.task = task
        self.reward_mode = reward
        self.max_episode_steps = int(max_episode_steps)
        self.cameras = ()
        self._dt = 1.0 / float(control_hz)
        self._radius = float(success_radius)
        self.action_spec = ActionSpec(
            frame="base",
            max_translation=float(max_translation),
            max_rotation=0.0,
            active=(True, True, True, False, False, False, False),
        )
        self._pending_seed = seed
        self._tcp = (LOW + HIGH) / 2
        self._goal = self._tcp.copy()
        self._time = 0.0
        self._init_spaces(9, {})

    @staticmethod
    def validate(task: str, reward: str, cameras=()) -> None:
        if task not in TASKS:
            raise ValueError(f"reach task {task!r} is not supported; supported: {', '.join(TASKS)}")
        if reward not in ("dense", "sparse"):
            raise ValueError(f"env.reward must be dense or sparse, got {reward!r}")
        if list(cameras or ()):
            raise ValueError("the reach sim has no cameras (env.cameras must be empty)")

    @classmethod
    def validate_config(cls, cfg: Any) -> None:
        cls.validate(cfg.task, cfg.reward, cfg.cameras)
        unknown = sorted(set(cfg.kwargs or {}) - set(KWARGS))
        if unknown:
            raise ValueError(f"env.kwargs {unknown} are not reach options; it takes {', '.join(KWARGS)}")

    @classmethod
    def from_config(cls, cfg: Any, seed: int | None = None) -> ReachEnv:
        return cls(
            cfg.task,
            reward=cfg.reward,
            max_episode_steps=int(cfg.max_episode_steps),
            control_hz=float(cfg.control_hz),
            seed=seed,
            cameras=list(cfg.cameras or ()),
            **dict(cfg.kwargs or {}),
        )

    @property
    def tcp(self) -> np.ndarray:
        """The TCP position (metres, base frame)."""
        return self._tcp.copy()

    def _observation(self) -> dict[str, Any]:
        state = np.concatenate([self._tcp, self._goal, self._goal - self._tcp])
        return make_observation(state, stamp=self._time)

    def _distance(self) -> float:
        return float(np.linalg.norm(self._goal - self._tcp))

    def _reset(self, seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
            gym.Env.reset(self, seed=seed)  # the contract's per-episode draws use this stream too
        self._pending_seed = None
        rng = self.np_random
        self._tcp = rng.uniform(LOW, HIGH)
        self._goal = rng.uniform(LOW, HIGH)
        self._time = 0.0
        return self._observation(), {"success": False, "distance": self._distance()}

    def _step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        delta = action[:3].astype(np.float64) * self.action_spec.max_translation
        self._tcp = np.clip(self._tcp + delta, LOW, HIGH)
        self._time += self._dt
        dist = self._distance()
        success = dist < self._radius
        reward = float(success) if self.reward_mode == "sparse" else 1.0 - float(np.tanh(10.0 * dist))
        return self._observation(), reward, success, {"success": success, "distance": dist}
