"""``rlinf-user edge``: run the edge daemon on the robot PC, or create its keys."""

from __future__ import annotations

import functools
import logging
import signal
import threading
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from rlinf_user.config.compose import ConfigError

log = logging.getLogger(__name__)


def run_keygen(directory: str, console: Console) -> int:
    from rlinf_user.edge.security import keygen

    paths = keygen(directory)
    table = Table(title="edge keys", show_header=False)
    for name, path in paths.items():
        table.add_row(name, str(path))
    console.print(table)
    console.print(
        "robot PC: [bold]secret_key=[/]" + str(paths["edge_secret"])
        + " [bold]authorized_keys=[/]" + str(paths["authorized"])
        + "\ntraining side: [bold]env.edge.server_public_key=[/]" + str(paths["edge_public"])
        + " [bold]env.edge.client_secret_key=[/]" + str(paths["client_secret"])
        + "\ncopy the training side's files over a trusted channel; never copy edge.key_secret"
    )  # fmt: skip
    return 0


def make_backend_factory(cfg) -> Any:
    from rlinf_user.edge.factory import ARMS, sim_backend

    if cfg.env is not None:
        return functools.partial(sim_backend, OmegaConf.to_container(cfg.env, resolve=True))
    robot = OmegaConf.to_container(cfg.robot, resolve=True)
    safety = OmegaConf.to_container(cfg.safety, resolve=True)
    safety.pop("workspace_from", None)  # already applied to workspace_low/high by the config
    safety["watchdog_periods"] = int(safety["watchdog_periods"])
    return functools.partial(ARMS.get(str(cfg.arm)), robot, safety)


def start_cameras(cfg, sim_server=None) -> dict[str, Any]:
    """One capture thread per configured camera. ``kind: sim`` cameras render the franky-sim
    scene (``franky_sim=true``), served through the same capture path as real cameras."""
    if not cfg.cameras:
        return {}
    from rlinf_user.robots.cameras.base import start_streams

    cams = [OmegaConf.to_container(c, resolve=True) for c in cfg.cameras]
    kwargs = {}
    for cam in cams:
        scene_camera = cam.pop("scene_camera", None)  # a camera of the MJCF scene; None: a free view
        if cam.get("kind") == "sim":
            if sim_server is None:
                raise ConfigError(f"camera {cam.get('name')!r} is kind=sim: it renders franky-sim's "
                                  "scene and needs franky_sim=true")  # fmt: skip
            w, h = int(cam["width"]), int(cam["height"])
            try:
                intrinsics = sim_server.camera_intrinsics(scene_camera, w, h)
            except ValueError as err:
                raise ConfigError(f"camera {cam['name']!r}: scene_camera={scene_camera!r}: {err}") from None
            kwargs[cam["name"]] = {
                "render": functools.partial(sim_server.render_rgb, camera=scene_camera, width=w, height=h),
                "intrinsics": intrinsics,
            }
        elif scene_camera is not None:
            raise ConfigError(f"camera {cam.get('name')!r}: scene_camera is for kind=sim cameras")
    return start_streams(cams, camera_kwargs=kwargs)


def build_daemon(cfg, sim_server=None):
    from rlinf_user.edge.daemon import EdgeDaemon

    return EdgeDaemon(
        make_backend_factory(cfg), bind=cfg.bind, port=cfg.port, control_hz=cfg.control_hz,
        watchdog_periods=cfg.safety.watchdog_periods, secret_key=cfg.secret_key,
        authorized_keys=cfg.authorized_keys, heartbeat_s=cfg.heartbeat_s,
        peer_timeout_s=cfg.peer_timeout_s, max_message_bytes=cfg.max_message_bytes,
        realtime_priority=cfg.realtime_priority, spin_s=cfg.spin_s,
        cameras=start_cameras(cfg, sim_server), frame_max_age_s=cfg.frame_max_age_s,
        peer_rate_hz=cfg.peer_rate_hz, total_rate_hz=cfg.total_rate_hz, daemon_timeout_s=cfg.daemon_timeout_s,
        ingress_budget_bytes=int(cfg.ingress_budget_mb * 2**20) if cfg.ingress_budget_mb else None,
        control_port=cfg.control_port, handshake_timeout_s=cfg.handshake_timeout_s, max_pending_connections=cfg.max_pending_connections,
    )  # fmt: skip


def run_edge(args, console: Console) -> int:
    if args.overrides and args.overrides[0] == "keygen":
        if len(args.overrides) != 2:
            console.print("[bold red]error:[/] usage: rlinf-user edge keygen <folder>")
            return 2
        return run_keygen(args.overrides[1], console)
    from rlinf_user.edge.config import compose_edge_config

    cfg = compose_edge_config(args.overrides, robot=args.robot, sim=args.sim)
    if args.dry_run:
        console.print(OmegaConf.to_yaml(cfg))
        return 0
    sim_server = None
    if cfg.franky_sim:
        from rlinf_user.edge.daemon import EdgeStartError
        from rlinf_user.robots.franka.sim_server import start_franky_sim

        console.print("starting franky-sim (MuJoCo Franka speaking the libfranka protocol)")
        # a scene camera needs the simulator's MuJoCo model in this process
        render = any(c.get("kind") == "sim" for c in cfg.cameras)
        scene = None
        if cfg.franky_sim_scene == "calibration":
            from rlinf_user.robots.franka.sim_scene import calibration_scene as scene
        elif cfg.franky_sim_scene is not None:
            raise ConfigError(f"franky_sim_scene={cfg.franky_sim_scene!r}: the scenes are: calibration")
        try:
            sim_server = start_franky_sim(hostname=cfg.robot.ip, render=render, scene=scene)
        except RuntimeError as err:
            raise EdgeStartError(f"franky-sim: {err}") from None
    try:
        daemon = build_daemon(cfg, sim_server)
    except BaseException:
        if sim_server is not None:
            sim_server.close()
        raise
    try:
        spec = daemon.start()
        table = Table(title=f"edge daemon: {spec.get('description')}", show_header=False)
        table.add_row("serving", f"tcp://{cfg.bind}:{cfg.port} (stream :{cfg.port + 1}, "
                      f"controller :{daemon.control_port})")
        table.add_row("auth", "CURVE" if cfg.secret_key else "none (loopback only)")
        table.add_row("control", f"{cfg.control_hz:g} Hz, watchdog {cfg.safety.watchdog_periods} periods")
        table.add_row("state", f"{spec.get('state_dim')} floats")
        table.add_row("cameras", ", ".join(spec.get("cameras") or {}) or "none")
        console.print(table)
        stop = threading.Event()

        def _on_signal(signum, frame):
            stop.set()
            daemon.stop()

        signal.signal(signal.SIGTERM, _on_signal)
        daemon.run(duration_s=args.duration)
    except KeyboardInterrupt:
        console.print("[yellow]stopping the edge daemon (robot held)[/]")
    finally:
        daemon.close()
        if sim_server is not None:
            sim_server.close()
    return 0
