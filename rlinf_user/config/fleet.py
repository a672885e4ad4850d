"""A run's fleet members: several robots and simulators feeding one learner.

A *member* is one robot (behind its edge daemon) or simulator setup: its own ``env``
overrides, its worker count, and the Ray resources that pin its workers to the node that
reaches it (``{"franka_left": 1}``, offered by that robot PC with ``ray start
--resources``). Without a ``fleet`` the run's ``env`` is the one member. How their
observations and actions meet in one policy is :mod:`rlinf_user.runtime.rollout.fleet`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf


@dataclass
class Member:
    name: str
    index: int
    env: Any  # the member's resolved EnvConfig
    resources: dict[str, float]
    workers: int
    envs_per_worker: int
    num_cpus: float


def members(cfg) -> list[Member]:
    """The fleet's members; without ``fleet``, the run's env on ``placement.num_env_workers``."""
    if not cfg.fleet:
        res = dict(cfg.placement.env_worker.resources or {})
        return [
            Member(
                "env", 0, cfg.env, {k: float(v) for k, v in res.items()}, int(cfg.placement.num_env_workers),
                int(cfg.placement.envs_per_worker), float(cfg.placement.env_worker.num_cpus),
            )  # fmt: skip
        ]
    out, seen = [], set()
    for i, m in enumerate(cfg.fleet):
        if m.name in seen:
            raise ValueError(f"fleet: two members are named {m.name!r}")
        seen.add(m.name)
        try:
            env = OmegaConf.merge(cfg.env, m.env or {})
        except Exception as err:  # noqa: BLE001 - omegaconf raises several kinds
            raise ValueError(f"fleet member {m.name!r}: bad env override: {err}") from err
        if int(m.workers) < 1 or int(m.envs_per_worker) < 1:
            raise ValueError(f"fleet member {m.name!r}: workers and envs_per_worker must be >= 1")
        out.append(
            Member(
                str(m.name), i, env, {k: float(v) for k, v in dict(m.resources or {}).items()}, int(m.workers),
                int(m.envs_per_worker), float(m.num_cpus),
            )  # fmt: skip
        )
    return out


def wants_member_id(cfg, ms: list[Member]) -> bool:
    if cfg.get("fleet_member_id") is not None:
        return bool(cfg.fleet_member_id)
    if len(ms) < 2:
        return False

    def key(env) -> dict:
        d = OmegaConf.to_container(env, resolve=True)
        d.pop("edge", None)  # another robot of the same kind is the same embodiment
        return d

    first = key(ms[0].env)
    return any(key(m.env) != first for m in ms[1:])
