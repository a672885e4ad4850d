"""Online RL with and without a supervisor who intervenes (HIL-SERL style).

For each seed, trains SAC on gym_hil's pick-cube with a random block position twice:

* ``sac``: the policy alone, no demonstrations;
* ``sac+supervisor``: ``intervention.enabled=true intervention.synthetic_human=true
  algo.demo_ratio=0.5``: a scripted supervisor on a simulated SpaceMouse (HID reports
  through the device parser) takes over when the task stalls; the steps it controls go to
  the online buffer and are drawn on the demo side of every batch.

Both stop at ``target_success`` or ``--minutes``. Reported: evaluation success over env
steps and wall-clock, the first point reaching the target, and the supervisor's share of
the steps per window of env steps (from the run's replay log).

    python benchmarks/bench_hil_serl.py --seeds 0 --minutes 10 [--block fixed] [--variants sac+supervisor]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = {
    "sac": [],
    "sac+supervisor": ["intervention.enabled=true", "intervention.synthetic_human=true", "algo.demo_ratio=0.5"],
    # the same with SAC-Flow's flow-matching policy in place of the tanh-Gaussian
    "sac_flow+supervisor": ["algo=sac_flow", "policy=flow", "intervention.enabled=true", "intervention.synthetic_human=true",
                            "algo.demo_ratio=0.5"],
}


def intervention_windows(run: Path, window: int = 2000) -> list[dict]:
    from rlinf_user.data.record_log import RecordLog

    flags = [c["intervention"][c["env_id"] == 0] for c in RecordLog(run / "buffer").read_all()]
    flags = np.concatenate(flags) if flags else np.zeros(0, bool)
    return [
        {"env_steps": int(i + window), "intervention_rate": round(float(flags[i : i + window].mean()), 3)}
        for i in range(0, len(flags) - window + 1, window)
    ]


def run_variant(name: str, seed: int, minutes: float, target: float, work: Path, block: str = "random",
                eval_episodes: int = 10, eval_every: int = 3000) -> dict:
    from rlinf_user.cli.main import main

    run_name = f"{block}_{name.replace('+', '_')}_s{seed}"
    argv = [
        "train", "--sim", "gym_hil", f"env.kwargs.random_block_position={str(block == 'random').lower()}", f"seed={seed}",
        f"target_success={target}", f"max_wall_minutes={minutes}", "total_env_steps=1000000",
        f"eval_every_steps={eval_every}", f"eval_episodes={eval_episodes}", f"run_root={work}", f"run_name={run_name}", "progress=false",
        *VARIANTS[name],
    ]  # fmt: skip
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"{name} seed {seed}: train exited {rc}")
    run = work / run_name
    with open(run / "eval" / "history.csv") as f:
        history = list(csv.DictReader(f))
    summary = json.loads((run / "eval" / "summary.json").read_text())
    reached = next((h for h in history if float(h["success_rate"]) >= target), None)
    shutil.copy(run / "eval" / "history.csv", RESULTS / f"hil_serl_{run_name}_history.csv")
    return {
        "variant": name,
        "block": block,
        "eval_episodes": eval_episodes,
        "eval_every_steps": eval_every,
        "max_minutes": minutes,
        "seed": seed,
        "reached_target": reached is not None,
        "env_steps_to_target": int(reached["env_steps"]) if reached else None,
        "minutes_to_target": round(float(reached["wall_seconds"]) / 60, 2) if reached else None,
        "best_eval_success": summary["best_eval_success"],
        "env_steps": summary["env_steps"],
        "interventions": summary.get("interventions", 0),
        "intervention_windows": intervention_windows(run) if VARIANTS[name] else [],
        "history": [{k: float(v) for k, v in h.items()} for h in history],
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in rows:
        h = r["history"]
        ax1.plot([x["env_steps"] for x in h], [x["success_rate"] for x in h], marker="o",
                 label=f"{r['variant']} s{r['seed']}")  # fmt: skip
        if r["intervention_windows"]:
            w = r["intervention_windows"]
            ax2.plot([x["env_steps"] for x in w], [x["intervention_rate"] for x in w], marker=".", label=f"{r['variant']} s{r['seed']}")
    ax1.set_title(f"evaluation success ({rows[0].get('eval_episodes', 10)} block positions)", fontsize=10)
    ax2.set_title("supervisor-controlled share of worker 0's steps", fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xlabel("env steps")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"gym_hil pick-cube ({rows[0]['block']} block): {', '.join(sorted({r['variant'] for r in rows}))}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--block", choices=["random", "fixed"], default="random", help="gym_hil block start")
    ap.add_argument("--eval-episodes", type=int, default=10, help="distinct block positions per evaluation")
    ap.add_argument("--eval-every", type=int, default=3000, help="env steps between evaluations")
    ap.add_argument("--name", default=None, help="results file stem (default hil_serl_<block>)")
    ap.add_argument("--append", action="store_true",
                    help="add these runs to the results file's (replacing the same variant and seed)")
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-hil-serl-"))
    rows = [run_variant(v, s, args.minutes, args.target, work, args.block, args.eval_episodes, args.eval_every)
            for s in args.seeds for v in args.variants]  # fmt: skip
    stem = args.name or f"hil_serl_{args.block}"
    if args.append and (RESULTS / f"{stem}.json").exists():
        new = {(r["variant"], r["seed"]) for r in rows}
        old = json.loads((RESULTS / f"{stem}.json").read_text())["runs"]
        rows = [r for r in old if (r["variant"], r["seed"]) not in new] + rows
    out = {
        "task": f"gym_hil PandaPickCube, {args.block} block position, state; supervisor = scripted, stall-triggered",
        "machine": describe(),
        "target_success": args.target,
        "max_minutes": max(args.minutes, *(r.get("max_minutes", 0) for r in rows)),
        "runs": rows,
        "date": time.strftime("%Y-%m-%d"),
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=2))
    plot(rows, RESULTS / f"{stem}_curve.png")
    for r in rows:
        print(f"{r['variant']:<16} seed {r['seed']}: best {r['best_eval_success']:.0%}, to {args.target:.0%}: "
              f"{r['env_steps_to_target']} steps / {r['minutes_to_target']} min; interventions {r['interventions']}")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
