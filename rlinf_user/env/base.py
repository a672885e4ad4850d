"""Base class that enforces the env contract for every backend."""

from __future__ import annotations

import abc
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_user.env.contract import (
    ActionSpec,
    ContractError,
    action_space,
    check_action,
    instruction_space,
    observation_space,
)


class ContractEnv(gym.Env, abc.ABC):
    """A gymnasium env whose spaces, actions and step results follow the contract.

    Subclasses implement :meth:`_reset` and :meth:`_step` and set ``state_dim``,
    ``cameras`` (``{name: (H, W)}``) and ``action_spec`` before calling
    :meth:`_init_spaces`. The base class refuses NaN/Inf actions, clips to [-1, 1], counts
    steps and truncates at ``max_episode_steps``, and guarantees ``info["success"]``.
    """

    metadata = {"render_modes": ["rgb_array"]}
    action_spec: ActionSpec = ActionSpec()
    max_episode_steps: int = 100
    instructions: tuple[str, ...] = ()  # one is drawn per episode (set_instructions)
    instruction: str | None = None  # this episode's

    @classmethod
    def validate_config(cls, env_cfg) -> None:
        """Cheap checks of task names and options before anything is started (override)."""

    @classmethod
    def make_vector(cls, env_cfg, num_envs: int, seed: int):
        """A natively parallel batch of ``num_envs`` (GPU simulators), or None to step
        single envs with :class:`~rlinf_user.env.vector.EnvBatch`."""
        return None

    def _init_spaces(self, state_dim: int, cameras: dict[str, tuple[int, int]]) -> None:
        self.observation_space = observation_space(state_dim, cameras, instruction=bool(self.instructions))
        self.action_space = action_space()
        self._elapsed = 0

    def set_instructions(self, texts) -> None:
        """Language instructions for this env (``env.instruction``: one string or a list);
        each episode draws one (with the reset's seed) and every observation carries it."""
        texts = [texts] if isinstance(texts, str) else list(texts or ())
        space = instruction_space()
        bad = [t for t in texts if not isinstance(t, str) or not t or t not in space]
        if bad:
            raise ValueError(f"env.instruction: {bad[0]!r} is not 1-{space.max_length} printable characters")
        self.instructions = tuple(texts)
        space = self.observation_space
        self.observation_space = observation_space(
            space["state"].shape[0], {k: v.shape[:2] for k, v in space["images"].spaces.items()}, bool(texts)
        )

    def _with_instruction(self, obs: dict[str, Any]) -> dict[str, Any]:
        if self.instructions:
            obs["instruction"] = self.instruction
        return obs

    @abc.abstractmethod
    def _reset(self, seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]: ...

    @abc.abstractmethod
    def _step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Apply a checked action; return (obs, reward, terminated, info)."""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._elapsed = 0
        obs, info = self._reset(seed)
        if self.instructions:
            self.instruction = self.instructions[int(self.np_random.integers(len(self.instructions)))]
        obs = self._with_instruction(obs)
        self._check_obs(obs)
        info.setdefault("success", False)
        return obs, info

    def step(self, action):
        a = check_action(action)
        obs, reward, terminated, info = self._step(a)
        obs = self._with_instruction(obs)
        self._check_obs(obs)
        self._elapsed += 1
        # a backend may end an episode early without a terminal state (lost connection)
        cut = bool(info.pop("truncate", False))
        truncated = bool((cut or self._elapsed >= self.max_episode_steps) and not terminated)
        info.setdefault("success", False)
        info["success"] = bool(info["success"])
        reward = float(reward)
        if not np.isfinite(reward):
            raise ContractError(f"{type(self).__name__} produced a non-finite reward {reward}")
        return obs, reward, bool(terminated), truncated, info

    def _check_obs(self, obs: dict[str, Any]) -> None:
        if not np.all(np.isfinite(obs["state"])):
            raise ContractError(
                f"{type(self).__name__} produced NaN/Inf in observation['state']; "
                "the simulator state is corrupt, refusing to continue the episode"
            )
