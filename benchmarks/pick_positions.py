"""Where a pick policy fails: a checkpoint evaluated on held-out block positions, each
episode's success beside the block's initial position (read from the simulator after the
same seeded reset), as JSON and a scatter plot.

    python benchmarks/pick_positions.py RUN_DIR --checkpoint best --split test --episodes 100 \
        --name pick_pixels_positions_s0

Runs ``rlinf-user eval`` on the run (its config, its checkpoint), so the episodes are the
split's own (``validation`` positions are those training's evaluations chose ``best.pt``
by; ``test`` positions nothing selected on). Writes ``benchmarks/results/<name>.json`` and
``<name>.png``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def positions(run: Path, seeds: list[int]) -> list[list[float]]:
    """The block's initial position after each seeded reset, in the run's env."""
    from omegaconf import OmegaConf

    from rlinf_user.env.registry import make_env

    cfg = OmegaConf.load(run / "config.yaml")
    env = make_env(cfg.env, seed=0)
    out = []
    try:
        for s in seeds:
            env.reset(seed=int(s))
            out.append([round(float(v), 4) for v in env.block_position[:2]])
    finally:
        env.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--checkpoint", default="best", choices=["best", "latest"])
    ap.add_argument("--split", default="test", choices=["test", "validation"])
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    from rlinf_user.cli.main import main as cli

    with tempfile.TemporaryDirectory() as tmp:
        rc = cli(["eval", str(args.run), "--checkpoint", args.checkpoint, "--split", args.split, "--episodes",
                  str(args.episodes), "--video-episodes", "0", "--out", tmp])  # fmt: skip
        if rc != 0:
            raise SystemExit(f"rlinf-user eval exited {rc}")
        result = json.loads(next(Path(tmp).glob("eval-*.json")).read_text())
    episodes = result["per_episode"]
    xy = positions(args.run, [e["seed"] for e in episodes])
    rows = [{"seed": e["seed"], "success": bool(e["success"]), "block_xy": p} for e, p in zip(episodes, xy)]
    out = {"what": "a pick policy's success per held-out block position", "run": args.run.name,
           "checkpoint": args.checkpoint, "split": args.split, "episodes": len(rows),
           "success_rate": result["success_rate"], "success_ci95": result["success_ci95"],
           "distinct_initial_states": result["distinct_initial_states"], "policy_version": result.get("policy_version"),
           "rows": rows, "machine": describe()}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = np.array([r["block_xy"] for r in rows])
    ok = np.array([r["success"] for r in rows])
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(p[ok, 0], p[ok, 1], c="tab:green", s=18, label=f"success ({ok.sum()})")
    ax.scatter(p[~ok, 0], p[~ok, 1], c="tab:red", marker="x", s=30, label=f"failure ({(~ok).sum()})")
    ax.set_xlabel("block x (m)")
    ax.set_ylabel("block y (m)")
    ax.set_title(f"{args.run.name}, {args.checkpoint}.pt, {len(rows)} {args.split} positions", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.name}.png", dpi=110)
    print(f"{ok.mean():.0%} of {len(rows)} {args.split} positions; failures at {p[~ok].tolist()}")


if __name__ == "__main__":
    main()
