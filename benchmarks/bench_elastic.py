"""Elastic env workers: how long a node that joins a running job takes to feed its learner,
and how long a node that leaves takes to have its worker retired, over repeated joins and
leaves of one run.

A Ray cluster simulated on this machine (``ray.cluster_utils.Cluster``): the head holds the
run's roles with no CPU to spare (SAC on the reach sim, paced, ``placement.max_env_workers=2``);
each cycle adds a 1-CPU node, waits for the worker started on it to send its first rows,
lets both workers step, then removes the node (its raylet killed) and waits for the run to
retire that worker. Reported per cycle and as median and p99: from the node joining the
cluster to its worker's first rows at the learner (``join_to_first_rows_s``, the run's own
figure, its clock started when the run first sees the node), and from the node's removal to
the worker's retirement. The run's replay must hold every env step the rollouts counted::

    python benchmarks/bench_elastic.py --cycles 5 --out benchmarks/results/elastic.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from machine import describe

from rlinf_user.config.compose import compose_config, validate
from rlinf_user.rundir import create_run_dir
from rlinf_user.runtime.orchestration.trainer import Trainer


def wait_for(cond, timeout: float, what: str, thread: threading.Thread) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if not thread.is_alive():
            raise SystemExit(f"the run ended while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def events(trainer, kind: str) -> list[dict]:
    return [e for e in trainer.pool.events if e["event"] == kind]


def run(cycles: int, steps_between: int, root: Path) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4})
    cfg = compose_config(
        ["seed=1", "total_env_steps=10000000", "algo.n_step=3", "algo.paced=true", "algo.utd_ratio=0.5",
         "algo.batch_size=128", "policy.hidden=[128,128]", "eval_every_steps=100000000", "eval_episodes=2",
         "test_episodes=0", "buffer.chunk_steps=25", "placement.max_env_workers=2", f"run_root={root}",
         "run_name=elastic", "progress=false"],
        sim="reach",
    )  # fmt: skip
    validate(cfg)
    ray.init(address=cluster.address, log_to_driver=False)
    trainer = Trainer(cfg, create_run_dir(cfg))
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("p", trainer.run()), daemon=True)
    rows = []
    try:
        thread.start()
        wait_for(lambda: trainer.progress.env_steps >= steps_between, 300, "the first worker stepping", thread)
        for i in range(cycles):
            node = cluster.add_node(num_cpus=1)
            added = time.monotonic()
            wait_for(lambda n=i + 1: len(events(trainer, "join")) >= n, 120, "the joined worker's first rows", thread)
            join = events(trainer, "join")[-1]
            first_rows = time.monotonic() - added
            steps = trainer.progress.env_steps
            wait_for(
                lambda s=steps: trainer.progress.env_steps >= s + steps_between, 300, "both workers stepping", thread
            )
            cluster.remove_node(node)
            removed = time.monotonic()
            wait_for(lambda n=i + 1: len(events(trainer, "leave")) >= n, 120, "the worker retired", thread)
            retired = time.monotonic() - removed
            rows.append(
                {
                    "cycle": i,
                    "join_to_first_rows_s": join["join_to_first_rows_s"],
                    "add_node_to_first_rows_s": round(first_rows, 2),
                    "remove_node_to_retired_s": round(retired, 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            # the next node must find the CPU free again: wait for Ray to drop the removed node
            wait_for(lambda nid=node.node_id: not any(n["NodeID"] == nid and n["Alive"] for n in ray.nodes()), 60,
                     "the removed node gone", thread)  # fmt: skip
            time.sleep(1.0)
        trainer.stop("cycles done")
        thread.join(timeout=300)
        summary = json.loads((trainer.run_dir / "eval" / "summary.json").read_text())
    finally:
        trainer.close()
        ray.shutdown()
        cluster.shutdown()
    return {"cycles": rows, "env_steps": summary["env_steps"], "updates": summary["updates"],
            "replay_total_added": summary["replay"]["total_added"], "replay_rejected": summary["replay"]["rejected"],
            "nothing_lost": summary["replay"]["total_added"] >= summary["env_steps"]}  # fmt: skip


def stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "p99": round(float(np.percentile(values, 99)), 2),
            "max": round(max(values), 2), "n": len(values)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=5, help="joins and leaves in the one run")
    ap.add_argument("--steps-between", type=int, default=600, help="env steps both workers make before the leave")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as root:
        got = run(args.cycles, args.steps_between, Path(root))
    out = {
        "what": "a node joins a running SAC job on the reach sim and later leaves it, repeated; seconds from the "
                "node joining to its worker's first rows at the learner, and from its removal to the worker retired",
        "machine": describe(),
        **got,
        "join_to_first_rows_s": stats([r["join_to_first_rows_s"] for r in got["cycles"]]),
        "add_node_to_first_rows_s": stats([r["add_node_to_first_rows_s"] for r in got["cycles"]]),
        "remove_node_to_retired_s": stats([r["remove_node_to_retired_s"] for r in got["cycles"]]),
    }  # fmt: skip
    print(json.dumps({k: out[k] for k in ("join_to_first_rows_s", "add_node_to_first_rows_s",
                                          "remove_node_to_retired_s", "nothing_lost")}, indent=1))  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
