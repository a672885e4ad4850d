"""Environment checks behind ``rlinf-user doctor``: what is installed, what is missing, the fix."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass


@dataclass
class Check:
    name: str
    status: str  # ok | missing | warn | error (environment); ok | warn | fail (robot PC)
    detail: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _package(name: str, dist: str, fix: str, required: bool = False) -> Check:
    v = _version(dist)
    if v is None:
        return Check(name, "error" if required else "missing", "not installed", fix)
    return Check(name, "ok", v)


def check_torch() -> Check:
    try:
        import torch
    except ImportError:
        return Check("torch", "error", "not installed", "bash scripts/install.sh")
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        return Check("torch", "ok", f"{torch.__version__}, CUDA {torch.version.cuda}: {names}")
    gpu_present = shutil.which("nvidia-smi") is not None
    if gpu_present and "+cpu" in torch.__version__:
        return Check("torch", "warn", f"{torch.__version__} (CPU build) but an NVIDIA GPU is present",
                     "reinstall: bash scripts/install.sh (picks the CUDA build when nvidia-smi works)")
    return Check("torch", "ok", f"{torch.__version__} (CPU only)")


def check_vulkan() -> Check:
    from rlinf_user.sims.vulkan import vulkan_status

    s = vulkan_status()
    return Check("vulkan (ManiSkill)", "ok" if s.get("ok") else "missing", s.get("detail", ""), s.get("fix", ""))


def check_pyzed() -> Check:
    try:
        importlib.import_module("pyzed.sl")
        return Check("ZED SDK (pyzed.sl)", "ok", "found")
    except ImportError:
        impostor = _version("pyzed")
        if impostor:
            return Check("ZED SDK (pyzed.sl)", "error",
                         f"the PyPI package 'pyzed' {impostor} is installed: it is NOT the Stereolabs SDK",
                         "pip uninstall pyzed; install the ZED SDK and its Python API from Stereolabs")
        return Check("ZED SDK (pyzed.sl)", "missing", "not installed (only needed for ZED cameras)",
                     "install the ZED SDK from Stereolabs, then its get_python_api.py")


def check_ffmpeg() -> Check:
    try:
        import imageio_ffmpeg

        return Check("ffmpeg (eval videos)", "ok", imageio_ffmpeg.get_ffmpeg_exe())
    except Exception as err:  # noqa: BLE001
        return Check("ffmpeg (eval videos)", "missing", str(err), "pip install imageio-ffmpeg")


def check_gpu() -> Check:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Check("NVIDIA GPU", "warn", "none found: simulation and learning run on the CPU")
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        return Check("NVIDIA GPU", "error", f"nvidia-smi failed: {err}")
    return Check("NVIDIA GPU", "ok", out or "nvidia-smi found")


def robosuite_env_check() -> Check:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = os.path.join(here, ".venv-robosuite", "bin", "python")
    if _version("robosuite"):
        return Check("robosuite", "ok", _version("robosuite"))
    if os.path.exists(venv):
        return Check("robosuite", "ok", f"in its own environment: {venv}")
    return Check("robosuite", "missing", "not installed (needs numpy<2: its own environment)",
                 "bash scripts/install_robosuite_env.sh")


def check_teleop() -> list[Check]:
    """SpaceMouse over HID and input-event devices (keyboard, gamepad) for teleop."""
    out = []
    try:
        import hid  # noqa: F401
    except ImportError:
        out.append(Check("SpaceMouse (hidapi)", "missing", "hidapi not installed", "pip install -e '.[teleop]'"))
    else:
        from rlinf_user.robots.teleop.spacemouse import list_spacemice

        mice = list_spacemice()
        if mice:
            out.append(Check("SpaceMouse (hidapi)", "ok", ", ".join(m["product"] for m in mice)))
        else:
            out.append(Check("SpaceMouse (hidapi)", "warn", "none plugged in (or its hidraw node is not readable)",
                             "plug it in; allow access with a udev rule, e.g. "
                             'KERNEL=="hidraw*", ATTRS{idVendor}=="256f", MODE="0666"'))
    import glob
    import os

    nodes = glob.glob("/dev/input/event*")
    readable = [n for n in nodes if os.access(n, os.R_OK)]
    if not nodes:
        out.append(Check("keyboard/gamepad (evdev)", "warn", "no /dev/input/event* devices on this machine"))
    elif not readable:
        out.append(Check("keyboard/gamepad (evdev)", "warn", f"{len(nodes)} input devices, none readable",
                         "sudo usermod -aG input $USER (then log in again)"))
    else:
        out.append(Check("keyboard/gamepad (evdev)", "ok", f"{len(readable)} readable input devices"))
    return out


def run_checks() -> list[Check]:
    """Versions, devices, simulators and drivers of this machine (robot PC checks:
    :func:`run_robot_checks`)."""
    checks = [
        Check("python", "ok", platform.python_version()),
        check_torch(),
        check_gpu(),
        _package("ray", "ray", "pip install 'ray[default]'", required=True),
        _package("hydra-core", "hydra-core", "pip install hydra-core", required=True),
        _package("gymnasium", "gymnasium", "pip install gymnasium", required=True),
        _package("pyzmq", "pyzmq", "pip install pyzmq", required=True),
        _package("mani_skill", "mani_skill", "pip install -e '.[maniskill]'"),
        _package("sapien", "sapien", "pip install -e '.[maniskill]'"),
        check_vulkan(),
        _package("gym_hil", "gym_hil", "pip install -e '.[gym-hil]'"),
        _package("mujoco", "mujoco", "pip install -e '.[gym-hil]'"),
        robosuite_env_check(),
        _package("robocasa", "robocasa", "install robocasa from its repository (in the robosuite environment)"),
        check_ffmpeg(),
        _package("franky (Franka control)", "franky-control", "pip install -e '.[franka]'"),
        _package("franky-sim (Franka simulator)", "franky-sim", "pip install -e '.[franka-sim]'"),
        _package("pyrealsense2", "pyrealsense2", "pip install -e '.[realsense]' (and apt libusb-1.0-0)"),
        check_pyzed(),
        *check_teleop(),
    ]
    return checks


def has_failures(checks: list[Check]) -> bool:
    """Whether any check failed (the CLI exits non-zero then)."""
    return any(c.status in ("fail", "error") for c in checks)
