"""Robot PC checks behind ``rlinf-user doctor --robot franka [KEY=VALUE ...]``: what users
trip over next to the arm (reachability, libfranka/server versions, real-time kernel,
cameras by serial, edge keys). Every check returns a :class:`Check` and never prints."""

from __future__ import annotations

import importlib
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from rlinf_user.doctor import Check, _version
from rlinf_user.doctor_realtime import check_cpu_governor, check_rt_kernel, check_sched_fifo

# ====================================================================================== robot PC
# ``rlinf-user doctor --robot franka [KEY=VALUE ...]``: what users trip over on the robot PC.
# Every check returns a Check (status ok | warn | fail) and never prints; the CLI renders them.

FRANKA_COMMAND_PORT = 1337  # libfranka's robot command port (TCP); the Franka Hand uses 1338
TCP_PROBE_TIMEOUT_S = 2.0  # a robot on the FCI link answers a TCP connect in well under 1 ms
FRANKY_INSTALL = "pip install 'rlinf-user[franka]'"
FRANKY_BY_SERVER = (
    "pip install --force-reinstall franky-control --extra-index-url "
    "https://timschneider42.github.io/franky/whl/by-robot-server-version/{server}/"
)
FRANKA_COMPATIBILITY = (
    "https://frankarobotics.github.io/docs/libfranka/docs/compatibility_with_images.html"
)
_FCI_FIXES = (
    "in Desk: unlock the brakes and activate FCI; "
    "this PC needs a static address in the robot's subnet (e.g. 172.16.0.1/24 for a robot at "
    "172.16.0.2); the cable goes into the Control's LAN port, not the arm base's; "
    "check robot.ip"
)
_ONE_CLIENT = "only one program may hold the robot: stop a running edge daemon or other controller"
_VERSION_RE = re.compile(r"server version:\s*(\d+),\s*library version:\s*(\d+)")




def check_franky() -> tuple[Check, Any]:
    """franky importable, its version and its bundled libfranka; returns (check, module)."""
    version = _version("franky-control")
    if version is None:
        return Check("franky", "fail", "franky-control is not installed", FRANKY_INSTALL), None
    try:
        franky = importlib.import_module("franky")
    except (ImportError, OSError) as err:
        return Check("franky", "fail", f"franky-control {version} does not import: {err}",
                     f"reinstall: pip install --force-reinstall franky-control ({FRANKY_INSTALL})"), None
    from rlinf_user.robots.franka.driver import libfranka_version

    lib = libfranka_version() or "unknown"
    return Check("franky", "ok", f"franky-control {version}, bundled libfranka {lib}"), franky


def _hex_ipv4(field: str) -> int:
    return int.from_bytes(bytes.fromhex(field), "little")


def route_to(ip: str, table: str = "/proc/net/route") -> str:
    """How this PC reaches ``ip``: local address and, when known, interface / gateway."""
    import ipaddress
    import socket

    parts = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, FRANKA_COMMAND_PORT))  # UDP connect sends nothing; it picks a route
            local = s.getsockname()[0]
            parts.append(f"from local address {local}")
    except OSError as err:
        return f"no route to {ip} ({err.strerror or err})"
    try:
        address = ipaddress.IPv4Address(ip)
        if address.is_loopback or local == ip:
            return parts[0] + " (this PC itself)"
        dst = int(address)
        with open(table) as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except (ValueError, OSError):
        return parts[0]
    best: tuple[int, str, int] | None = None
    for row in rows:
        if len(row) < 8:
            continue
        try:
            net, gateway, mask = _hex_ipv4(row[1]), _hex_ipv4(row[2]), _hex_ipv4(row[7])
        except ValueError:
            continue
        if dst & mask == net & mask:
            prefix = bin(mask).count("1")
            if best is None or prefix > best[0]:
                best = (prefix, row[0], gateway)
    if best is not None:
        _, iface, gateway = best
        if gateway:
            gw = str(ipaddress.IPv4Address(gateway))
            parts.append(f"via gateway {gw} on {iface}: the robot is NOT on this PC's subnet")
        else:
            parts.append(f"on {iface}, same subnet")
    return ", ".join(parts)


