"""What a benchmark ran on, recorded next to its results."""

from __future__ import annotations

import os
import platform
from typing import Any


def describe() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        torch_version = torch.__version__
    except ImportError:
        gpu, torch_version = None, None
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1), "gpu": gpu,
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch_version,
    }  # fmt: skip


def franky_sim_footer(m: dict[str, Any]) -> str:
    """The machine line of a franky-sim benchmark's markdown table."""
    return (f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}; franky-sim "
            "runs its 1 kHz physics loop in Python on the same cores.")
