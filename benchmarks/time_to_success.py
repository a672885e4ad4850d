"""End-to-end wall-clock (and env steps) to a success threshold, from runs' eval/history.csv.

Run the training first, e.g. ``rlinf-user train --sim gym_hil target_success=0.9
run_name=pick-s0``; then ``python benchmarks/time_to_success.py runs/pick-s*``.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np


def first_reaching(run: Path, threshold: float) -> dict:
    with open(run / "eval" / "history.csv") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if float(row["success_rate"]) >= threshold:
            return {"run": run.name, "reached": True, "wall_minutes": round(float(row["wall_seconds"]) / 60, 2),
                    "env_steps": int(row["env_steps"]), "updates": int(row["updates"]),
                    "success_rate": float(row["success_rate"])}
    last = rows[-1] if rows else {}
    return {"run": run.name, "reached": False, "best": max((float(r["success_rate"]) for r in rows), default=0.0),
            "wall_minutes": round(float(last.get("wall_seconds", 0)) / 60, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [first_reaching(r, args.threshold) for r in args.runs]
    reached = [r["wall_minutes"] for r in rows if r["reached"]]
    result = {"threshold": args.threshold, "runs": rows,
              "median_wall_minutes": float(np.median(reached)) if reached else None,
              "reached": f"{len(reached)}/{len(rows)}"}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