def tcp_probe(ip: str, port: int = FRANKA_COMMAND_PORT,
              timeout_s: float = TCP_PROBE_TIMEOUT_S) -> tuple[bool, str]:  # fmt: skip
    """TCP connect to ``ip:port``: (accepted, why not: refused | timeout | unreachable)."""
    import socket

    try:
        with socket.create_connection((ip, port), timeout=timeout_s):
            return True, ""
    except TimeoutError:
        return False, f"no answer within {timeout_s:g} s"
    except OSError as err:
        return False, (err.strerror or str(err)).lower()


def _incompatible(err: BaseException) -> tuple[int, int] | None:
    """(server version, library version) from libfranka's IncompatibleVersionException."""
    m = _VERSION_RE.search(str(err))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _state_summary(state: Any, has_errors: bool) -> tuple[str, str, str]:
    """(status, detail, fix) of a freshly read robot state."""
    mode = getattr(state.robot_mode, "name", str(state.robot_mode))
    q = ", ".join(f"{v:+.2f}" for v in state.q)
    detail = f"mode {mode}, q [{q}] rad"
    if has_errors:
        return ("warn", f"{detail}; robot errors: {state.current_errors}",
                "the driver recovers automatically on connect; if they persist, clear them in Desk")
    if mode == "UserStopped":
        return "warn", detail, "release the user stop (external activation device)"
    if mode == "Other":
        return ("warn", detail + " (brakes locked or FCI inactive?)",
                "in Desk: unlock the brakes and activate FCI")
    if mode == "Reflex":
        return "warn", detail, "a reflex stopped the robot; the driver recovers on connect"
    return "ok", detail + ", no errors", ""


def _franky_session(franky: Any, ip: str, timeout_s: float) -> dict[str, Any]:
    """Connect with franky (real-time ignored: this is a connectivity check), read one state,
    disconnect. Returns ``connect_s`` and ``summary`` on success, ``error`` on failure, and
    ``stage`` (connect | state | done): how far it got."""
    from rlinf_user.robots.franka.grippers import call_with_timeout

    out: dict[str, Any] = {"stage": "connect"}

    def work() -> None:
        t0 = time.monotonic()
        robot = franky.Robot(ip, realtime_config=franky.RealtimeConfig.Ignore)
        out["connect_s"] = time.monotonic() - t0
        out["stage"] = "state"
        state = robot.state  # waits for a UDP state packet
        out["summary"] = _state_summary(state, bool(robot.has_errors))
        out["stage"] = "done"
        del robot  # franky disconnects when the Robot is destroyed

    try:
        call_with_timeout(work, timeout_s, f"connecting to the Franka at {ip}")
    except BaseException as err:  # noqa: BLE001 - franky.NetworkException, TimeoutError, ...
        out["error"] = err
    return out


def check_robot_connection(franky: Any, ip: str, timeout_s: float) -> list[Check]:
    """The robot row (TCP, then a franky connection and one state) and the libfranka / server
    version row."""
    from rlinf_user.robots.franka.driver import libfranka_version

    lib = libfranka_version() or "?"
    where = f"{ip}:{FRANKA_COMMAND_PORT}"
    ok, why = tcp_probe(ip)
    if not ok:
        route = route_to(ip)
        hint = ("the host is up but nothing listens on the FCI port: FCI not active?"
                if why.startswith("connection refused") else "no host answers at this address")  # fmt: skip
        return [
            Check("robot", "fail", f"{where}: {why} ({hint}; this PC reaches {ip} {route})", _FCI_FIXES),
            Check("libfranka / robot server", "warn", "not checked: the robot is unreachable"),
        ]
    if franky is None:
        return [
            Check("robot", "warn", f"{where} accepts TCP; franky is missing, so no libfranka connection",
                  FRANKY_INSTALL),
            Check("libfranka / robot server", "warn", "not checked: franky is missing", FRANKY_INSTALL),
        ]
    out = _franky_session(franky, ip, timeout_s)
    err = out.get("error")
    versions = f"franky {_version('franky-control')}, libfranka {lib}"
    if err is None:
        status, detail, fix = out["summary"]
        return [
            Check("robot", status,
                  f"connected to {ip} in {out['connect_s']:.2f} s ({versions}): {detail}", fix),
            Check("libfranka / robot server", "ok", f"the robot server accepts libfranka {lib}"),
        ]
    name = type(err).__name__
    versions_bad = _incompatible(err) if name == "IncompatibleVersionException" else None
    if versions_bad is not None:
        server, library = versions_bad
        return [
            Check("robot", "fail", f"{where} refused libfranka {lib}: incompatible versions",
                  "see the libfranka / robot server row"),
            Check("libfranka / robot server", "fail",
                  f"robot server version {server}, but franky's libfranka {lib} speaks version "
                  f"{library}",
                  "install the franky wheel built for this robot's server version (franky's "
                  f"installation guide): {FRANKY_BY_SERVER.format(server=server)}; the libfranka "
                  f"per system image: {FRANKA_COMPATIBILITY}"),
        ]  # fmt: skip
    stage = out["stage"]
    if isinstance(err, TimeoutError):
        if stage == "state":
            detail = (f"{where}: connected, but no robot state arrived within {timeout_s:g} s "
                      "(UDP from the robot is blocked)")  # fmt: skip
            fix = f"allow UDP from {ip} in this PC's firewall (e.g. `sudo ufw allow from {ip}`)"
        else:
            detail = (f"{where} accepts TCP but did not complete the libfranka handshake "
                      f"within {timeout_s:g} s")  # fmt: skip
            fix = f"{_ONE_CLIENT}; {_FCI_FIXES}"
        return [Check("robot", "fail", detail, fix),
                Check("libfranka / robot server", "warn", "not checked: no libfranka connection")]
    message = f"{name}: {err}"
    fix = f"{_FCI_FIXES}; {_ONE_CLIENT}"
    if "udp" in str(err).lower():
        fix = f"allow UDP from {ip} in this PC's firewall; {_FCI_FIXES}"
    return [Check("robot", "fail", f"{where}: {message}", fix),
            Check("libfranka / robot server", "warn", "not checked: no libfranka connection")]


