"""``rlinf-user train --robot franka`` end to end, without hardware.

The edge daemon runs as on a robot PC (its own process: control loop, safety, franky
driving franky-sim's MuJoCo Franka over the libfranka protocol); the training side is the
real Ray runtime (env worker with the remote robot env, learner, weight store), through an
emulated lab link (20 ms each way, 20 Mbit/s). A shortened run: 800 env steps of the reach
task, the learner's weights reaching the policy that acts through the edge, an evaluation of
6 held-out goals through the edge, a checkpoint. Learning the reach on the robot is the
benchmark's claim (bench_robot_training.py: the 3 cm reach to 90-100% on 3 seeds,
results/reach_franky_sim*.json); a run that learned the 5 cm reach to 80% here took 10
minutes of a core of CI's 30. The robot's duty cycle (control ticks that ended a period in
which a policy action ran, resets excluded) is reported and guarded.
"""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

pytest.importorskip("franky")
pytest.importorskip("franky_sim")

from edge_helpers import EdgeProcess, edge_telemetry, free_ports  # noqa: E402

from rlinf_user.config.compose import compose_config, validate  # noqa: E402
from rlinf_user.data.record_log import RecordLog  # noqa: E402
from rlinf_user.rundir import create_run_dir  # noqa: E402
from rlinf_user.runtime.orchestration.trainer import Trainer  # noqa: E402

STEPS = 800
EVAL_EPISODES = 6
HZ = 10.0


@pytest.mark.wallclock
@pytest.mark.timeout(900)
# The direct link and a link whose round trip spans the whole period (50 ms each way) are the
# committed benchmarks (bench_robot_training.py); CI runs the same path through an emulated
# lab network (20 ms each way, jitter, a 20 Mbit/s bottleneck): the link's code is exercised,
# and the commands still land within the 100 ms period
@pytest.mark.parametrize("link", ["{delay_ms: 20, jitter_ms: 5, mbit: 20}"], ids=["20ms-20mbit"])
def test_training_on_the_franky_sim_robot_through_the_edge(tmp_path, link):
    import ray

    port = free_ports(3)
    edge = EdgeProcess(
        ["--robot", "franka", "franky_sim=true", "robot.ip=127.0.0.41", f"control_hz={HZ}",
         # franky-sim's 1 kHz physics is a Python loop: beside the CPU-bound test lane on 2
         # cores its simulated time can run several times slower than the clock (a CI run saw
         # a homing outlast the real robot's 30 s limit), so homing gets more wall time here
         "robot.relative_dynamics_factor=0.5", "robot.home_timeout_s=120"],
        port, tmp_path / "edge.log",
    )  # fmt: skip
    try:
        cfg = compose_config(
            [
                "env.edge.host=127.0.0.1", f"env.edge.port={port}", "seed=0",
                f"total_env_steps={STEPS}", f"run_root={tmp_path}", "run_name=reach", "progress=false",
                # one evaluation, at the end, of 6 held-out goals (each with its homing)
                f"eval_every_steps={STEPS}", f"eval_episodes={EVAL_EPISODES}",
                # batches of 128: half the learner's CPU (its 4 updates per 10 Hz step took half
                # a core), so beside the other lane it keeps closer to its update ratio
                "algo.batch_size=128",
                *([f"env.edge.link={link}"] if link else []),
            ],
            robot="franka",
        )  # fmt: skip
        validate(cfg)
        run_dir = create_run_dir(cfg)
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(address="local", num_cpus=4, resources={"franka": 1}, include_dashboard=False, log_to_driver=False)
        before = edge_telemetry(port)
        trainer = Trainer(cfg, run_dir)
        try:
            trainer.run()
            after = edge_telemetry(port)  # the robot's own account of the run, before shutdown
        finally:
            trainer.close()
            ray.shutdown()
        with open(run_dir / "eval" / "history.csv") as f:
            history = list(csv.DictReader(f))
        assert history and int(history[-1]["env_steps"]) >= STEPS, history  # the evaluation ran through the edge
        assert int(float(history[-1]["distinct_states"])) == EVAL_EPISODES, history
        assert (run_dir / "checkpoints" / "latest").exists()
        summary = json.loads((run_dir / "eval" / "summary.json").read_text())
        chunks = list(RecordLog(run_dir / "buffer").read_all())
        versions = np.concatenate([c["policy_version"] for c in chunks])
        assert versions.max() > 0 and np.all(np.concatenate([c["intervention"] for c in chunks]) == 0)
        assert after["safety"]["refused"] == 0
        acted = after["acted_ticks"] - before["acted_ticks"]
        stepping = (after["uptime_s"] - before["uptime_s"]) - (after["reset_seconds"] - before["reset_seconds"])
        duty = acted / (stepping * HZ)
        print(f"\nreach: {summary}\nrobot duty cycle {duty:.3f} (edge telemetry {after})")
        # the benchmark reports the measured value (0.999 direct; about 0.5 through the link,
        # whose round trip spans the whole period); this guards collapse
        assert duty > (0.5 if link is None else 0.3)
    finally:
        edge.close()
