"""Run the benchmarks and write benchmarks/results/*.json (plus the machine description)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def machine() -> dict:
    from machine import describe

    return describe()


def main() -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "machine.json").write_text(json.dumps(machine(), indent=2))
    for script, out in (("bench_env.py", "env_steps.json"), ("bench_learner.py", "learner_updates.json")):
        subprocess.run([sys.executable, str(HERE / script), "--out", str(RESULTS / out)], check=True)


if __name__ == "__main__":
    main()
