"""The training side's chunk path, end to end: an env worker on the robot env, a slow
chunk model, franky-sim behind the edge daemon.

``bench_edge_chunks.py`` measures the daemon's chunk schedule with a hand-written client;
this one runs what ``rlinf-user train --robot franka`` runs: the real :class:`EnvWorker`
and :class:`RemoteRobotEnv`, whose policy is replaced by a scripted chunk model (a 6 cm
circle, one lap per 8 s, each inference with its own random offset) that takes an
injected latency L per chunk of 2 s. Two modes:

* **per_step** (``env.edge.stream_chunks=false``): the worker sends the chunk's actions
  one ``act`` per step and the robot waits while the model computes the next chunk;
* **streamed** (``env.edge.stream_chunks=true``): the chunk goes to the daemon whole, the
  worker asks for the next one ``lookahead_s = L + 2 periods`` before it runs out and reads
  every tick back.

Per control rate and latency: the daemon's **duty cycle** (ticks in which an action ran,
over episode ticks, from its telemetry), watchdog holds, the worker's env steps per
second, the recorded transitions whose robot ran nothing (idle), and the largest change
between consecutive executed actions (the seams; within a chunk the circle changes by
about 0.02 per tick).

    python benchmarks/bench_edge_stream.py            # 10 and 20 Hz x 100/200/400 ms (~5 min)
    python benchmarks/bench_edge_stream.py --quick    # 10 Hz, 200 ms
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_edge_chunks import BOX, CHUNK_S, Model  # noqa: E402
from bench_tracking import Edge  # noqa: E402
from machine import describe  # noqa: E402

from rlinf_user.config.compose import compose_config  # noqa: E402
from rlinf_user.edge.client import EdgeClient  # noqa: E402
from rlinf_user.env.spec import Col  # noqa: E402

RESULTS = HERE / "results"


class ScriptedChunks:
    """Stands in for a chunk policy: the circle's next ``horizon`` actions after
    ``latency`` (the worker's local policy seam: ``act(obs) -> actions, extras``)."""

    def __init__(self, hz: float, latency: float, action_dim: int):
        self.model = Model(hz, latency, seed=0)
        self.horizon = int(CHUNK_S * hz)
        self.action_dim = action_dim
        self.calls = 0

    def act(self, obs):
        a = self.model.actions(self.calls * self.horizon, self.horizon)[:, : self.action_dim]
        self.calls += 1
        return SimpleNamespace(actions=torch.from_numpy(a)[None], extras={})


def case(port: int, hz: float, latency: float, mode: str, seconds: float) -> dict:
    from rlinf_user.runtime.rollout.env_worker import EnvWorker

    cfg = compose_config(
        [
            "env.max_episode_steps=100000", "env.success_bonus=0", "algo=bc", "buffer.chunk_steps=100000",
            "env.edge.host=127.0.0.1", f"env.edge.port={port}", "env.edge.timeout_s=5",
            f"env.edge.stream_chunks={mode == 'streamed'}", f"env.edge.lookahead_s={latency + 2 / hz}",
            "env.edge.blend=2",
        ],
        robot="franka",
    )  # fmt: skip
    worker = EnvWorker(cfg, worker_id=0, seed=0, num_envs=1)
    watcher = EdgeClient("127.0.0.1", port, timeout_s=5.0)
    try:
        worker.actor.policy = ScriptedChunks(hz, latency, worker.spec.action_dim)
        worker.rollout(int(hz))  # the first chunk: the arm waited for it since the reset
        before = watcher.telemetry()
        t0 = time.perf_counter()
        steps = 0
        while time.perf_counter() - t0 < seconds:
            steps += worker.rollout(int(hz))["steps"]
        wall = time.perf_counter() - t0
        after = watcher.telemetry()
        worker.writer.flush()
        parts = [c for _, c in worker.writer.out.backlog]
    finally:
        watcher.close(say_bye=False)
        worker.close()
    actions = np.concatenate([p[Col.ACTION] for p in parts])[int(hz) :]  # the measured part
    jumps = np.abs(np.diff(actions[:, :2], axis=0)).max(axis=1)
    ticks = after["episode_ticks"] - before["episode_ticks"]
    row = {
        "hz": hz, "latency_ms": int(latency * 1e3), "mode": mode, "seconds": round(wall, 1),
        "episode_ticks": ticks,
        "duty_cycle": round((after["acted_ticks"] - before["acted_ticks"]) / max(ticks, 1), 4),
        "watchdog_holds": after["watchdog_holds"] - before["watchdog_holds"],
        "env_steps_per_s": round(steps / wall, 2),
        "idle_transitions": int((np.abs(actions).sum(axis=1) == 0).sum()),
        "inferences": worker.policy.calls,
        "action_jump_max": round(float(jumps.max()), 4),
        "action_jump_p99": round(float(np.percentile(jumps, 99)), 4),
    }  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[10.0, 20.0])
    ap.add_argument("--latencies", type=float, nargs="+", default=[0.1, 0.2, 0.4])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "edge_stream.json"))
    args = ap.parse_args()
    if args.quick:
        args.rates, args.latencies, args.seconds = [10.0], [0.2], 8.0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hz in args.rates:
            edge = Edge(hz, "commanded", BOX, Path(tmp) / f"edge-{hz}.log", extra=("safety.watchdog_periods=3",))
            edge.client.close()  # the worker's env takes control
            try:
                for latency in args.latencies:
                    for mode in ("per_step", "streamed"):
                        rows.append(case(edge.port, hz, latency, mode, args.seconds))
            finally:
                edge.sub.close()
                edge.proc.terminate()
                edge.proc.wait(10)
    result = {
        "benchmark": "env worker + robot env on franky-sim: a chunk model with injected latency, per-step vs streamed",
        "machine": describe(),
        "chunk_s": CHUNK_S,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if any(math.isnan(r["duty_cycle"]) for r in rows):
        raise SystemExit("a case measured nothing")


if __name__ == "__main__":
    main()