def check_franka_hand(franky: Any, ip: str, timeout_s: float) -> Check:
    """The Franka Hand's server version and state (franky.Gripper on ``ip``:1338)."""
    from rlinf_user.robots.franka.grippers import call_with_timeout

    def work() -> tuple[int, float, float]:
        gripper = franky.Gripper(ip)
        state = gripper.state
        return int(gripper.server_version), float(state.width), float(state.max_width)

    try:
        server, width, max_width = call_with_timeout(work, timeout_s, f"Franka Hand at {ip}")
    except BaseException as err:  # noqa: BLE001
        versions = _incompatible(err)
        if versions is not None:
            return Check("Franka Hand", "fail",
                         f"hand server version {versions[0]}, libfranka speaks version {versions[1]}",
                         "install the franky wheel for the robot's server version (see the "
                         "libfranka / robot server row)")  # fmt: skip
        return Check("Franka Hand", "fail", f"{ip}:1338: {type(err).__name__}: {err}",
                     "is the hand mounted and enabled in Desk (End effector: Franka Hand)? "
                     "otherwise set robot.gripper=none (or robotiq)")  # fmt: skip
    detail = f"server version {server}, width {width * 1e3:.1f} mm"
    if max_width <= 1e-3:
        return Check("Franka Hand", "warn", detail + "; not homed since power-on",
                     "home the hand in Desk once after power-on")
    return Check("Franka Hand", "ok", f"{detail} of {max_width * 1e3:.1f} mm")


def check_robotiq(port: str) -> Check:
    if not port:
        return Check("Robotiq", "fail", "robot.gripper=robotiq but robot.robotiq_port is unset",
                     "robot.robotiq_port=/dev/serial/by-id/<your RS485 adapter>")
    if _version("pymodbus") is None:
        return Check("Robotiq", "fail", "pymodbus is not installed", "pip install 'rlinf-user[robotiq]'")
    if not os.path.exists(port):
        return Check("Robotiq", "fail", f"serial port {port} does not exist",
                     "plug in the RS485 adapter; ls /dev/serial/by-id/ lists the adapters")
    if not os.access(port, os.R_OK | os.W_OK):
        return Check("Robotiq", "fail", f"no read/write access to {port}",
                     "sudo usermod -a -G dialout $USER, then log in again")
    return Check("Robotiq", "ok", f"{port} present (the gripper itself is not contacted)")


