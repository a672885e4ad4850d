"""Placement: which process and which resources each role gets.

Roles: ``env_worker`` (x N), ``eval_worker``, ``learner``, ``replay``, ``weights``.

* ``collocated``: the replay buffer lives inside the learner process (no RPC per
  sample); learner and rollout share the machine's devices (fractional GPUs when present).
* ``disaggregated``: every role is its own Ray actor with its own resources, so roles can
  be moved to separate devices or nodes (a robot PC, a GPU box) by resources alone.

Custom resources such as ``{"franka": 1}`` in ``placement.env_worker.resources`` pin env
workers to the node that offers them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

MODES = ("collocated", "disaggregated")


@dataclass
class RolePlan:
    num_cpus: float
    num_gpus: float
    resources: dict[str, float]
    max_concurrency: int = 1

    def actor_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            opts["resources"] = dict(self.resources)
        if self.max_concurrency > 1:
            opts["max_concurrency"] = self.max_concurrency
        return opts


@dataclass
class Plan:
    mode: str
    learner: RolePlan
    env_worker: RolePlan
    replay: RolePlan | None  # None: inside the learner
    weights: RolePlan
    num_env_workers: int

    def total_cpus(self) -> float:
        cpus = self.learner.num_cpus + self.weights.num_cpus
        cpus += self.env_worker.num_cpus * (self.num_env_workers + 1)  # + eval worker
        if self.replay is not None:
            cpus += self.replay.num_cpus
        return cpus


def _role(res, max_concurrency: int = 1) -> RolePlan:
    return RolePlan(float(res.num_cpus), float(res.num_gpus), dict(res.resources or {}), max_concurrency)


def make_plan(placement_cfg, gpu_available: bool) -> Plan:
    mode = placement_cfg.mode
    if mode not in MODES:
        raise ValueError(f"placement.mode must be one of {MODES}, got {mode!r}")
    learner = _role(placement_cfg.learner, max_concurrency=4)
    env_worker = _role(placement_cfg.env_worker)
    if not gpu_available:
        learner.num_gpus = 0.0
        env_worker.num_gpus = 0.0
    elif mode == "collocated" and learner.num_gpus == 0:
        # share the device: learner takes most, rollout workers a slice each
        learner.num_gpus = 0.5
        env_worker.num_gpus = 0.5 / max(1, placement_cfg.num_env_workers + 1)
    replay = None
    if mode == "disaggregated":
        replay = _role(placement_cfg.buffer, max_concurrency=4)
        replay.num_gpus = 0.0
    weights = RolePlan(0.1, 0.0, {})
    return Plan(mode, learner, env_worker, replay, weights, int(placement_cfg.num_env_workers))


def ray_init_kwargs(placement_cfg, plan: Plan) -> dict[str, Any]:
    """Arguments for ``ray.init``: join a cluster when an address is given, else start a
    local runtime sized so every role fits (logical CPUs may exceed physical cores)."""
    if placement_cfg.ray_address:
        return {"address": placement_cfg.ray_address}
    cpus = max(os.cpu_count() or 1, int(plan.total_cpus() + 0.999))
    kwargs: dict[str, Any] = {"num_cpus": cpus, "include_dashboard": False, "log_to_driver": True}
    # One machine that reaches the robot(s) itself offers them as resources, e.g.
    # {"franka": 1}; on a cluster the node that reaches a robot registers it.
    if plan.env_worker.resources:
        kwargs["resources"] = {k: float(v) for k, v in plan.env_worker.resources.items()}
    return kwargs
