"""HG-DAgger with a synthetic supervisor: autonomous success and intervention rate per round.

``--task pick`` (default): for each seed, runs ``rlinf-user hg-dagger --sim gym_hil`` with a randomised block
position and ``hg_dagger.synthetic_human=true``: a scripted supervisor records 2
demonstrations on a simulated SpaceMouse (HID reports through the device parser), the
policy is cloned from them, then each round runs 8 episodes in which the supervisor takes
over when the task stalls (no progress along the pick for 5 steps: hovering, dithering,
closing on nothing) and keeps control 8 steps, and 10 hands-off evaluation episodes. The
learner retrains continuously in a Ray actor.

``--task pi0``: the pick setting with ``policy=pi0`` (the pi0 architecture at its tiny size,
from the robot state; chunks of 4 actions, the flow-matching loss on the action expert).

``--task vla``: ``policy=lite_vla`` (real EfficientNet-Lite0 and SmolLM2 weights, 4 VLM
layers, chunks of 4; the action expert trained) on the language-conditioned visual reach
``--sim reach_color`` from its top camera and the instruction: 5 synthetic demonstrations,
then rounds of 6 corrected episodes (the synthetic supervisor takes over when the TCP stops
closing in on the named target) and 10 hands-off evaluation episodes. The session runs at
5 Hz, not 10: on two CPU cores the learner makes about 3 updates/s, a GPU learner hundreds,
so the slower clock gives it per episode a share of the updates a GPU would.

Evaluation episodes reset from seeds no demonstration or corrected episode uses, one
distinct initial state each.

    python benchmarks/bench_hg_dagger.py --seeds 0 1 2
    python benchmarks/bench_hg_dagger.py --task vla --seeds 0 1 --rounds 4
    python benchmarks/bench_hg_dagger.py --task pi0 --seeds 0 1 2
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


TASKS = {
    "pick": {
        "name": "hg_dagger",
        "title": "HG-DAgger on gym_hil pick-cube (random block), synthetic supervisor on a SpaceMouse",
        "task": "gym_hil PandaPickCube, random block position, state, HG-DAgger (BC learner), synthetic supervisor",
        "round0": "cloned from 2 demos",
        "argv": ["--sim", "gym_hil", "env.kwargs.random_block_position=true", "env.max_episode_steps=50",
                 "hg_dagger.synthetic_demos=2", "hg_dagger.episodes_per_round=8", "teleop.rate_hz=50"],
    },
    "pi0": {
        "name": "hg_dagger_pi0",
        "title": "HG-DAgger of a tiny pi0 (chunks of 4) on gym_hil pick-cube (random block), synthetic supervisor",
        "task": "gym_hil PandaPickCube, random block position, state, policy=pi0 (tiny, chunks of 4, action expert "
                "trained), HG-DAgger (flow-matching BC learner), synthetic supervisor",
        "round0": "cloned from 2 demos",
        "argv": ["--sim", "gym_hil", "env.kwargs.random_block_position=true", "env.max_episode_steps=50",
                 "policy=pi0", "policy.horizon=4", "hg_dagger.synthetic_demos=2", "hg_dagger.episodes_per_round=8",
                 "teleop.rate_hz=50"],
    },
    "vla": {
        "name": "hg_dagger_vla",
        "title": "HG-DAgger of lite_vla on reach_color (camera + instruction), synthetic supervisor",
        "task": "reach_color (top camera 64x64, instruction names the goal colour), policy=lite_vla (4 VLM layers, "
                "chunks of 4, expert trained), HG-DAgger (flow-matching BC learner), synthetic supervisor",
        "round0": "cloned from 5 demos",
        "argv": ["--sim", "reach_color", "policy=lite_vla", "policy.vlm_layers=4", "env.max_episode_steps=30",
                 "hg_dagger.synthetic_demos=5", "hg_dagger.episodes_per_round=6", "hg_dagger.warmup_updates=300",
                 "hg_dagger.batch_size=32", "hg_dagger.lr=3e-4", "hg_dagger.publish_every=20", "hg_dagger.updates_per_s=20",
                 "teleop.rate_hz=5"],
    },
}  # fmt: skip


def run_seed(task: dict, seed: int, rounds: int, work: Path, name: str | None = None) -> dict:
    from rlinf_user.cli.main import main

    argv = ["hg-dagger", *task["argv"], "hg_dagger.synthetic_human=true", f"hg_dagger.rounds={rounds}",
            "hg_dagger.eval_episodes=10", f"seed={seed}", f"run_root={work}", f"run_name=s{seed}"]  # fmt: skip
    t0 = time.time()
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"seed {seed}: hg-dagger exited {rc}")
    summary = json.loads((work / f"s{seed}" / "hg_dagger.json").read_text())
    shutil.copy(work / f"s{seed}" / "episodes.csv", RESULTS / f"{name or task['name']}_s{seed}_episodes.csv")
    return {"seed": seed, "wall_s": round(time.time() - t0, 1), **summary}


def plot(runs: list[dict], path: Path, task: dict) -> None:
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
        ax.set_xlabel(f"round (0: {task['round0']}; then corrected episodes)")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(task["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--task", choices=sorted(TASKS), default="pick")
    ap.add_argument("--name", default=None, help="results file name (default: the task's), e.g. for a one-seed recheck")
    args = ap.parse_args()
    task = TASKS[args.task]
    RESULTS.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-hg-dagger-"))
    runs = [run_seed(task, s, args.rounds, work, args.name) for s in args.seeds]
    last2 = [row for r in runs for row in r["rounds"][-2:]]
    out = {
        "task": task["task"],
        "evaluation": "10 hands-off episodes per round, each from its own reset seed (distinct initial states no training episode used)",
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
    name = args.name or task["name"]
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2, default=str))
    plot(runs, RESULTS / f"{name}_curve.png", task)
    keys = ("demos_only_autonomous_success", "first_round_intervention_rate", "mean_last_two_rounds")
    print(json.dumps({k: out[k] for k in keys}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