def check_camera(cam: dict[str, Any]) -> Check:
    """A configured camera: present by serial (RealSense, ZED), or nothing to check."""
    name, kind = cam.get("name", "?"), cam.get("kind", "realsense")
    serial = cam.get("serial")
    serial = None if serial is None else str(serial)
    row = f"camera {name} ({kind})"
    if cam.get("playback"):
        path = str(cam["playback"])
        if os.path.isfile(path):
            return Check(row, "ok", f"plays back {path}")
        return Check(row, "fail", f"recording {path} not found", "fix the camera's playback path")
    if kind in ("sim", "synthetic"):
        return Check(row, "ok", "simulated: no device")
    if kind == "realsense":
        try:
            from rlinf_user.robots.cameras.realsense import list_serials

            found = list_serials()
        except Exception as err:  # noqa: BLE001 - CameraError (not installed), SDK errors
            if "not installed" in str(err):
                return Check(row, "warn", "pyrealsense2 is not installed: devices not checked",
                             "pip install 'rlinf-user[realsense]'")
            return Check(row, "fail", f"RealSense enumeration failed: {err}",
                         "install librealsense's udev rules; replug the camera")
        sdk = "RealSense"
        no_device_fix = ("plug the camera into a USB 3 port (`rs-enumerate-devices -s` lists "
                         "serials), or fix the camera's serial")  # fmt: skip
    elif kind == "zed":
        from rlinf_user.robots.cameras.zed import ZedSdkMissingError, load_sdk

        try:
            sl = load_sdk()
        except ZedSdkMissingError as err:
            fix = "install the ZED SDK with Stereolabs' installer, then its get_python_api.py"
            why = str(err.__cause__) if err.__cause__ is not None else "pyzed.sl has no sl.Camera"
            if _version("pyzed"):
                fix = "pip uninstall pyzed (an unrelated PyPI package); then " + fix
                why = "the PyPI package 'pyzed' is installed, not the Stereolabs SDK"
            return Check(row, "warn", f"ZED SDK not installed ({why}): devices not checked", fix)
        try:
            found = [str(d.serial_number) for d in sl.Camera.get_device_list()]
        except Exception as err:  # noqa: BLE001
            return Check(row, "fail", f"ZED enumeration failed: {err}", "replug the camera")
        sdk = "ZED"
        no_device_fix = "plug the camera in (ZED_Explorer lists serials), or fix the camera's serial"
    else:
        return Check(row, "fail", f"unknown camera kind {kind!r}", "kind: realsense | zed | sim | synthetic")
    listed = ", ".join(found) or "none"
    if serial is None:
        if len(found) == 1:
            return Check(row, "ok", f"no serial set; the one {sdk} device {found[0]} is used")
        return Check(row, "fail", f"no serial set and {len(found)} {sdk} devices present: {listed}",
                     f"set the camera's serial (one of: {listed})" if found else no_device_fix)
    if serial in found:
        return Check(row, "ok", f"serial {serial} present")
    return Check(row, "fail", f"no {sdk} device with serial {serial}; present: {listed}", no_device_fix)


def check_edge_keys(secret_key: str | None, authorized_keys: str | None, bind: str) -> Check:
    """The daemon's CURVE keys: readable secret key and at least one authorized client key."""
    from pathlib import Path

    from rlinf_user.edge.security import is_loopback

    keygen = ("rlinf-user edge keygen keys/, then secret_key=keys/edge.key_secret "
              "authorized_keys=keys/authorized")  # fmt: skip
    if not secret_key and not authorized_keys:
        if is_loopback(bind):
            return Check("edge keys", "warn",
                         f"unset: the daemon is unauthenticated and serves loopback only (bind={bind})",
                         keygen)  # fmt: skip
        return Check("edge keys", "fail",
                     f"unset, but bind={bind} is not loopback: the daemon refuses to start", keygen)
    if not secret_key or not authorized_keys:
        missing = "secret_key" if not secret_key else "authorized_keys"
        return Check("edge keys", "fail", f"{missing} is unset (both are needed)", keygen)
    import zmq.auth

    secret = Path(secret_key).expanduser()
    if not secret.is_file():
        return Check("edge keys", "fail", f"secret_key {secret} does not exist", keygen)
    try:
        _, sec = zmq.auth.load_certificate(str(secret))
    except Exception as err:  # noqa: BLE001 - OSError, ValueError
        return Check("edge keys", "fail", f"secret_key {secret}: {err}", keygen)
    if not sec:
        return Check("edge keys", "fail", f"{secret} holds no secret key", "use the *.key_secret file")
    folder = Path(authorized_keys).expanduser()
    if not folder.is_dir():
        return Check("edge keys", "fail", f"authorized_keys {folder} is not a folder", keygen)
    good, bad = [], []
    for path in sorted(folder.glob("*.key")):
        try:
            zmq.auth.load_certificate(str(path))
            good.append(path.name)
        except Exception:  # noqa: BLE001
            bad.append(path.name)
    if not good:
        extra = f" (unreadable: {', '.join(bad)})" if bad else ""
        return Check("edge keys", "fail", f"no client public key (*.key) in {folder}{extra}",
                     "copy the training side's client.key into that folder")  # fmt: skip
    detail = f"secret key {secret} readable; {len(good)} authorized client key(s) in {folder}"
    if bad:
        return Check("edge keys", "warn", f"{detail}; unreadable: {', '.join(bad)}", "remove or fix them")
    return Check("edge keys", "ok", detail)


