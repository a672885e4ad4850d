"""HG-DAgger with a synthetic supervisor: autonomous success and intervention rate per round.

For each seed, runs ``rlinf-user hg-dagger --sim gym_hil`` with a randomised block
position and ``hg_dagger.synthetic_human=true``: a scripted supervisor records 2
demonstrations on a simulated SpaceMouse (HID reports through the device parser), the
policy is cloned from them, then each round runs 8 episodes in which the supervisor takes
over when the task stalls (no progress along the pick for 5 steps: hovering, dithering,
closing on nothing) and keeps control 8 steps, and 10 hands-off evaluation episodes. The
learner retrains continuously in a Ray actor.

    python benchmarks/bench_hg_dagger.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def run_seed(seed: int, rounds: int, work: Path) -> dict:
    from rlinf_user.cli.main import main

    argv = [
        "hg-dagger", "--sim", "gym_hil", "env.kwargs.random_block_position=true", "env.max_episode_steps=50",
        "hg_dagger.synthetic_human=true", "hg_dagger.synthetic_demos=2", f"hg_dagger.rounds={rounds}", "hg_dagger.episodes_per_round=8",
        "hg_dagger.eval_episodes=10", "teleop.rate_hz=50", f"seed={seed}", f"run_root={work}", f"run_name=s{seed}",
    ]  # fmt: skip
    t0 = time.time()
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"seed {seed}: hg-dagger exited {rc}")
    summary = json.loads((work / f"s{seed}" / "hg_dagger.json").read_text())
    shutil.copy(work / f"s{seed}" / "episodes.csv", RESULTS / f"hg_dagger_s{seed}_episodes.csv")
    return {"seed": seed, "wall_s": round(time.time() - t0, 1), **summary}


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in ((ax1, "autonomous_success", "autonomous success (10 hands-off episodes)"),
                           (ax2, "intervention_rate", "intervention rate (supervisor-controlled steps)")):  # fmt: skip
        rows = [[row for row in r["rounds"] if row[key] is not None] for r in runs]
        for r, rs in zip(runs, rows, strict=True):
            ax.plot([row["round"] for row in rs], [row[key] for row in rs], marker="o", alpha=0.6, label=f"seed {r['seed']}")
        mean = np.mean([[row[key] for row in rs] for rs in rows], axis=0)
        ax.plot([row["round"] for row in rows[0]], mean, color="black", linewidth=2.5, label="mean")
        ax.set_xlabel("round (0: cloned from 2 demos; then 8 corrected episodes each)")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle("HG-DAgger on gym_hil pick-cube (random block), synthetic supervisor on a SpaceMouse")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-hg-dagger-"))
    runs = [run_seed(s, args.rounds, work) for s in args.seeds]
    last2 = [row for r in runs for row in r["rounds"][-2:]]
    out = {
        "task": "gym_hil PandaPickCube, random block position, state, HG-DAgger (BC learner), synthetic supervisor",
        "machine": describe(),
        "runs": runs,
        "demos_only_autonomous_success": round(float(np.mean([r["rounds"][0]["autonomous_success"] for r in runs])), 3),
        "first_round_intervention_rate": round(float(np.mean([r["rounds"][1]["intervention_rate"] for r in runs])), 3),
        "mean_last_two_rounds": {
            "autonomous_success": round(float(np.mean([r["autonomous_success"] for r in last2])), 3),
            "intervention_rate": round(float(np.mean([r["intervention_rate"] for r in last2])), 3),
        },
        "date": time.strftime("%Y-%m-%d"),
    }
    (RESULTS / "hg_dagger.json").write_text(json.dumps(out, indent=2, default=str))
    plot(runs, RESULTS / "hg_dagger_curve.png")
    keys = ("demos_only_autonomous_success", "first_round_intervention_rate", "mean_last_two_rounds")
    print(json.dumps({k: out[k] for k in keys}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
