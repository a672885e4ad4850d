"""Configuration of ``rlinf-user edge``: typed schema + ``configs/edge/<robot>.yaml``.

``rlinf-user edge --robot franka robot.ip=172.16.0.2 bind=172.16.0.1`` serves the arm;
``rlinf-user edge --sim gym_hil env.task=PandaPickCube`` serves a simulator in its place
(the simulator's options come from the ``sim/`` group of the training config).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from rlinf_user.config.compose import ConfigError, compose_config
from rlinf_user.edge.security import is_loopback


def _config_dir() -> Path:
    import rlinf_user.configs

    return Path(rlinf_user.configs.__file__).resolve().parent


@dataclass
class SafetySchema:
    workspace_low: list[float] = field(default_factory=lambda: [0.25, -0.35, 0.02])
    workspace_high: list[float] = field(default_factory=lambda: [0.75, 0.35, 0.60])
    max_translation: float = 0.02
    max_rotation: float = 0.1
    max_tilt: float = 0.8
    gripper_threshold: float = 0.5
    watchdog_periods: int = 2
    target_mode: str = "commanded"  # commanded: deltas integrate on the last target | measured
    max_lead: float = 0.03
    max_lead_rotation: float = 0.2
    face_lead_rotation: float = 0.05  # rad: the rotational lead allowed at the margin (none at the face)
    workspace_margin: float = 0.01
    brake_distance: float = 0.05
    brake_gain: float = 0.5
    box_tolerance: float = 0.002
    # the box from `rlinf-user calibrate workspace` (a name under calibration_root/<robot>/
    # or a .yaml path) replaces workspace_low/high
    workspace_from: str | None = None


@dataclass
class EdgeServeConfig:
    bind: str = "127.0.0.1"  # the interface to serve on (the robot PC's LAN address)
    port: int = 5555  # requests; port + 1 carries the state stream, port + 2 the controller's commands
    control_port: int | None = None  # the controller's own socket (default port + 2)
    control_hz: float = 10.0
    secret_key: str | None = None  # edge.key_secret from `rlinf-user edge keygen`
    authorized_keys: str | None = None  # folder of accepted client public keys
    heartbeat_s: float = 0.5
    peer_timeout_s: float = 2.0
    max_message_bytes: int = 16 * 1024 * 1024
    peer_rate_hz: float = 50.0  # requests/s from a client that is not the controller (per peer)
    total_rate_hz: float = 500.0  # ... from all of them together
    daemon_timeout_s: float = 2.0  # the control loop holds and exits if the daemon stops reading
    ingress_budget_mb: float | None = None  # unfinished messages cut past this (default max(64, 4 x max))
    handshake_timeout_s: float = 1.0  # a connection that has not finished its ZMTP/CURVE handshake is dropped
    max_pending_connections: int = 64  # connections still in their handshake; the oldest are cut beyond
    realtime_priority: int = 0  # SCHED_FIFO priority of the control loop (0: normal)
    spin_s: float = 0.0005
    frame_max_age_s: float = 0.25
    safety: SafetySchema = field(default_factory=SafetySchema)
    robot: dict[str, Any] | None = None  # driver options (robot/<name>.yaml)
    arm: str = "franka"  # the arm backend that drives them (rlinf_user.edge.factory.ARMS, or a plugin's)
    franky_sim: bool = False  # start franky-sim (MuJoCo, libfranka protocol) and drive it
    # extra props in franky-sim's scene: "calibration" (ChArUco boards, a wrist and a front
    # camera for `rlinf-user calibrate`; sim cameras name them with scene_camera)
    franky_sim_scene: str | None = None
    calibration_root: str = "calibration"  # where `rlinf-user calibrate` results live (<root>/<robot>/)
    cameras: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, Any] | None = None  # a served simulator (--sim)
    log_level: str = "INFO"


def compose_edge_config(overrides: Sequence[str] = (), robot: str | None = None,
                        sim: str | None = None) -> DictConfig:  # fmt: skip
    if bool(robot) == bool(sim):
        raise ConfigError("give one of --robot NAME or --sim NAME")
    cfg = OmegaConf.structured(EdgeServeConfig)
    own, env_overrides = [], []
    for ov in overrides:
        (env_overrides if ov.startswith("env.") else own).append(ov)
    if robot:
        path = _config_dir() / "edge" / f"{robot}.yaml"
        if not path.exists():
            available = sorted(p.stem for p in (_config_dir() / "edge").glob("*.yaml"))
            raise ConfigError(f"unknown robot {robot!r} for the edge daemon; available: {available}")
        cfg = OmegaConf.merge(cfg, OmegaConf.load(path))
        if env_overrides:
            raise ConfigError(f"env.* overrides apply to --sim only: {env_overrides}")
    else:
        run_cfg = compose_config(env_overrides, sim=sim)
        env = OmegaConf.to_container(run_cfg.env, resolve=True)
        env["sim_device"] = "cpu" if env.get("sim_device") == "auto" else env["sim_device"]
        cfg.env = env
        cfg.control_hz = float(env.get("control_hz", cfg.control_hz))
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(own))
    except Exception as err:  # noqa: BLE001 - omegaconf raises several validation types
        raise ConfigError(f"bad override: {err}") from err
    if cfg.franky_sim and cfg.robot is not None:
        # the simulator listens on a loopback address (robot.ip, default 127.0.0.1)
        if OmegaConf.is_missing(cfg.robot, "ip"):
            cfg.robot.ip = "127.0.0.1"
        if not is_loopback(cfg.robot.ip):
            raise ConfigError(f"franky_sim=true serves the simulated arm on loopback; robot.ip={cfg.robot.ip}")
        cfg.robot.realtime = False
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(
            "missing required config value(s): " + ", ".join(missing)
            + " (set them on the command line, e.g. " + " ".join(f"{k}=..." for k in missing) + ")"
        )  # fmt: skip
    if not 1 <= cfg.control_hz <= 1000:
        raise ConfigError(f"control_hz={cfg.control_hz}: must be within 1..1000")
    if cfg.safety.workspace_from:
        from rlinf_user.calibration import store

        path = store.resolve(str(cfg.safety.workspace_from), cfg.calibration_root, robot or "sim")
        try:
            ws = store.load(path, "workspace")
        except (FileNotFoundError, store.CalibrationMismatch) as err:
            raise ConfigError(f"safety.workspace_from={cfg.safety.workspace_from}: {err}") from None
        cfg.safety.workspace_low, cfg.safety.workspace_high = list(ws["low"]), list(ws["high"])
    return cfg


__all__ = ["EdgeServeConfig", "SafetySchema", "compose_edge_config", "MISSING"]
