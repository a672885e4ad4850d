"""Run the benchmarks and write benchmarks/results/*.json (plus the machine description)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def machine() -> dict:
    import torch

    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "python": platform.python_version(), "torch": torch.__version__}


def main() -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "machine.json").write_text(json.dumps(machine(), indent=2))
    for script, out in (("bench_env.py", "env_steps.json"), ("bench_learner.py", "learner_updates.json")):
        subprocess.run([sys.executable, str(HERE / script), "--out", str(RESULTS / out)], check=True)


if __name__ == "__main__":
    main()
