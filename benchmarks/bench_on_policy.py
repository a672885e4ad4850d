"""On-policy learning (PPO, GRPO) through the Ray runtime: env steps/s, and env steps and
wall-clock to a success threshold, per seed.

Each run is ``rlinf-user train --sim maniskill algo=<algo> policy=gaussian_ac`` (``--sim``,
``--policy`` choose others: a VLA such as ``token_vla``) as a user would start it (collocated placement: env workers step CPU envs, the learner beside
them), evaluated every ``--eval-every`` env steps on episodes from reset seeds training
never uses, stopping at ``--target`` or ``--max-steps``.

    python benchmarks/bench_on_policy.py --algo ppo --seeds 0 1 2
    python benchmarks/bench_on_policy.py --algo grpo --seeds 0 1 2 --max-steps 300000 --eval-every 20000 \
        --eval-episodes 50 env.success_bonus=50
    # PPO of the token VLA (real SmolLM2 layer, action tokens) on PushCube and on reach
    python benchmarks/bench_on_policy.py --policy token_vla --max-steps 150000 --eval-episodes 50 \
        --out benchmarks/results/vla_token_ppo_pushcube.json policy.vlm_layers=1 policy.finetune=heads \
        policy.horizon=1 algo.value_lr=1e-3
    # on a GPU machine: ManiSkill's GPU-parallel envs in one worker
    python benchmarks/bench_on_policy.py --algo ppo --workers 1 --envs 1024 --sim-device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def run(algo: str, seed: int, args, work: Path) -> dict:
    import ray

    from rlinf_user.config.compose import compose_config, validate
    from rlinf_user.rundir import create_run_dir
    from rlinf_user.runtime.orchestration.trainer import Trainer

    overrides = [
        f"algo={algo}", f"policy={args.policy}", *([f"env.task={args.task}"] if args.task else []), f"seed={seed}",
        f"total_env_steps={args.max_steps}", f"target_success={args.target}", f"eval_every_steps={args.eval_every}",
        f"eval_episodes={args.eval_episodes}", f"checkpoint_every_steps={args.max_steps}",
        f"placement.num_env_workers={args.workers}", f"placement.envs_per_worker={args.envs}",
        f"env.sim_device={args.sim_device}", f"algo.num_steps={args.num_steps}",
        f"run_root={work}", f"run_name={algo}-s{seed}", "progress=false", "buffer.persist=false", *args.overrides,
    ]  # fmt: skip
    cfg = compose_config(overrides, sim=args.sim)
    validate(cfg)
    run_dir = create_run_dir(cfg)
    t0 = time.monotonic()
    try:
        with Trainer(cfg, run_dir) as trainer:
            p = trainer.run()
            summary = trainer.summary
    finally:
        if ray.is_initialized():
            ray.shutdown()
    wall = time.monotonic() - t0
    reached = next((h for h in p.history if h["success_rate"] >= args.target), None)
    return {
        "seed": seed,
        "reached": reached is not None,
        "env_steps_to_target": reached["env_steps"] if reached else None,
        "wall_minutes_to_target": round(reached["wall_seconds"] / 60, 2) if reached else None,
        "best_eval_success": p.best_eval_success,
        "final_eval_success": summary["final_eval_success"],
        "env_steps": p.env_steps,
        "updates": p.updates,
        "wall_minutes": round(wall / 60, 2),
        "env_steps_per_s": round(p.env_steps / max(p.wall, 1e-9), 1),
        "history": p.history,
    }


def from_run(run_dir: Path, seed: int, target: float) -> dict:
    """The same record rebuilt from a finished run directory (its summary and history)."""
    import csv

    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    with open(run_dir / "eval" / "history.csv") as f:
        history = [{k: float(v) for k, v in h.items()} for h in csv.DictReader(f)]
    reached = next((h for h in history if h["success_rate"] >= target), None)
    return {
        "seed": seed,
        "reached": reached is not None,
        "env_steps_to_target": reached["env_steps"] if reached else None,
        "wall_minutes_to_target": round(reached["wall_seconds"] / 60, 2) if reached else None,
        "best_eval_success": summary["best_eval_success"],
        "final_eval_success": summary["final_eval_success"],
        "env_steps": summary["env_steps"],
        "updates": summary["updates"],
        "wall_minutes": round(summary["wall_seconds"] / 60, 2),
        "env_steps_per_s": round(summary["env_steps"] / max(summary["wall_seconds"], 1e-9), 1),
        "history": history,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", default="ppo", choices=["ppo", "grpo"])
    ap.add_argument("--sim", default="maniskill", help="a configs/sim group (maniskill, reach ...)")
    ap.add_argument("--task", default="PushCube-v1", help="env.task ('' keeps the sim's default)")
    ap.add_argument("--policy", default="gaussian_ac", help="gaussian_ac, or a VLA (token_vla, lite_vla, pi0)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--max-steps", type=int, default=600_000)
    ap.add_argument("--eval-every", type=int, default=10_000)
    ap.add_argument("--eval-episodes", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--num-steps", type=int, default=50)
    ap.add_argument("--sim-device", default="cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-runs", nargs="+", type=Path, default=None,
                    help="rebuild the results from finished run directories (one per seed, in --seeds order)")
    ap.add_argument("overrides", nargs="*", help="more config overrides, e.g. algo.update_epochs=8")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    work = Path(tempfile.mkdtemp(prefix="bench-on-policy-"))
    if args.from_runs:
        runs = [from_run(d, s, args.target) for d, s in zip(args.from_runs, args.seeds)]
    else:
        runs = [run(args.algo, s, args, work) for s in args.seeds]
    reached = [r for r in runs if r["reached"]]
    result = {
        "algo": args.algo, "policy": args.policy, "sim": args.sim, "task": args.task, "target": args.target, "workers": args.workers, "envs_per_worker": args.envs,
        "num_steps": args.num_steps, "sim_device": args.sim_device, "overrides": args.overrides,
        "reached": f"{len(reached)}/{len(runs)}",
        "median_env_steps_to_target": float(np.median([r["env_steps_to_target"] for r in reached])) if reached else None,
        "median_wall_minutes_to_target": float(np.median([r["wall_minutes_to_target"] for r in reached])) if reached else None,
        "median_env_steps_per_s": float(np.median([r["env_steps_per_s"] for r in runs])),
        "eval": f"{args.eval_episodes} episodes per evaluation, the validation reset seeds (10^9 + k; training resets use others)",
        "runs": runs, "machine": describe(),
    }  # fmt: skip
    text = json.dumps(result, indent=2)
    print(text)
    out = Path(args.out) if args.out else RESULTS / f"on_policy_{args.algo}_{args.task.split('-')[0].lower()}.json"
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
