"""ManiSkill's GPU-parallel envs behind the batched interface (:mod:`rlinf_user.env.vector`):
``num_envs`` envs in one PhysX CUDA scene, used by env workers when CUDA is present."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlinf_user.env.contract import ContractError, action_space, check_action, observation_space
from rlinf_user.env.vector import index_obs
from rlinf_user.sims.maniskill import (
    _np,
    _obs_mode,
    batch_contract_obs,
    inspect_base,
    make_maniskill,
    resolve_backends,
    split_info,
    to_maniskill_action,
)


class ManiSkillVectorEnv:
    """``num_envs`` ManiSkill envs simulated in parallel on the GPU (PhysX CUDA).

    Implements :class:`rlinf_user.env.vector.VectorEnv` on top of ManiSkill's own
    ``ManiSkillVectorEnv`` (same-step partial auto-reset): arrays come back as numpy with a
    leading batch axis; when env ``i`` finishes, ``infos[i]["final_obs"]`` holds its last
    observation and the batch holds the first observation of its next episode.
    """

    def __init__(
        self,
        task: str = "PickCube-v1",
        num_envs: int = 16,
        *,
        cameras: Sequence[str] = (),
        image_size: int = 128,
        reward: str = "dense",
        max_episode_steps: int = 50,
        sim_device: str = "auto",
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.num_envs = int(num_envs)
        self.cameras = tuple(cameras)
        self.max_episode_steps = int(max_episode_steps)
        sim, render = resolve_backends(sim_device, num_envs=self.num_envs)
        privileged = bool(kwargs.get("privileged_state", False))
        env = make_maniskill(
            task,
            num_envs=self.num_envs,
            obs_mode=_obs_mode(self.cameras, privileged),
            reward=reward,
            sim_backend=sim,
            render_backend=render,
            image_size=image_size if self.cameras else None,
            max_episode_steps=self.max_episode_steps,
            extra=kwargs,
        )
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv as _MSVectorEnv

        self._venv = _MSVectorEnv(env, auto_reset=True, ignore_terminations=False)
        self._base = self._venv.base_env
        self.action_spec, self._signs, self._dt, state_dim = inspect_base(self._base, self.cameras, self._venv.close)
        self._pending_seed = seed
        self.observation_space = observation_space(
            state_dim, {c: (image_size, image_size) for c in self.cameras}
        )
        self.action_space = action_space()

    @classmethod
    def from_config(cls, cfg: Any, num_envs: int, seed: int | None = None) -> ManiSkillVectorEnv:
        """Build from an ``EnvConfig`` (``seed`` is applied at the first :meth:`reset`)."""
        return cls(
            cfg.task,
            num_envs,
            cameras=list(cfg.cameras or ()),
            image_size=int(cfg.image_size),
            reward=cfg.reward,
            max_episode_steps=int(cfg.max_episode_steps),
            sim_device=cfg.sim_device,
            seed=seed,
            **dict(cfg.kwargs or {}),
        )

    def _obs(self, raw: Any, elapsed: Any) -> dict[str, Any]:
        stamps = _np(elapsed).astype(np.float64) * self._dt
        return batch_contract_obs(raw, self.cameras, stamps)

    def reset(self, seed: int | None = None, seeds: Sequence[int] | None = None) -> dict[str, Any]:
        if seeds is not None:  # one seed per env (ManiSkill takes a list)
            seed = [int(s) for s in seeds]
        elif seed is None:
            seed, self._pending_seed = self._pending_seed, None
        raw, _ = self._venv.reset(seed=seed)
        return self._obs(raw, self._base.elapsed_steps)

    def step(
        self, actions: np.ndarray, reset_seeds: Sequence[int | None] | None = None
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        import torch

        if reset_seeds is not None:
            raise ContractError(
                "per-env reset seeds (GRPO's groups) are not supported by ManiSkill's GPU-parallel auto-reset; "
                "run GRPO with env.sim_device=cpu"
            )
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, 7):
            raise ContractError(
                f"actions must have shape ({self.num_envs}, 7), got {actions.shape}"
            )
        checked = np.stack([check_action(a) for a in actions])
        native = to_maniskill_action(checked, self._signs)
        act = torch.as_tensor(native, device=self._base.device)
        raw, reward, terminated, truncated, infos = self._venv.step(act)
        # After an auto-reset ``infos`` describes the new episodes; the step's own info
        # (success, elapsed_steps ...) is kept in ``final_info``.
        step_info = infos.get("final_info", infos)
        per_env = split_info(step_info, self.num_envs)
        success = np.array([d["success"] for d in per_env], dtype=bool)
        term = _np(terminated).astype(bool).reshape(-1) | success
        trunc = _np(truncated).astype(bool).reshape(-1) & ~term
        obs = self._obs(raw, self._base.elapsed_steps)
        if "final_observation" in infos:
            done = _np(infos["_final_info"]).astype(bool).reshape(-1)
            final = self._obs(infos["final_observation"], step_info["elapsed_steps"])
            for i in np.flatnonzero(done):
                per_env[i]["final_obs"] = index_obs(final, int(i))
        rewards = _np(reward).astype(np.float32).reshape(-1)
        if not np.all(np.isfinite(rewards)) or not np.all(np.isfinite(obs["state"])):
            raise ContractError("ManiSkill produced a non-finite reward or state")
        return obs, rewards, term, trunc, per_env

    def end_episode(self, i: int) -> dict[str, Any]:
        """Reset env ``i`` alone (a learned reward said success); its new first observation."""
        import torch

        raw, _ = self._venv.reset(options={"env_idx": torch.tensor([int(i)], device=self._base.device)})
        return index_obs(self._obs(raw, self._base.elapsed_steps), int(i))

    def close(self) -> None:
        venv, self._venv = getattr(self, "_venv", None), None
        if venv is not None:
            venv.close()
