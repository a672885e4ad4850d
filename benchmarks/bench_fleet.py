"""Learner-side throughput with 1, 2 and 4 simulated robots behind edge daemons.

Each robot is ``rlinf-user edge --sim gym_hil`` in its own process (control loop at
``--hz``), reached over the edge protocol by a fleet member (``--robot franka
env.task=edge``: reward and success from the served simulator). One learner (SAC, state,
``utd_ratio`` 1) takes every robot's transitions. Measured per run, over the window after
``learning_starts``: transitions ingested by the buffer per second and learner updates per
second over the whole window and over 5-second windows (median and p99 across the
windows of all repeats).

    python benchmarks/bench_fleet.py --robots 1 2 4 --hz 50 --seconds 60 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    import socket

    while True:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))  # the daemon's stream port
            except OSError:
                continue
            return port


def start_edge(port: int, hz: float, log: Path) -> subprocess.Popen:
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), COLUMNS="200")
    f = open(log, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlinf_user.cli.main", "edge", "--sim", "gym_hil", f"control_hz={hz}", f"port={port}"],
        stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while "edge daemon serving" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"edge daemon on {port} did not start:\n{log.read_text()}")
        time.sleep(0.2)
    return proc


def run(n: int, hz: float, seconds: float, work: Path, tag: str) -> dict:
    import ray

    from rlinf_user.config.compose import compose_config, validate
    from rlinf_user.rundir import create_run_dir
    from rlinf_user.runtime.orchestration.trainer import Trainer

    ports = [free_port() for _ in range(n)]
    edges = [start_edge(p, hz, work / f"edge-{tag}-{i}.log") for i, p in enumerate(ports)]
    samples: list[tuple[float, int, int]] = []
    try:
        fleet = ", ".join(f"{{name: r{i}, env: {{edge: {{host: 127.0.0.1, port: {p}}}}}, resources: {{}}}}"
                          for i, p in enumerate(ports))  # fmt: skip
        cfg = compose_config(
            [
                f"fleet=[{fleet}]", "env.task=edge", "env.max_episode_steps=100",
                "algo.utd_ratio=1.0", "algo.learning_starts=500", "total_env_steps=100000000",
                f"max_wall_minutes={seconds / 60}", "eval_every_steps=100000000", "eval_episodes=1",
                "checkpoint_every_steps=100000000", f"run_root={work}", f"run_name={tag}", "progress=false",
            ],
            robot="franka",
        )  # fmt: skip
        validate(cfg)
        t0 = time.monotonic()
        trainer = Trainer(cfg, create_run_dir(cfg), on_progress=lambda p: samples.append((time.monotonic() - t0, p.env_steps, p.updates)))
        try:
            trainer.run()
            summary = json.loads((trainer.run_dir / "eval" / "summary.json").read_text())
        finally:
            trainer.close()
            ray.shutdown()
    finally:
        for e in edges:
            e.terminate()
            e.wait(20)
    steady = np.array([s for s in samples if s[1] >= 500], dtype=float)
    # rates over 5-second windows (rollouts report in chunks of 100 steps, so 1-second
    # samples are lumpy), and over the whole steady window
    steps_rate, upd_rate = [], []
    for i in range(len(steady)):
        j = np.searchsorted(steady[:, 0], steady[i, 0] + 5.0)
        if j < len(steady):
            dt = steady[j, 0] - steady[i, 0]
            steps_rate.append((steady[j, 1] - steady[i, 1]) / dt)
            upd_rate.append((steady[j, 2] - steady[i, 2]) / dt)
    span = steady[-1] - steady[0]
    return {
        "steady_env_steps_per_s": round(float(span[1] / span[0]), 1),
        "steady_updates_per_s": round(float(span[2] / span[0]), 1),
        "robots": n,
        "env_steps": summary["env_steps"],
        "updates": summary["updates"],
        "transitions_ingested": summary["replay"]["total_added"],
        "steps_per_s_windows": [round(float(x), 1) for x in steps_rate],
        "updates_per_s_windows": [round(float(x), 1) for x in upd_rate],
        "members": {k: v["env_steps"] for k, v in summary["members"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--robots", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--hz", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    runs = [run(n, args.hz, args.seconds, work, f"n{n}-r{r}") for n in args.robots for r in range(args.repeats)]
    table = []
    for n in args.robots:
        steps = np.concatenate([r["steps_per_s_windows"] for r in runs if r["robots"] == n])
        upd = np.concatenate([r["updates_per_s_windows"] for r in runs if r["robots"] == n])
        table.append({
            "robots": n,
            "steady_env_steps_per_s": [r["steady_env_steps_per_s"] for r in runs if r["robots"] == n],
            "steady_updates_per_s": [r["steady_updates_per_s"] for r in runs if r["robots"] == n],
            "env_steps_per_s_median": round(float(np.median(steps)), 1),
            "env_steps_per_s_p99": round(float(np.percentile(steps, 99)), 1),
            "updates_per_s_median": round(float(np.median(upd)), 1),
            "updates_per_s_p99": round(float(np.percentile(upd, 99)), 1),
            "ideal_env_steps_per_s": n * args.hz,
        })  # fmt: skip
    out = {
        "what": f"gym_hil served by edge daemons at {args.hz} Hz, one fleet member each, one SAC learner (utd 1)",
        "machine": describe(),
        "seconds_per_run": args.seconds,
        "repeats": args.repeats,
        "table": table,
        "runs": runs,
        "date": time.strftime("%Y-%m-%d"),
    }
    (RESULTS / "fleet_throughput.json").write_text(json.dumps(out, indent=2))
    for row in table:
        print(row)


if __name__ == "__main__":
    main()
