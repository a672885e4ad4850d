"""Batched stepping with same-step auto-reset, the shape env workers consume.

A real robot is one :class:`~rlinf_user.env.base.ContractEnv`; simulators can be many.
:class:`EnvBatch` steps a list of single envs; GPU simulators (ManiSkill on CUDA) provide
their own batched implementation with the same methods.

Batched observations are the contract dict with a leading batch axis on every array.
When an env finishes, ``step`` returns its *final* observation in
``infos[i]["final_obs"]`` and the first observation of the next episode in the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from rlinf_user.env.base import ContractEnv
from rlinf_user.env.spec import index_obs, stack_obs  # noqa: F401 - batches are the spec module's


class VectorEnv(Protocol):
    num_envs: int
    observation_space: Any  # the single-env contract space
    action_space: Any

    def reset(self, seed: int | None = None, seeds: Sequence[int | None] | None = None) -> dict[str, Any]: ...

    def step(
        self, actions: np.ndarray, reset_seeds: Sequence[int | None] | None = None
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]: ...

    def end_episode(self, i: int) -> dict[str, Any]:
        """End env ``i``'s episode now (a learned reward said success): reset it and
        return its new first observation."""
        ...

    def close(self) -> None: ...


class EnvBatch:
    """Steps ``len(envs)`` contract envs in lock-step with same-step auto-reset."""

    can_hold = True  # step(active=...) leaves inactive envs untouched

    def __init__(self, env_fns: Sequence[Callable[[], ContractEnv]]):
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self._last: list[dict[str, Any]] = []

    def reset(self, seed: int | None = None, seeds: Sequence[int | None] | None = None) -> dict[str, Any]:
        """Reset every env: env ``i`` with ``seeds[i]`` when given, else ``seed + 1000 i``."""
        obs = []
        for i, env in enumerate(self.envs):
            s = seeds[i] if seeds is not None else (None if seed is None else seed + 1000 * i)
            o, _ = env.reset(seed=s)
            obs.append(o)
        self._last = obs
        return stack_obs(obs)

    def step(self, actions: np.ndarray, reset_seeds: Sequence[int | None] | None = None, active=None):
        """``reset_seeds[i]``: the seed env ``i`` resets with if its episode ends now.
        ``active[i]`` False: env ``i`` is not stepped (it keeps its observation, reward 0,
        no end, ``info["held"]``): GRPO holds an env whose group is still running."""
        obs, rews, terms, truncs, infos = [], [], [], [], []
        for i, env in enumerate(self.envs):
            if active is not None and not active[i]:
                obs.append(self._last[i])
                rews.append(0.0)
                terms.append(False)
                truncs.append(False)
                infos.append({"success": False, "held": True})
                continue
            o, r, te, tr, info = env.step(actions[i])
            if te or tr:
                info = dict(info)
                info["final_obs"] = o
                o, _ = env.reset(seed=None if reset_seeds is None else reset_seeds[i])
            obs.append(o)
            rews.append(r)
            terms.append(te)
            truncs.append(tr)
            infos.append(info)
        self._last = obs
        return (
            stack_obs(obs),
            np.asarray(rews, dtype=np.float32),
            np.asarray(terms, dtype=bool),
            np.asarray(truncs, dtype=bool),
            infos,
        )

    def end_episode(self, i: int) -> dict[str, Any]:
        obs, _ = self.envs[i].reset()
        self._last[i] = obs
        return obs

    def close(self) -> None:
        for env in self.envs:
            env.close()
