"""Placement: which process and which resources each role gets.

Roles: ``env_worker`` (x N), ``eval_worker``, ``learner``, ``replay``, ``weights`` and,
with ``placement.rollout.enabled``, ``rollout`` (one policy-inference server that every
env worker's steps go through, batched; see :mod:`rlinf_user.runtime.serving.rollout_server`).

* ``collocated``: the replay buffer lives inside the learner process (no RPC per
  sample); learner and rollout share the machine's devices (fractional GPUs when present).
* ``disaggregated``: every role is its own Ray actor with its own resources, so roles can
  be moved to separate devices or nodes (a robot PC, a GPU box) by resources alone.

Custom resources such as ``{"franka": 1}`` in ``placement.env_worker.resources`` pin env
workers to the node that offers them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from rlinf_user.runtime.ray_session import lean_local_node, start_ray  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

MODES = ("collocated", "disaggregated")
GROUP_SHARE = 0.01  # what a role asks of its group's resource: up to 100 roles per node


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
    eval_worker: RolePlan | None = None
    groups: dict[str, dict[str, float]] | None = None
    rollout: RolePlan | None = None  # None: every env worker runs the policy itself
    reward: RolePlan | None = None  # where a reward classifier would run (used with reward.classifier)
    learner_replicas: int = 1  # data-parallel copies of the learner role (each asks for its resources)

    def total_cpus(self) -> float:
        cpus = self.learner.num_cpus * self.learner_replicas + self.weights.num_cpus
        if self.rollout is not None:
            cpus += self.rollout.num_cpus
        if self.reward is not None:
            cpus += self.reward.num_cpus
        cpus += self.env_worker.num_cpus * (self.num_env_workers + 1)  # + eval worker
        if self.replay is not None:
            cpus += self.replay.num_cpus
        return cpus


def _role(res, max_concurrency: int = 1, groups: dict | None = None) -> RolePlan:
    resources = {k: float(v) for k, v in dict(res.resources or {}).items()}
    group = res.get("group") if hasattr(res, "get") else getattr(res, "group", None)
    if group:
        if group not in (groups or {}):
            raise ValueError(f"placement: group {group!r} is not in placement.groups ({', '.join(groups or {}) or 'none'})")
        # membership, not consumption: many roles may share a group's node
        resources.update({k: GROUP_SHARE for k in groups[group]})
    return RolePlan(float(res.num_cpus), float(res.num_gpus), resources, max_concurrency)


def make_plan(placement_cfg, gpu_available: bool) -> Plan:
    mode = placement_cfg.mode
    if mode == "auto":
        raise ValueError("placement=auto is chosen when `rlinf-user train` starts (or shown by `rlinf-user plan`); "
                         "here give placement=collocated or disaggregated")  # fmt: skip
    if mode not in MODES:
        raise ValueError(f"placement.mode must be one of {MODES}, got {mode!r}")
    groups = {str(k): {str(r): float(v) for r, v in dict(g or {}).items()} for k, g in dict(placement_cfg.get("groups") or {}).items()}
    learner = _role(placement_cfg.learner, max_concurrency=4, groups=groups)
    env_worker = _role(placement_cfg.env_worker, groups=groups)
    eval_cfg = placement_cfg.get("eval_worker")
    # evaluation on a simulator runs anywhere unless placed: not on a robot's resources
    eval_worker = _role(eval_cfg, groups=groups) if eval_cfg is not None else RolePlan(env_worker.num_cpus, 0.0, {})
    if not gpu_available:
        learner.num_gpus = 0.0
        env_worker.num_gpus = 0.0
    elif mode == "collocated" and learner.num_gpus == 0:
        # share the device: learner takes most, rollout workers a slice each
        learner.num_gpus = 0.5
        env_worker.num_gpus = 0.5 / max(1, placement_cfg.num_env_workers + 1)
    rollout = None
    rollout_cfg = placement_cfg.get("rollout")
    if rollout_cfg is not None and rollout_cfg.get("enabled", False):
        rollout = _role(rollout_cfg, groups=groups)
        if not gpu_available:
            rollout.num_gpus = 0.0
        else:
            if rollout.num_gpus == 0 and mode == "collocated":
                rollout.num_gpus = 0.25  # the server shares the device with the learner
            env_worker.num_gpus = 0.0  # workers only step envs: the policy runs on the server
    replay = None
    if mode == "disaggregated":
        replay = _role(placement_cfg.buffer, max_concurrency=4, groups=groups)
        replay.num_gpus = 0.0
    # the weight store sits with the learner: publication is a local object-store put
    weights = RolePlan(0.1, 0.0, dict(learner.resources))
    if gpu_available:
        eval_worker.num_gpus = env_worker.num_gpus
    reward = _role(placement_cfg.reward, groups=groups) if placement_cfg.get("reward") is not None else None
    if reward is not None and not gpu_available:
        reward.num_gpus = 0.0
    replicas = int(placement_cfg.get("learner_replicas", 1) or 1)
    if replicas > 1 and gpu_available:
        learner.num_gpus = 1.0  # NCCL: one device per replica
    return Plan(
        mode, learner, env_worker, replay, weights, int(placement_cfg.num_env_workers), eval_worker, groups, rollout, reward,
        replicas,
    )  # fmt: skip


def ray_init_kwargs(placement_cfg, plan: Plan, extra_resources: tuple = (), env_worker_cpus: float | None = None) -> dict[str, Any]:
    """Arguments for ``ray.init``: join a cluster when an address is given, else start a
    local runtime sized so every role fits (logical CPUs may exceed physical cores)."""
    if placement_cfg.ray_address:
        return {"address": placement_cfg.ray_address}
    total = plan.total_cpus()
    if env_worker_cpus is not None:  # a fleet: its members' workers instead of num_env_workers
        total += env_worker_cpus - plan.env_worker.num_cpus * plan.num_env_workers
    cpus = max(os.cpu_count() or 1, int(total + 0.999))
    # "local": always a new runtime, never a Ray instance another process left running here
    kwargs: dict[str, Any] = {"address": "local", "num_cpus": cpus, "include_dashboard": False, "log_to_driver": True}
    # One machine that reaches the robot(s) itself offers them as resources, e.g.
    # {"franka": 1}, and is every node group at once; on a cluster each node registers
    # what it reaches or is (`ray start --resources=...`).
    resources: dict[str, float] = {}
    for res in [plan.env_worker.resources, *(plan.groups or {}).values(), *extra_resources]:
        for k, v in res.items():
            resources[k] = max(resources.get(k, 0.0), float(v))
    if resources:
        kwargs["resources"] = resources
    return kwargs
