"""Compose the run configuration from Hydra groups + overrides, and validate it."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from rlinf_user.config.schema import RunConfig

CONFIG_MODULE = "rlinf_user.configs"
GROUPS = ("sim", "robot", "algo", "policy", "placement", "teleop")
log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the offending key."""


def _register() -> None:
    """Every algorithm's and policy's typed config as ``algo_schema/<name>`` and
    ``policy_schema/<name>`` (``configs/<group>/<name>.yaml`` pulls it in); one without a YAML
    of its own (a plugin's) is ``algo/<name>`` or ``policy/<name>``."""
    from importlib.resources import files

    from rlinf_user.algorithms.base import ALGORITHMS
    from rlinf_user.policies.base import POLICIES

    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    for group, table in (("algo", ALGORITHMS), ("policy", POLICIES)):
        yamls = files(CONFIG_MODULE).joinpath(group)
        for name in table.names():
            schema = getattr(table.get(name), "config", None)
            if schema is None:  # a plugin policy that declares no keys: its name and what the YAML sets
                node = {"name": name}
            else:
                node = schema(name=name) if dataclasses.is_dataclass(schema) and "name" in schema.__dataclass_fields__ else schema
            cs.store(group=f"{group}_schema", name=name, node=node)
            if not yamls.joinpath(f"{name}.yaml").is_file():
                cs.store(group=group, name=name, node=node)


def compose_config(
    overrides: Sequence[str] = (), sim: str | None = None, robot: str | None = None
) -> DictConfig:
    """Build the run config. ``sim``/``robot`` pick the environment group (``--sim``/``--robot``)."""
    if sim and robot:
        raise ConfigError("give either --sim or --robot, not both")
    ov = list(overrides)
    if robot:
        ov = ["~sim", f"+robot={robot}", *ov]
    elif sim:
        ov = [f"sim={sim}", *ov]
    _register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose(config_name="config", overrides=ov)
    except Exception as err:  # hydra raises several types; give one clear message
        raise ConfigError(_explain(err)) from err
    finally:
        GlobalHydra.instance().clear()
    _apply_tuning(cfg, ov)
    from rlinf_user.algorithms.base import algorithm_class

    algorithm_class(cfg.algo).configure(cfg)
    return cfg


