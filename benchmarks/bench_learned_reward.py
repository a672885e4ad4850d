"""Online RL whose only reward is a learned success classifier (HIL-SERL's recipe).

1. Record ``--demos`` episodes of gym_hil's pick task driven by the scripted expert through
   the simulated SpaceMouse (block position random, so the classifier sees varied successes).
2. ``rlinf-user train-reward`` on them.
3. ``rlinf-user train --sim gym_hil algo=rlpd demos=<episodes> reward.classifier=<classifier>``:
   the env's dense reward is replaced by the classifier's 0/1 verdict, online and on the
   demonstrations; evaluation still uses the simulator's own success.

Reported: the classifier's held-out rates, and env steps / wall-clock to the target
evaluation success with the classified success rate alongside.

    python benchmarks/bench_learned_reward.py --seeds 0 --minutes 15
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
from pathlib import Path

from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def record(root: Path, episodes: int) -> None:
    from rlinf_user.data import lerobot_format as fmt
    from rlinf_user.data.lerobot_writer import LeRobotWriter
    from rlinf_user.robots.teleop.device import QueueSource
    from rlinf_user.robots.teleop.spacemouse import SpaceMouse
    from rlinf_user.sims.gym_hil import GymHilEnv
    from rlinf_user.teleop.record import Recorder
    from rlinf_user.teleop.synthetic import PickCubeExpert, SpaceMouseHand, SyntheticHuman

    env = GymHilEnv("PandaPickCube", max_episode_steps=100, random_block_position=True)
    dev = SpaceMouse(QueueSource())
    w = LeRobotWriter(root, 10, fmt.contract_features(env.observation_space["state"].shape[0], {}, 10))
    Recorder(env, dev, w, "pick", rate_hz=0, before_step=SyntheticHuman(SpaceMouseHand(dev), PickCubeExpert())).run(episodes, seed=0)
    env.close()


def main() -> None:
    from rlinf_user.cli.main import main as cli

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--demos", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--out", default=str(RESULTS / "learned_reward.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="learned-reward-"))
    demos, clf = work / "demos", work / "pick_success.pt"
    record(demos, args.demos)
    if cli(["train-reward", str(demos), "--out", str(clf)]) != 0:
        raise SystemExit("train-reward failed")
    import torch

    clf_metrics = torch.load(clf, weights_only=True)["metrics"]
    clf_metrics["datasets"] = [Path(d).name for d in clf_metrics.get("datasets", [])]  # no machine paths in results
    runs = []
    for seed in args.seeds:
        name = f"learned_reward_s{seed}"
        argv = [
            "train", "--sim", "gym_hil", "algo=rlpd", f"demos={demos}", f"reward.classifier={clf}", f"seed={seed}",
            f"target_success={args.target}", f"max_wall_minutes={args.minutes}", "total_env_steps=1000000",
            "eval_every_steps=3000", "eval_episodes=10", f"run_root={work}", f"run_name={name}", "progress=false",
        ]  # fmt: skip
        if cli(argv) != 0:
            raise SystemExit(f"seed {seed}: train failed")
        run = work / name
        with open(run / "eval" / "history.csv") as f:
            history = list(csv.DictReader(f))
        summary = json.loads((run / "eval" / "summary.json").read_text())
        reached = next((h for h in history if float(h["success_rate"]) >= args.target), None)
        shutil.copy(run / "eval" / "history.csv", RESULTS / f"{name}_history.csv")
        runs.append({
            "seed": seed, "reached_target": reached is not None,
            "env_steps_to_target": int(reached["env_steps"]) if reached else None,
            "minutes_to_target": round(float(reached["wall_seconds"]) / 60, 2) if reached else None,
            "best_eval_success": summary["best_eval_success"], "env_steps": summary["env_steps"],
            "classified_success_recent": summary.get("classified_success"), "reward_server": summary.get("reward_server"),
        })  # fmt: skip
        print(json.dumps(runs[-1]), flush=True)
    result = {"benchmark": "learned_reward", "task": "gym_hil PandaPickCube (fixed block), state", "demos": args.demos,
              "classifier": clf_metrics, "target": args.target, "runs": runs, "machine": describe()}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
