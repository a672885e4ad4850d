"""kill -9 of the edge daemon mid-run, then a restart on the same port (what a systemd
unit on the robot PC does): training goes on. The episode in progress ends as truncated
with the steps it had, the env worker reconnects at the next reset (no worker restart),
and the policy version sequence continues on the new daemon."""

from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np
import pytest

pytest.importorskip("gym_hil")

from edge_helpers import EdgeProcess, edge_telemetry, free_ports  # noqa: E402

from rlinf_user.config.compose import compose_config, validate  # noqa: E402
from rlinf_user.data.record_log import RecordLog  # noqa: E402
from rlinf_user.rundir import create_run_dir  # noqa: E402
from rlinf_user.runtime.orchestration.trainer import Trainer  # noqa: E402

EDGE_ARGS = ["--sim", "gym_hil", "control_hz=100"]


def test_training_survives_an_edge_daemon_killed_and_restarted(tmp_path):
    import ray

    port = free_ports(3)
    edges = [EdgeProcess(EDGE_ARGS, port, tmp_path / "edge-0.log")]
    cfg = compose_config(
        [
            "env.task=edge", "env.edge.host=127.0.0.1", f"env.edge.port={port}", "env.edge.reconnect_s=60",
            "env.max_episode_steps=100", "total_env_steps=1500", "algo.learning_starts=300", "algo.batch_size=64",
            # survival, not learning: an update per env step, not the robot config's 4
            "algo.utd_ratio=1",
            "policy.hidden=[64,64]", "publish_every_updates=10", "buffer.chunk_steps=25",
            "eval_every_steps=100000", "checkpoint_every_steps=100000",
            f"run_root={tmp_path}", "run_name=r", "progress=false",
        ],
        robot="franka",
    )  # fmt: skip
    validate(cfg)
    run_dir = create_run_dir(cfg)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=4, resources={"franka": 1}, include_dashboard=False, log_to_driver=False)
    killed: dict = {}
    restarted = threading.Event()

    def restart() -> None:
        edges.append(EdgeProcess(EDGE_ARGS, port, tmp_path / "edge-1.log"))
        restarted.set()

    def kill_once(p) -> None:
        if not killed and p.env_steps >= 600 and p.version > 0:
            killed.update(steps=p.env_steps, version=p.version)
            os.kill(edges[0].proc.pid, signal.SIGKILL)  # kill -9: no goodbye on the wire
            edges[0].proc.wait(10)
            threading.Thread(target=restart, daemon=True).start()

    trainer = Trainer(cfg, run_dir, on_progress=kill_once)
    try:
        progress = trainer.run()
        assert restarted.wait(60), "the edge daemon did not come back"
        served = edge_telemetry(port)  # the new daemon's own account
    finally:
        trainer.close()
        ray.shutdown()
        for e in edges:
            e.close()
    assert killed and progress.env_steps >= 1500 and progress.worker_restarts == 0
    assert served["acted_ticks"] > 0  # the rest of the run was stepped on the restarted daemon
    chunks = list(RecordLog(run_dir / "buffer").read_all())
    t = {k: np.concatenate([c[k] for c in chunks]) for k in ("reward", "truncated", "policy_version")}
    assert len(t["reward"]) >= progress.env_steps - 100  # at most the episode in flight is lost
    versions = t["policy_version"]
    assert versions.max() > killed["version"] and np.all(np.diff(versions) >= 0)  # one worker: never backwards
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["env_steps"] >= 1500
