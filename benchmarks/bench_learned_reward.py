"""Online RL whose only reward is a learned success classifier (HIL-SERL's recipe).

1. Record ``--demos`` episodes of gym_hil's pick task driven by the scripted expert through
   the simulated SpaceMouse (block position random, so the classifier sees varied successes),
   and ``--failures`` failed attempts the way an operator records negatives: near misses
   (closing the gripper above the block and lifting it empty) and aimless wandering with
   the gripper opening and closing.
2. ``rlinf-user train-reward`` on both (a failed episode's frames are all negatives).
3. ``rlinf-user train --sim gym_hil algo=rlpd demos=<episodes> reward.classifier=<classifier>``:
   the env's dense reward is replaced by the classifier's 0/1 verdict, online and on the
   demonstrations; evaluation still uses the simulator's own success. ``--supervisor``
   adds HIL-SERL's third part: the scripted supervisor on the simulated SpaceMouse takes
   over when the task stalls.

Reported: the classifier's held-out rates, and env steps / wall-clock to the target
evaluation success with the classified success rate alongside.

    python benchmarks/bench_learned_reward.py --seeds 0 --minutes 15 --failures 20
    python benchmarks/bench_learned_reward.py --failures 0 --last-frames 3   # exploited
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from machine import describe

from rlinf_user.teleop.synthetic import PickCubeExpert

RESULTS = Path(__file__).resolve().parent / "results" / "learned_reward"


class FailedAttempt:
    """An operator recording negatives: per episode either a near miss (the expert's grasp
    aimed ``dz`` above the block, so it closes on air and lifts) or smooth wandering with
    the gripper toggled now and then."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.episode = -1
        self.reset()

    def reset(self) -> None:
        self.episode += 1
        self.near_miss = self.episode % 2 == 0
        self.expert = PickCubeExpert(grasp_dz=float(self.rng.uniform(0.03, 0.06)))
        self.drift = self.rng.uniform(-1, 1, 6)
        self.grip = -1.0

    def __call__(self, obs: dict) -> np.ndarray:
        if self.near_miss:
            return self.expert(obs)
        self.drift = 0.9 * self.drift + 0.1 * self.rng.uniform(-1, 1, 6)
        if self.rng.random() < 0.05:
            self.grip = -self.grip
        return np.concatenate([np.clip(self.drift * 2, -1, 1), [self.grip]]).astype(np.float32)


def record(root: Path, episodes: int, expert=None, seed: int = 0) -> None:
    from rlinf_user.data import lerobot_format as fmt
    from rlinf_user.data.lerobot_writer import LeRobotWriter
    from rlinf_user.robots.teleop.device import QueueSource
    from rlinf_user.robots.teleop.spacemouse import SpaceMouse
    from rlinf_user.sims.gym_hil import GymHilEnv
    from rlinf_user.teleop.record import Recorder
    from rlinf_user.teleop.synthetic import SpaceMouseHand, SyntheticHuman

    env = GymHilEnv("PandaPickCube", max_episode_steps=100, random_block_position=True)
    dev = SpaceMouse(QueueSource())
    w = LeRobotWriter(root, 10, fmt.contract_features(env.observation_space["state"].shape[0], {}, 10))
    human = SyntheticHuman(SpaceMouseHand(dev), expert or PickCubeExpert())
    Recorder(env, dev, w, "pick", rate_hz=0, before_step=human).run(episodes, seed=seed)
    env.close()


def episode_outcomes(run: Path) -> dict:
    """What the run's training episodes did: how many the simulator called a success, how
    many the classifier did, and how high the block was where the classifier said success
    (gym_hil state: block at 18:21; lift above its resting height, 5th/50th/95th pct)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlinf_user.data.record_log import RecordLog

    tb = EventAccumulator(str(run / "tb"))
    tb.Reload()
    true, classified = (tb.Scalars(f"episode/{k}") for k in ("success", "classified_success"))
    chunks = list(RecordLog(run / "buffer").read_all())
    obs, nxt, reward = (np.concatenate([c[k] for c in chunks]) for k in ("obs/state", "next_obs/state", "reward"))
    lift = nxt[reward > 0, 20] - np.median(obs[:, 20])
    return {
        "training_episodes": len(true), "truly_successful": int(sum(e.value for e in true)),
        "classified_successful": int(sum(e.value for e in classified)),
        "lift_m_where_classified_p5_p50_p95": np.percentile(lift, [5, 50, 95]).round(3).tolist() if lift.size else None,
        "max_lift_m": round(float((nxt[:, 20] - np.median(obs[:, 20])).max()), 3),
    }  # fmt: skip


def main() -> None:
    from rlinf_user.cli.main import main as cli

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--demos", type=int, default=20)
    ap.add_argument("--failures", type=int, default=20, help="failed attempts recorded as negatives (0: none)")
    ap.add_argument(
        "--ends-episode",
        choices=["true", "false"],
        default="false",
        help="reward.ends_episode: a classified success ends the episode (HIL-SERL)",
    )
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument(
        "--last-frames", type=int, default=1,
        help="train-reward --last-frames (1: the sim flags the success frame itself, no reaction time to cover)",
    )  # fmt: skip
    ap.add_argument("--gamma", type=float, default=None, help="algo.gamma (default: the sim config's)")
    ap.add_argument(
        "--supervisor",
        action="store_true",
        help="HIL-SERL's whole recipe: the scripted supervisor takes over on a stall (intervention.*)",
    )
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--out", default=None, help="default: results/learned_reward/learned_reward[_variant...].json")
    args = ap.parse_args()
    stem = (
        "learned_reward"
        + ("" if args.failures else "_successes_only")
        + ("_end" if args.ends_episode == "true" else "")
        + (f"_gamma{args.gamma}" if args.gamma else "")
        + ("_supervisor" if args.supervisor else "")
        + (f"_last{args.last_frames}" if args.last_frames != 1 else "")
    )
    args.out = args.out or str(RESULTS / f"{stem}.json")
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="learned-reward-"))
    demos, clf = work / "demos", work / "pick_success.pt"
    record(demos, args.demos)
    datasets = [str(demos)]
    if args.failures:
        record(work / "failures", args.failures, FailedAttempt(), seed=10_000)
        datasets.append(str(work / "failures"))
    if cli(["train-reward", *datasets, "--out", str(clf), "--last-frames", str(args.last_frames)]) != 0:
        raise SystemExit("train-reward failed")
    import torch

    clf_metrics = torch.load(clf, weights_only=True)["metrics"]
    clf_metrics["datasets"] = [Path(d).name for d in clf_metrics.get("datasets", [])]  # no machine paths in results
    runs = []
    for seed in args.seeds:
        name = f"{stem}_s{seed}"
        argv = [
            "train", "--sim", "gym_hil", "algo=rlpd", f"demos={demos}", f"reward.classifier={clf}", f"seed={seed}",
            f"reward.ends_episode={args.ends_episode}", *([f"algo.gamma={args.gamma}"] if args.gamma else []),
            *(["intervention.enabled=true", "intervention.synthetic_human=true"] if args.supervisor else []),
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
            "episodes": episode_outcomes(run),
        })  # fmt: skip
        print(json.dumps(runs[-1]), flush=True)
    result = {
        "benchmark": "learned_reward", "task": "gym_hil PandaPickCube (fixed block), state", "demos": args.demos,
        "failures": args.failures, "ends_episode": args.ends_episode == "true", "gamma": args.gamma,
        "supervisor": args.supervisor, "last_frames": args.last_frames, "classifier": clf_metrics,
        "target": args.target, "runs": runs, "machine": describe(),
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
