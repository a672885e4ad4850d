"""Online RL on the (simulated) Franka through the edge daemon: time to success and the
robot's duty cycle.

For each seed: start ``rlinf-user edge --robot franka franky_sim=true`` (the real franky
client driving franky-sim's MuJoCo Franka over the libfranka protocol, in the daemon's
control-loop process), then train the ``reach`` task with the Ray runtime as
``rlinf-user train --robot franka`` does, until evaluation success reaches the target.

Duty cycle = control ticks that ended a period in which a policy action ran, divided by
the control ticks available while the robot was not resetting, from the daemon's own
telemetry between the first collected step and the end of training.

    python benchmarks/bench_robot_training.py --seeds 0 1 2
    # through an emulated long link (each direction 50 ms, 20 Mbit/s)
    python benchmarks/bench_robot_training.py --seeds 0 \
        --link "{delay_ms: 50, jitter_ms: 2, mbit: 20}" --out benchmarks/results/reach_franky_sim_link.json
    # from pixels: the goal is only in the front camera's frames
    python benchmarks/bench_robot_training.py --pixels --seeds 0 --target 0.9 --max-steps 12000 \
        --out benchmarks/results/reach_franky_sim_pixels.json
    # one more seed into the same file (``--append`` keeps the other seeds' runs)
    python benchmarks/bench_robot_training.py --pixels --seeds 1 --target 0.9 --max-steps 12000 \
        --out benchmarks/results/reach_franky_sim_pixels.json --append

``--pixels``: franky-sim's calibration scene serves its front camera (320x240, 10 frames/s)
through the edge daemon; the reach goal (a plane of 20 x 14 cm facing the camera) is drawn
into its frames as a 3 cm disc through a hand-eye calibration (``env.kwargs.goal_marker``)
and leaves the state (``goal_in_state=false``): the policy sees the arm's state and a
128x128 crop of the frame around the goal plane, through frozen EfficientNet-Lite0 frame
features. The calibration file holds the scene's true camera (``truth_hand_eye``); the
calibration flow itself is measured by ``bench_calibration.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

RESULTS = Path(__file__).resolve().parent / "results"


PIXEL_CAMERA = "[{name: front, kind: sim, width: 320, height: 240, fps: 10, scene_camera: front}]"


def pixel_overrides(work: Path) -> list[str]:
    """The training side of the pixel reach, with the front camera's calibration written."""
    from rlinf_user.calibration import store
    from rlinf_user.robots.franka.sim_scene import truth_hand_eye

    root = work / "calibration"
    store.save(root / "franka" / "front.yaml", "hand_eye", truth_hand_eye("front", 320, 240), camera_serial="sim:front")
    return [
        "env.cameras=[front]", "+env.crops={front: [96, 56, 128, 128]}", "env.image_size=128",
        f"+env.kwargs.goal_marker={{camera: front, root: {root}}}", "+env.kwargs.goal_in_state=false",
        "env.kwargs.goal_low=[0.45,-0.10,0.33]", "env.kwargs.goal_high=[0.45,0.10,0.47]",
        "policy=cnn", "policy.encoder=efficientnet", "policy.frame_features=true", "buffer.capacity=30000",
    ]  # fmt: skip


def train_through_edge(cfg, port: int) -> tuple[Path, dict, dict, dict]:
    """Train ``cfg`` (a robot config pointed at the daemon on ``port``) with the Ray runtime as
    ``rlinf-user train --robot franka`` does; returns the run directory, the trainer's
    summary and the daemon's telemetry at the first collected step and at the end."""
    import ray
    from edge_helpers import edge_telemetry as telemetry

    from rlinf_user.config.compose import validate
    from rlinf_user.rundir import create_run_dir
    from rlinf_user.runtime.orchestration.trainer import Trainer

    validate(cfg)
    run_dir = create_run_dir(cfg)
    marks: dict[str, dict] = {}

    def on_progress(p) -> None:
        if "start" not in marks and p.env_steps > 0:
            marks["start"] = telemetry(port)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=4, resources={"franka": 1}, include_dashboard=False, log_to_driver=False)
    trainer = Trainer(cfg, run_dir, on_progress=on_progress)
    try:
        trainer.run()
        end = telemetry(port)
    finally:
        trainer.close()
        ray.shutdown()
    return run_dir, trainer.summary, marks.get("start", end), end


