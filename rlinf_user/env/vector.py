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


def stack_obs(obs_list: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "state": np.stack([o["state"] for o in obs_list]),
        "images": {k: np.stack([o["images"][k] for o in obs_list]) for k in obs_list[0]["images"]},
        "timestamps": {
            k: np.stack([o["timestamps"][k] for o in obs_list]) for k in obs_list[0]["timestamps"]
        },
    }


def index_obs(obs: dict[str, Any], i: int) -> dict[str, Any]:
    return {
        "state": obs["state"][i],
        "images": {k: v[i] for k, v in obs["images"].items()},
        "timestamps": {k: v[i] for k, v in obs["timestamps"].items()},
    }


class VectorEnv(Protocol):
    num_envs: int
    observation_space: Any  # the single-env contract space
    action_space: Any

    def reset(self, seed: int | None = None) -> dict[str, Any]: ...

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]: ...

    def end_episode(self, i: int) -> dict[str, Any]:
        """End env ``i``'s episode now (a learned reward said success): reset it and
        return its new first observation."""
        ...

    def close(self) -> None: ...


class EnvBatch:
    """Steps ``len(envs)`` contract envs in lock-step with same-step auto-reset."""

    def __init__(self, env_fns: Sequence[Callable[[], ContractEnv]]):
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self._seed: int | None = None
        self._episodes = 0

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self._seed = seed
        obs = []
        for i, env in enumerate(self.envs):
            o, _ = env.reset(seed=None if seed is None else seed + 1000 * i)
            obs.append(o)
        return stack_obs(obs)

    def step(self, actions: np.ndarray):
        obs, rews, terms, truncs, infos = [], [], [], [], []
        for i, env in enumerate(self.envs):
            o, r, te, tr, info = env.step(actions[i])
            if te or tr:
                info = dict(info)
                info["final_obs"] = o
                self._episodes += 1
                o, _ = env.reset()
            obs.append(o)
            rews.append(r)
            terms.append(te)
            truncs.append(tr)
            infos.append(info)
        return (
            stack_obs(obs),
            np.asarray(rews, dtype=np.float32),
            np.asarray(terms, dtype=bool),
            np.asarray(truncs, dtype=bool),
            infos,
        )

    def end_episode(self, i: int) -> dict[str, Any]:
        self._episodes += 1
        obs, _ = self.envs[i].reset()
        return obs

    def close(self) -> None:
        for env in self.envs:
            env.close()