def _robot_ip_overrides(overrides: Sequence[str]) -> list[str]:
    """Let a missing ``robot.ip`` become a row instead of a config error: default it to null."""
    keys = {ov.split("=", 1)[0].lstrip("+~") for ov in overrides}
    if "robot.ip" in keys or "franky_sim" in keys or "robot" in keys:
        return list(overrides)
    return ["robot.ip=null", *overrides]


def run_robot_checks(robot: str, overrides: Sequence[str] = ()) -> list[Check]:
    """The robot PC's checks for ``robot`` with the edge config's ``overrides``."""
    if robot != "franka":
        return [Check("robot", "fail", f"no robot checks for {robot!r}", "known: --robot franka")]
    from omegaconf import OmegaConf

    from rlinf_user.config.compose import ConfigError
    from rlinf_user.edge.config import compose_edge_config

    franky_check, franky = check_franky()
    checks = [franky_check]
    try:
        cfg = compose_edge_config(_robot_ip_overrides(overrides), robot=robot)
    except ConfigError as err:
        checks.append(Check("edge config", "fail", str(err), "fix the KEY=VALUE overrides"))
        cfg = None
    robot_cfg: dict[str, Any] = {}
    if cfg is not None:
        robot_cfg = OmegaConf.to_container(cfg.robot, resolve=True) or {}
        cams = len(cfg.cameras)
        checks.append(Check("edge config", "ok",
                            f"robot.ip={robot_cfg.get('ip') or '(unset)'}, robot.realtime="
                            f"{str(robot_cfg.get('realtime', True)).lower()}, gripper "
                            f"{robot_cfg.get('gripper', 'franka_hand')}, {cams} camera(s), "
                            f"bind {cfg.bind}:{cfg.port}"))  # fmt: skip
        ip = robot_cfg.get("ip")
        if cfg.franky_sim:
            checks.append(Check("robot", "ok", f"franky_sim=true: the edge daemon starts a simulated "
                                               f"Franka on {ip}; no robot to check"))  # fmt: skip
        elif not ip:
            checks.append(Check("robot", "fail", "robot.ip is not set: no robot to check",
                                "rlinf-user doctor --robot franka robot.ip=<the robot's FCI address, "
                                "e.g. 172.16.0.2>"))  # fmt: skip
        else:
            ip = str(ip)
            timeout_s = float(robot_cfg.get("connect_timeout_s", 10.0))
            rows = check_robot_connection(franky, ip, timeout_s)
            checks += rows
            gripper = robot_cfg.get("gripper", "franka_hand")
            if gripper == "franka_hand" and franky is not None and rows[0].status != "fail":
                checks.append(check_franka_hand(franky, ip, timeout_s))
            elif gripper == "robotiq":
                checks.append(check_robotiq(str(robot_cfg.get("robotiq_port") or "")))
    realtime = None if cfg is None else bool(robot_cfg.get("realtime", True))
    if cfg is not None and cfg.franky_sim:
        realtime = False
    checks.append(check_rt_kernel(realtime))
    checks.append(check_sched_fifo(realtime, 0 if cfg is None else int(cfg.realtime_priority)))
    checks.append(check_cpu_governor())
    if cfg is not None:
        if not cfg.cameras:
            checks.append(Check("cameras", "ok", "none configured"))
        for cam in cfg.cameras:
            checks.append(check_camera(OmegaConf.to_container(cam, resolve=True)))
        checks.append(check_edge_keys(cfg.secret_key, cfg.authorized_keys, str(cfg.bind)))
    return checks
