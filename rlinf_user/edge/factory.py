"""Picklable backend builders: the control-loop process calls one to get its backend.

An arm is found by ``arm:`` in ``configs/edge/<robot>.yaml`` in :data:`ARMS`: a builder
``(driver options, safety options) -> ArmBackend``. A lab's own arm is a package with a
``rlinf_user.arms`` entry point whose builder wraps its :class:`rlinf_user.robots.arm.ArmDriver`.
"""

from __future__ import annotations

from typing import Any

from rlinf_user.edge.backends import ArmBackend, SimBackend
from rlinf_user.registry import Registry

ARMS = Registry("arm", {"franka": "rlinf_user.edge.factory:franka_backend"}, entry_points="rlinf_user.arms")


def sim_backend(env_cfg: dict[str, Any], seed: int = 0) -> SimBackend:
    """A contract simulator served by the edge; the training side owns episode length."""
    from omegaconf import OmegaConf

    from rlinf_user.env.registry import make_env

    cfg = OmegaConf.create(env_cfg)
    env = make_env(cfg, seed=seed)
    env.max_episode_steps = 2**31 - 1  # truncation is decided by the training side
    return SimBackend(env, description=f"{cfg.backend}:{cfg.task}")


def franka_backend(driver: dict[str, Any], safety: dict[str, Any]) -> ArmBackend:
    from rlinf_user.edge.safety import SafetyConfig
    from rlinf_user.robots.franka.driver import FrankaDriverConfig, FrankyArm

    arm = FrankyArm(FrankaDriverConfig(**driver))
    return ArmBackend(arm, SafetyConfig(**safety), description=f"franka@{driver.get('ip')}")