def _apply_tuning(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """The env's ``algo_tuning`` for this algorithm (its own name first, then the tuning
    family the algorithm accepts), and its ``policy_defaults`` unless the command line
    picks a policy, except keys the command line sets."""
    from rlinf_user.algorithms.base import algorithm_class

    name = str(cfg.algo.name)
    family = algorithm_class(cfg.algo).tuning_family or name
    tuning = cfg.get("algo_tuning") or {}
    tuned = tuning.get(name, tuning.get(family)) or {}
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    for key, value in tuned.items():
        if f"algo.{key}" in given:
            continue
        try:
            cfg.algo[key] = value
        except Exception as err:  # noqa: BLE001 - omegaconf raises several kinds
            raise ConfigError(f"algo_tuning.{family}.{key}: not a key of algo={name} ({err})") from err
    if "policy" not in given:
        for key, value in (cfg.get("policy_defaults") or {}).items():
            if f"policy.{key}" in given:
                continue
            try:
                cfg.policy[key] = value
            except Exception as err:  # noqa: BLE001
                raise ConfigError(f"policy_defaults.{key}: not a policy key ({err})") from err


def _explain(err: Exception) -> str:
    msg = str(err).strip().split("\nConfig search path:")[0].strip()
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    if "Could not find" in msg and "'robot/" in msg:
        return f"unknown robot: {msg}"
    if "Could not find" in msg and "'sim/" in msg:
        return f"unknown simulator: {msg}"
    if "Could not find" in msg and "'algo/" in msg:
        return f"unknown algorithm: {msg}"
    if "Could not find" in msg and "'policy/" in msg:
        return f"unknown policy: {msg}"
    unknown = re.match(r"Could not override '(algo|policy)\.([^']+)'", msg)
    if unknown and re.match(r"Key '[^']+' not in '\w+'", str(root)):
        group, key = unknown.groups()
        return (f"{group}.{key}: not a key of the chosen {group} (each {group} declares its own keys: "
                f"configs/{group}/<name>.yaml names the class that holds them)")
    if root is not err and "Could not override" in msg:
        return f"{msg.splitlines()[0]} {str(root).splitlines()[0]}"
    return msg


def validate(cfg: DictConfig) -> None:
    """Fail before anything starts: missing values (naming every key), impossible combos."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    fleet = list(cfg.get("fleet") or [])
    if fleet:  # a value every fleet member sets itself (each robot's edge host) is not missing

        def set_by_all(key: str) -> bool:
            sub = key.split(".", 1)[1] if key.startswith("env.") else None
            return sub is not None and all(
                OmegaConf.select(OmegaConf.create(dict(m.env or {})), sub, default=None) is not None for m in fleet
            )

        missing = [k for k in missing if not set_by_all(k)]
    if missing:
        raise ConfigError(
            "missing required config value(s): "
            + ", ".join(missing)
            + " (set them on the command line, e.g. "
            + " ".join(f"{k}=..." for k in missing)
            + ")"
        )
    from rlinf_user.seeds import MAX_RUN_SEED

    if not 0 <= int(cfg.seed) < MAX_RUN_SEED:
        raise ConfigError(f"seed={cfg.seed}: use 0 <= seed < {MAX_RUN_SEED:,} (larger seeds are evaluation's held-out range)")
    from rlinf_user.algorithms.base import REPLAY, algorithm_class, check_algorithm

    problems = check_algorithm(cfg.algo, cfg.policy)
    algo = algorithm_class(cfg.algo) if not problems else None
    problems = problems or algo.run_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    plan = algo.data_plan(cfg.algo)
    if plan.data_mode == REPLAY:
        _check_replay(cfg, plan)
    iv = cfg.get("intervention")
    if iv is not None and iv.synthetic_human and not iv.enabled:
        raise ConfigError("intervention.synthetic_human=true needs intervention.enabled=true")
    if iv is not None and iv.synthetic_human and not (
        cfg.env.backend == "gym_hil" and "PickCube" in str(cfg.env.task)
    ):
        raise ConfigError("intervention.synthetic_human=true drives gym_hil's PandaPickCube only")
    for key in ("patience", "min_control"):
        if iv is not None and iv.synthetic_human and int(iv.get(key, 1)) < 1:
            raise ConfigError(f"intervention.{key}={iv.get(key)}: the scripted supervisor's {key} is a step count >= 1")
    from rlinf_user.policies.encoders import encoder_kind

    encoder = encoder_kind(cfg.policy)
    if encoder == "cnn" and not cfg.env.cameras:
        raise ConfigError(f"policy={cfg.policy.name} with a cnn encoder needs cameras: set env.cameras=[<camera>, ...]")
    if encoder in ("efficientnet", "resnet10") and not cfg.env.cameras:
        raise ConfigError(f"policy.encoder={encoder} encodes camera frames: set env.cameras=[<camera>, ...]")
    from rlinf_user.policies.frame_features import frame_feature_settings

    try:
        frame_feature_settings(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if encoder == "mlp" and cfg.env.cameras and cfg.policy.name != "mlp":
        raise ConfigError(
            f"policy={cfg.policy.name} with policy.encoder=mlp would ignore env.cameras={list(cfg.env.cameras)}: "
            "set policy.encoder=cnn (or env.cameras=[])"
        )
    if cfg.placement.weight_transport not in ("tcp", "ray"):
        raise ConfigError(f"placement.weight_transport={cfg.placement.weight_transport!r}: use tcp or ray")
    if cfg.placement.get("weight_link") is not None:
        from rlinf_user.netem import LinkSpec

        if cfg.placement.weight_transport != "tcp":
            raise ConfigError("placement.weight_link emulates the tcp weight transport's link: set weight_transport=tcp")
        try:
            LinkSpec.from_config(cfg.placement.weight_link)
        except ValueError as err:
            raise ConfigError(f"placement.weight_link: {err}") from None
    if not 0 <= int(cfg.placement.weight_port) <= 65535:
        raise ConfigError(f"placement.weight_port={cfg.placement.weight_port} is not a TCP port (0: any free port)")
    rw = cfg.get("reward")
    if rw is not None and rw.classifier:
        from pathlib import Path

        if not Path(rw.classifier).is_file():
            raise ConfigError(f"reward.classifier={rw.classifier}: no such file (train one with `rlinf-user train-reward`)")
        if rw.threshold is not None and not 0.0 < float(rw.threshold) < 1.0:
            raise ConfigError(f"reward.threshold={rw.threshold} must be between 0 and 1")
    ro = cfg.placement.get("rollout")
    if ro is not None and ro.get("enabled", False):
        if str(ro.device) not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"placement.rollout.device={ro.device!r}: use auto, cpu or cuda")
        if int(ro.max_batch) < 1 or float(ro.max_wait_ms) < 0:
            raise ConfigError("placement.rollout.max_batch must be >= 1 and placement.rollout.max_wait_ms >= 0")
    if int(cfg.placement.get("learner_replicas", 1)) < 1:
        raise ConfigError(f"placement.learner_replicas={cfg.placement.learner_replicas}: at least 1 (the learner itself)")
    if str(cfg.placement.mode) not in ("collocated", "disaggregated", "auto"):
        raise ConfigError(f"placement.mode={cfg.placement.mode!r}: collocated, disaggregated or auto")
    if str(cfg.placement.mode) == "auto" and cfg.get("fleet"):
        raise ConfigError("placement=auto plans one env's workers (on one machine, or on a cluster's node groups); a fleet's "
                          "members are placed by their robots' resources: choose placement=hybrid or cluster for a fleet")  # fmt: skip
    if cfg.placement.num_env_workers < 1 or cfg.placement.envs_per_worker < 1:
        raise ConfigError("placement.num_env_workers and placement.envs_per_worker must be >= 1")
    most = int(cfg.placement.get("max_env_workers", 0) or 0)
    if most and most < int(cfg.placement.num_env_workers):
        raise ConfigError(f"placement.max_env_workers={most}: at least placement.num_env_workers "
                          f"({cfg.placement.num_env_workers}), or 0 for a fixed number")  # fmt: skip
    if most and cfg.get("fleet"):
        raise ConfigError("placement.max_env_workers adds workers of the run's env; a fleet's members are placed by "
                          "their robots' resources (a member's workers start when a node offering them joins)")  # fmt: skip
    if int(cfg.get("keep_checkpoints", 3)) < 0:
        raise ConfigError("keep_checkpoints must be >= 0 (0 keeps every checkpoint)")
    if cfg.total_env_steps <= 0:
        raise ConfigError("total_env_steps must be > 0")
    eval_envs = int(cfg.get("eval_envs", 1))
    if eval_envs < 1 or (eval_envs > 1 and cfg.env.kind == "robot"):
        raise ConfigError(f"eval_envs={eval_envs}: at least 1, and 1 on a robot (one arm runs one episode)")
    from rlinf_user.env.registry import validate_env_config

    if fleet:
        from rlinf_user.config.fleet import members

        try:
            ms = members(cfg)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        for m in ms:
            try:
                validate_env_config(m.env)
            except (KeyError, ValueError) as err:
                raise ConfigError(f"fleet member {m.name!r}: {err}") from err
        return
    try:
        validate_env_config(cfg.env)
    except (KeyError, ValueError) as err:
        raise ConfigError(str(err)) from err


def _check_replay(cfg: DictConfig, plan) -> None:
    """Replay algorithms: demonstrations where the plan mixes them in, pacing only in a sim."""
    if plan.paced and (cfg.env.get("kind") == "robot" or cfg.get("fleet")):
        raise ConfigError("algo.paced=true makes env workers wait for the learner: a simulator in the worker can, a robot or a fleet member behind its edge daemon cannot")
    iv = cfg.get("intervention")
    human_demos = bool(iv is not None and iv.enabled and iv.to_demos)
    if 0 < plan.demo_ratio < 1 and not cfg.demos and not human_demos:
        raise ConfigError(
            f"algo.demo_ratio={plan.demo_ratio} mixes demonstrations into every batch, "
            "but no demos=<path> was given (or set algo.demo_ratio=0)"
        )
    if human_demos and plan.demo_ratio <= 0:
        raise ConfigError(
            "intervention.to_demos=true samples the human's interventions as demonstrations, "
            "which needs algo.demo_ratio > 0 (e.g. algo=rlpd, or algo.demo_ratio=0.5); "
            "or set intervention.to_demos=false"
        )


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
