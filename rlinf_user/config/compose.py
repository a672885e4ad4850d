"""Compose the run configuration from Hydra groups + overrides, and validate it."""

from __future__ import annotations

import logging
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
    from rlinf_user.config.algo import ALGO_CONFIGS

    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    for name, schema in ALGO_CONFIGS.items():  # configs/algo/<name>.yaml pulls in its schema
        cs.store(group="algo_schema", name=name, node=schema)


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
    if cfg.algo.get("credit") == "action":  # the policy's value head then has one output per action
        cfg.policy.value_per_action = True
    return cfg


FAMILIES = {"sac": "sac", "rlpd": "sac", "crossq": "sac", "sac_flow": "sac", "ppo": "ppo", "grpo": "ppo"}


def _apply_tuning(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """The env's ``algo_tuning`` for this algorithm (its own name first, then its family),
    and its ``policy_defaults`` unless the command line picks a policy, except keys the
    command line sets."""
    name = str(cfg.algo.name)
    tuning = cfg.get("algo_tuning") or {}
    tuned = tuning.get(name, tuning.get(FAMILIES.get(name, name))) or {}
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    for key, value in tuned.items():
        if f"algo.{key}" in given:
            continue
        try:
            cfg.algo[key] = value
        except Exception as err:  # noqa: BLE001 - omegaconf raises several kinds
            raise ConfigError(f"algo_tuning.{FAMILIES.get(name, name)}.{key}: not a key of algo={name} ({err})") from err
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
    if "Could not find" in msg and "'robot/" in msg:
        return f"unknown robot: {msg}"
    if "Could not find" in msg and "'sim/" in msg:
        return f"unknown simulator: {msg}"
    if "Could not find" in msg and "'algo/" in msg:
        return f"unknown algorithm: {msg}"
    if "Could not find" in msg and "'policy/" in msg:
        return f"unknown policy: {msg}"
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
    from rlinf_user.runtime.seeds import MAX_RUN_SEED

    if not 0 <= int(cfg.seed) < MAX_RUN_SEED:
        raise ConfigError(f"seed={cfg.seed}: use 0 <= seed < {MAX_RUN_SEED:,} (larger seeds are evaluation's held-out range)")
    from rlinf_user.algorithms.base import check_algorithm

    problems = check_algorithm(cfg.algo, cfg.policy)
    if problems:
        raise ConfigError("; ".join(problems))
    _check_on_policy(cfg)
    credit = cfg.algo.get("credit", "chunk")
    if credit not in ("chunk", "action"):
        raise ConfigError(f"algo.credit={credit!r}: chunk or action")
    if credit == "action" and (cfg.algo.name != "ppo" or cfg.policy.name not in ("pi0", "lite_vla", "token_vla")):
        raise ConfigError(
            f"algo.credit=action needs algo=ppo and a VLA's value head (policy=pi0, lite_vla or token_vla); "
            f"this run has algo={cfg.algo.name} policy={cfg.policy.name}"
        )
    if cfg.algo.get("paced", False) and (cfg.env.get("kind") == "robot" or cfg.get("fleet")):
        raise ConfigError("algo.paced=true makes env workers wait for the learner: a simulator in the worker can, a robot or a fleet member behind its edge daemon cannot")
    iv = cfg.get("intervention")
    human_demos = bool(iv is not None and iv.enabled and iv.to_demos)
    demo_ratio = float(cfg.algo.get("demo_ratio", 0.0))
    hg = cfg.get("hg_dagger")
    if cfg.algo.name == "bc" and not cfg.demos and not (hg is not None and hg.get("synthetic_human")):
        raise ConfigError("algo=bc trains on demonstrations: give demos=<dataset>")
    if float(cfg.algo.get("bc_weight", 0.0) or 0.0) > 0 and demo_ratio <= 0:
        raise ConfigError(f"algo.bc_weight={cfg.algo.bc_weight} pulls the actor towards the demo rows of each batch, "
                          "but algo.demo_ratio=0 draws none: set algo.demo_ratio (e.g. 0.5) and demos=<path>")
    if demo_ratio > 0 and not cfg.demos and not human_demos:
        raise ConfigError(
            f"algo.demo_ratio={demo_ratio} mixes demonstrations into every batch, "
            "but no demos=<path> was given (or set algo.demo_ratio=0)"
        )
    if human_demos and demo_ratio <= 0:
        raise ConfigError(
            "intervention.to_demos=true samples the human's interventions as demonstrations, "
            "which needs algo.demo_ratio > 0 (e.g. algo=rlpd, or algo.demo_ratio=0.5); "
            "or set intervention.to_demos=false"
        )
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
    if cfg.placement.num_env_workers < 1 or cfg.placement.envs_per_worker < 1:
        raise ConfigError("placement.num_env_workers and placement.envs_per_worker must be >= 1")
    if int(cfg.get("keep_checkpoints", 3)) < 0:
        raise ConfigError("keep_checkpoints must be >= 0 (0 keeps every checkpoint)")
    if cfg.total_env_steps <= 0:
        raise ConfigError("total_env_steps must be > 0")
    from rlinf_user.env.registry import validate_env_config

    if fleet:
        from rlinf_user.runtime.fleet import members

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


def _check_on_policy(cfg: DictConfig) -> None:
    """On-policy algorithms: envs that fit their groups, no human data paths."""
    from rlinf_user.algorithms.base import ON_POLICY, algorithm_class

    if algorithm_class(cfg.algo).data_mode != ON_POLICY:
        return
    name = cfg.algo.name
    if cfg.demos:
        raise ConfigError(f"algo={name} learns on-policy from its own rollouts: demos= is not used (use algo=rlpd or bc)")
    iv = cfg.get("intervention")
    if iv is not None and iv.enabled:
        raise ConfigError(f"algo={name}: human interventions need an off-policy algorithm (algo=rlpd, sac)")
    if name == "grpo":
        g = int(cfg.algo.group_size)
        sizes = [int(m.get("envs_per_worker", 1)) for m in (cfg.get("fleet") or [])] or [int(cfg.placement.envs_per_worker)]
        bad = [n for n in sizes if g < 1 or n % g]
        if bad:
            raise ConfigError(
                f"algo.group_size={g} must divide the envs of every worker (placement.envs_per_worker={sizes[0]}): "
                f"GRPO compares episodes that start from the same reset seed within a worker"
            )
        env = cfg.get("env")
        if env is not None and env.get("reward") == "dense":
            steps = int(env.max_episode_steps)
            gamma = float(cfg.algo.get("gamma", 1.0))
            episode = cfg.algo.get("baseline", "step") == "episode" or gamma >= 1.0
            horizon = steps if episode else min(steps, round(1.0 / (1.0 - gamma)))
            if float(env.get("success_bonus") or 0) < horizon:
                log.warning(
                    "algo=grpo scores %s: with a dense reward and success ending the episode, hovering near the "
                    "goal for %d steps can out-score succeeding; set env.success_bonus to at least that many "
                    "times the largest per-step reward (env.success_bonus=%d for rewards in [0, 1])",
                    "whole undiscounted episodes" if episode else f"rewards-to-go discounted by gamma={gamma}",
                    horizon, horizon,
                )  # fmt: skip


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