def run_seed(seed: int, hz: float, target: float, max_steps: int, work: Path, link: str | None = None,
             pixels: bool = False) -> dict:  # fmt: skip
    from edge_helpers import EdgeProcess, free_ports

    from rlinf_user.config.compose import compose_config

    port = free_ports(3)
    edge = EdgeProcess(
        ["--robot", "franka", "franky_sim=true", f"robot.ip=127.0.0.{60 + seed}",
         f"control_hz={hz}", "robot.relative_dynamics_factor=0.5",
         *(["franky_sim_scene=calibration", f"cameras={PIXEL_CAMERA}"] if pixels else [])],
        port, work / f"edge-s{seed}.log",
    )  # fmt: skip
    try:
        cfg = compose_config(
            ["env.edge.host=127.0.0.1", f"env.edge.port={port}", f"seed={seed}",
             f"total_env_steps={max_steps}", f"target_success={target}", f"run_root={work}",
             f"run_name=reach-s{seed}", "progress=false", *([f"env.edge.link={link}"] if link else []),
             *(pixel_overrides(work) if pixels else [])],
            robot="franka",
        )  # fmt: skip
        run_dir, summary, start, end = train_through_edge(cfg, port)
        acted = end["acted_ticks"] - start["acted_ticks"]
        window = (end["uptime_s"] - start["uptime_s"]) - (end["reset_seconds"] - start["reset_seconds"])
        tag = ("_link" if link else "") + ("_pixels" if pixels else "")
        shutil.copy(run_dir / "eval" / "history.csv", RESULTS / f"reach_franky_sim{tag}_s{seed}_history.csv")
        return {
            "seed": seed,
            "reached": summary["best_eval_success"] >= target,
            "best_eval_success": summary["best_eval_success"],
            "env_steps": summary["env_steps"],
            "wall_minutes": round(summary["wall_seconds"] / 60, 2),
            "updates": summary["updates"],
            "duty_cycle": round(acted / (window * hz), 4) if window > 0 else None,
            "resets": end["resets"] - start["resets"],
            "reset_seconds": round(end["reset_seconds"] - start["reset_seconds"], 1),
            "control_period_error_ms_p99": end.get("period_error_ms_p99"),
            "watchdog_holds": end["watchdog_holds"],
            "safety": end["safety"],
        }
    finally:
        edge.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--max-steps", type=int, default=8000)
    ap.add_argument("--out", default=str(RESULTS / "reach_franky_sim.json"))
    ap.add_argument("--pixels", action="store_true", help="the goal shown in the front camera only")
    ap.add_argument("--link", help="emulated edge link, e.g. '{delay_ms: 50, jitter_ms: 2, mbit: 20}' (each direction)")
    ap.add_argument("--append", action="store_true", help="keep the results file's runs of other seeds")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reach-bench-"))
    runs = [run_seed(s, args.hz, args.target, args.max_steps, work, args.link, args.pixels) for s in args.seeds]
    if args.append and Path(args.out).exists():
        kept = [r for r in json.loads(Path(args.out).read_text())["runs"] if r["seed"] not in args.seeds]
        runs = sorted(kept + runs, key=lambda r: r["seed"])
    reached = [r for r in runs if r["reached"]]
    result = {
        "task": ("reach (goal plane 20 x 14 cm, 3 cm) on franky-sim through rlinf-user edge, SAC, from the front "
                 "camera (goal drawn through its calibration, not in the state), frozen EfficientNet-Lite0 features"
                 if args.pixels else "reach (goal box, 3 cm) on franky-sim through rlinf-user edge, SAC, state"),
        "control_hz": args.hz,
        "edge_link": args.link or "direct (loopback)",
        "target_success": args.target,
        "machine": describe(),
        "runs": runs,
        "reached": f"{len(reached)}/{len(runs)}",
        "median_wall_minutes": float(np.median([r["wall_minutes"] for r in reached])) if reached else None,
        "median_env_steps": float(np.median([r["env_steps"] for r in reached])) if reached else None,
        "median_duty_cycle": float(np.median([r["duty_cycle"] for r in runs if r["duty_cycle"]])),
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
