"""Compose the run configuration from Hydra groups + overrides, and validate it."""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from rlinf_user.config.schema import RunConfig

CONFIG_MODULE = "rlinf_user.configs"
GROUPS = ("sim", "robot", "algo", "policy", "placement", "teleop")


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the offending key."""


def _register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)


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
    return cfg


def _explain(err: Exception) -> str:
    msg = str(err).strip().split("\nConfig search path:")[0].strip()
    if "Could not find" in msg and "'robot/" in msg:
        return f"unknown robot: {msg}"
    if "Could not find" in msg and "'sim/" in msg:
        return f"unknown simulator: {msg}"
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
    if cfg.algo.name not in ("sac", "rlpd", "crossq"):
        raise ConfigError(f"algo.name={cfg.algo.name!r}: available sac, rlpd, crossq")
    iv = cfg.get("intervention")
    human_demos = bool(iv is not None and iv.enabled and iv.to_demos)
    if cfg.algo.demo_ratio > 0 and not cfg.demos and not human_demos:
        raise ConfigError(
            f"algo.demo_ratio={cfg.algo.demo_ratio} mixes demonstrations into every batch, "
            "but no demos=<path> was given (or set algo.demo_ratio=0)"
        )
    if human_demos and cfg.algo.demo_ratio <= 0:
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
    if cfg.policy.name == "cnn" and not cfg.env.cameras:
        raise ConfigError("policy=cnn needs cameras: set env.cameras=[<camera>, ...]")
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


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
