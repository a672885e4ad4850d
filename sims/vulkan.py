"""Vulkan driver discovery for SAPIEN/ManiSkill.

SAPIEN renders (and ManiSkill 3 creates a render device even for state observations)
through Vulkan. On machines with an NVIDIA driver the system ICD is used. On CPU-only
machines ``scripts/install_system_deps.sh`` unpacks Mesa's software Vulkan driver
(lavapipe) into ``${RLINF_USER_DEPS:-~/.cache/rlinf-user}/mesa``; :func:`ensure_vulkan`
points the Vulkan loader at it. It must run before ``sapien`` is imported, because the
loader reads ``VK_ICD_FILENAMES`` when SAPIEN creates its Vulkan instance.

Importing this module has no side effects.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FIX_COMMAND = "bash scripts/install_system_deps.sh"
FIX_MESSAGE = (
    "SAPIEN/ManiSkill need a Vulkan driver. On a machine with an NVIDIA GPU install the "
    "NVIDIA driver (it ships the Vulkan ICD); on a CPU-only machine run "
    f"`{FIX_COMMAND}` from the rlinf-user checkout, which installs the Vulkan loader and a "
    "private software driver (Mesa lavapipe). `rlinf-user doctor` shows what was found."
)

# Where Vulkan loaders look for installable client drivers (ICDs) by default.
_SYSTEM_ICD_DIRS = (
    "/usr/share/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
    "/etc/vulkan/icd.d",
)


def deps_dir() -> Path:
    """Folder the installer puts private system pieces in (``$RLINF_USER_DEPS``)."""
    return Path(os.environ.get("RLINF_USER_DEPS") or Path.home() / ".cache" / "rlinf-user")


def lavapipe_icd() -> Path:
    """Path of the ICD json of the private lavapipe copy (may not exist)."""
    return deps_dir() / "mesa" / "usr" / "share" / "vulkan" / "icd.d" / "lvp_icd.json"


def system_icds() -> list[Path]:
    """ICD json files in the system's default Vulkan search folders."""
    found: list[Path] = []
    for folder in _SYSTEM_ICD_DIRS:
        path = Path(folder)
        if path.is_dir():
            found.extend(sorted(path.glob("*.json")))
    return found


def nvidia_driver_present() -> bool:
    """True when an NVIDIA kernel driver or NVIDIA Vulkan ICD is installed."""
    if Path("/proc/driver/nvidia/version").exists():
        return True
    return any("nvidia" in icd.name.lower() for icd in system_icds())


def vulkan_loader() -> str | None:
    """Name of the Vulkan loader library (``libvulkan.so.1``) if the system has it."""
    return ctypes.util.find_library("vulkan")


def ensure_vulkan() -> str | None:
    """Point the Vulkan loader at the private lavapipe when nothing better is configured.

    Sets ``VK_ICD_FILENAMES`` to :func:`lavapipe_icd` when the variable is unset, no
    NVIDIA driver is present and the file exists. Returns the ICD path now in effect
    through ``VK_ICD_FILENAMES`` (``None``: the loader's defaults apply). Idempotent.
    """
    current = os.environ.get("VK_ICD_FILENAMES")
    if current:
        return current
    if nvidia_driver_present():
        return None
    icd = lavapipe_icd()
    if not icd.is_file():
        return None
    if "sapien" in sys.modules:
        logger.warning(
            "sapien was imported before ensure_vulkan(); the software Vulkan driver at %s "
            "may not be picked up. Call rlinf_user.sims.vulkan.ensure_vulkan() first.",
            icd,
        )
    os.environ["VK_ICD_FILENAMES"] = str(icd)
    logger.info("using software Vulkan (lavapipe): VK_ICD_FILENAMES=%s", icd)
    return str(icd)


def vulkan_status() -> dict[str, Any]:
    """What Vulkan setup this machine has, for ``rlinf-user doctor``.

    Keys: ``ok`` (a driver was found), ``driver`` (``"VK_ICD_FILENAMES"``, ``"nvidia"``,
    ``"lavapipe"``, ``"system"`` or ``None``), ``icd`` (path of the ICD json or ``None``),
    ``loader`` (the Vulkan loader library or ``None``) and ``fix`` (what to run, or ``None``).
    Reads only; does not change the environment.
    """
    loader = vulkan_loader()
    env_icd = os.environ.get("VK_ICD_FILENAMES")
    driver: str | None = None
    icd: str | None = None
    if env_icd:
        paths = [p for p in env_icd.split(os.pathsep) if p]
        if paths and all(Path(p).is_file() for p in paths):
            driver, icd = "VK_ICD_FILENAMES", env_icd
    elif nvidia_driver_present():
        nvidia = [p for p in system_icds() if "nvidia" in p.name.lower()]
        driver, icd = "nvidia", str(nvidia[0]) if nvidia else None
    elif lavapipe_icd().is_file():
        driver, icd = "lavapipe", str(lavapipe_icd())
    elif system_icds():
        driver, icd = "system", str(system_icds()[0])
    ok = driver is not None and loader is not None
    fix: str | None = None
    if not ok:
        missing = "the Vulkan loader (libvulkan.so.1)" if loader is None else "a Vulkan driver"
        if env_icd and driver is None:
            missing = f"the ICD file(s) named by VK_ICD_FILENAMES={env_icd}"
        fix = f"missing {missing}. {FIX_MESSAGE}"
    return {"ok": ok, "driver": driver, "icd": icd, "loader": loader, "fix": fix}
