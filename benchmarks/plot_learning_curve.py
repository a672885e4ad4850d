"""Plot evaluation success vs wall-clock and vs env steps from runs' eval/history.csv."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def read_history(run_dir: Path) -> list[dict[str, float]]:
    with open(run_dir / "eval" / "history.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(10, 3.8))
    for run in args.runs:
        rows = read_history(run)
        label = run.name
        ax_t.plot([r["wall_seconds"] / 60 for r in rows], [r["success_rate"] for r in rows], marker="o", label=label)
        ax_s.plot([r["env_steps"] / 1000 for r in rows], [r["success_rate"] for r in rows], marker="o", label=label)
    for ax, xl in ((ax_t, "wall-clock (minutes)"), (ax_s, "env steps (thousands)")):
        ax.set_xlabel(xl)
        ax.set_ylabel("eval success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.axhline(0.9, color="grey", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    ax_s.legend(fontsize=7, loc="lower right")
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
