"""Name -> env backend (:data:`SIMS`, :data:`ROBOTS`, plugins by entry point), imported
only when asked for (no import side effects)."""

from __future__ import annotations

from typing import Any

from rlinf_user.env.base import ContractEnv
from rlinf_user.registry import Registry

SIMS = Registry(
    "sim",
    {
        "maniskill": "rlinf_user.sims.maniskill:ManiSkillEnv",
        "gym_hil": "rlinf_user.sims.gym_hil:GymHilEnv",
        "robosuite": "rlinf_user.sims.robosuite:RobosuiteEnv",
        "reach": "rlinf_user.sims.reach:ReachEnv",
    },
    entry_points="rlinf_user.sims",
)
ROBOTS = Registry(
    # any robot (or served simulator) behind `rlinf-user edge`; the name picks the defaults
    "robot",
    {"franka": "rlinf_user.edge.remote_env:RemoteRobotEnv"},
    entry_points="rlinf_user.robots",
)


def backend_class(kind: str, name: str) -> type[ContractEnv]:
    return (SIMS if kind == "sim" else ROBOTS).get(name)


def make_env(env_cfg: Any, seed: int | None = None) -> ContractEnv:
    """Build one env from an ``EnvConfig`` (see ``rlinf_user.config.schema``)."""
    from rlinf_user.env.crops import CropResize, parse_crops, render_config

    crops = parse_crops(env_cfg)
    inner = render_config(env_cfg)
    env = backend_class(env_cfg.kind, env_cfg.backend).from_config(inner, seed=seed)
    texts = getattr(env_cfg, "instruction", None)
    if texts:
        env.set_instructions(list(texts) if not isinstance(texts, str) else texts)
    if crops or inner is not env_cfg:
        env = CropResize(env, crops, int(env_cfg.image_size))
    return env


def validate_env_config(env_cfg: Any) -> None:
    """Raise ``ValueError``/``UnknownNameError`` for a bad backend, task or option,
    without building the env (used at the command line before any process starts)."""
    from rlinf_user.env.crops import parse_crops

    parse_crops(env_cfg)
    backend_class(env_cfg.kind, env_cfg.backend).validate_config(env_cfg)


def make_recording_env(env_cfg, seed: int = 0):
    """A single env whose rewards are recorded into a dataset (teleop, HG-DAgger): the run's
    shaping applied (:mod:`rlinf_user.env.shaping`), as the training envs apply it."""
    from rlinf_user.env.shaping import ShapedEnv

    env = make_env(env_cfg, seed=seed)
    bonus = float(getattr(env_cfg, "success_bonus", 0.0) or 0.0)
    return ShapedEnv(env, bonus) if bonus else env


def make_vector_env(env_cfg: Any, num_envs: int, seed: int = 0):
    """``num_envs`` envs behind the batched interface of :mod:`rlinf_user.env.vector`.

    A backend with a GPU-parallel implementation (``make_vector``, e.g. ManiSkill on CUDA)
    simulates them in one process; otherwise :class:`EnvBatch` steps single envs. Either
    way the run's reward shaping (:mod:`rlinf_user.env.shaping`) is applied here.
    """
    from functools import partial

    from rlinf_user.env.shaping import ShapedVectorEnv
    from rlinf_user.env.vector import EnvBatch

    cls = backend_class(env_cfg.kind, env_cfg.backend)
    # crops wrap single envs (make_env): with them, a GPU-parallel backend steps single envs
    cropped = bool(getattr(env_cfg, "crops", None) or getattr(env_cfg, "render_size", None))
    venv = cls.make_vector(env_cfg, num_envs, seed) if num_envs > 1 and not cropped else None
    if venv is None:
        venv = EnvBatch([partial(make_env, env_cfg, seed + i) for i in range(num_envs)])
    return ShapedVectorEnv(venv, float(getattr(env_cfg, "success_bonus", 0.0) or 0.0))
