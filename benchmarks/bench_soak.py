"""Soak: a long training run stays bounded in memory and disk, its buffer readable.

A ManiSkill PushCube run (state, SAC) for ``--minutes`` with a replay buffer much smaller
than the number of transitions collected, so the buffer wraps many times. Every
``--sample-s`` seconds: resident memory of the learner and env worker processes, bytes
of the replay log and of the whole run folder, and a full read of the replay log while it
is being written (records read, seconds). At the end, the log must restore a full
buffer. Reported: the time series, and the growth from the first sample after the buffer
filled to the last (absolute and per hour).

    python benchmarks/bench_soak.py --minutes 30 --capacity 20000
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


def _mib(n: int | None) -> float:
    return round((n or 0) / 2**20, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--capacity", type=int, default=20_000)
    ap.add_argument("--segment-mb", type=float, default=1.0)
    ap.add_argument("--sample-s", type=float, default=20.0)
    args = ap.parse_args()
    import ray

    from rlinf_user.config.compose import compose_config, validate
    from rlinf_user.data.replay import ReplayBuffer
    from rlinf_user.rundir import create_run_dir
    from rlinf_user.runtime.orchestration.resources import run_snapshot
    from rlinf_user.runtime.orchestration.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    cfg = compose_config(
        [
            "env.task=PushCube-v1", "total_env_steps=1000000000", f"max_wall_minutes={args.minutes}",
            f"buffer.capacity={args.capacity}", f"buffer.segment_mb={args.segment_mb}", "buffer.chunk_steps=50",
            "checkpoint_every_steps=5000", "keep_checkpoints=3", "eval_every_steps=10000", "eval_episodes=5",
            f"run_root={work}", "run_name=soak", "progress=false",
        ],
        sim="maniskill",
    )  # fmt: skip
    validate(cfg)
    run_dir = create_run_dir(cfg)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    trainer = Trainer(cfg, run_dir)
    pids: dict[str, int] = {}
    samples: list[dict] = []
    t0 = time.monotonic()
    last = [-1e9]

    def sample(p) -> None:
        now = time.monotonic()
        if now - last[0] < args.sample_s:
            return
        last[0] = now
        if not pids:
            pids.update(trainer.pids())
        snap = run_snapshot(run_dir, pids)
        samples.append({
            "minutes": round((now - t0) / 60, 2), "env_steps": p.env_steps, "updates": p.updates,
            "buffer_mib": _mib(snap["buffer_bytes"]), "run_dir_mib": _mib(snap["run_dir_bytes"]),
            "log_records": snap["log_records"], "log_read_s": snap["log_read_s"], "checkpoints": snap["checkpoints"],
            **{f"{k}_mib": _mib(snap[k]) for k in ("rss_learner", "rss_env")},
        })  # fmt: skip
        print(samples[-1], flush=True)

    trainer.on_progress = sample
    try:
        progress = trainer.run()
    finally:
        trainer.close()
        ray.shutdown()
    again = ReplayBuffer(args.capacity, run_dir / "buffer")
    restored = again.restore()
    full = [s for s in samples if s["env_steps"] >= 2 * args.capacity]

    def growth(key: str) -> dict:
        if len(full) < 2:
            return {}
        a, b = full[0], full[-1]
        hours = max(1e-9, (b["minutes"] - a["minutes"]) / 60)
        vals = [s[key] for s in full]
        return {"first": a[key], "last": b[key], "max": max(vals), "median": round(float(np.median(vals)), 3),
                "growth_per_hour": round((b[key] - a[key]) / hours, 2)}  # fmt: skip

    out = {
        "what": "PushCube SAC run with a small replay buffer; memory, disk and log readability over time",
        "machine": describe(),
        "minutes": args.minutes, "capacity": args.capacity, "segment_mb": args.segment_mb,
        "env_steps": progress.env_steps, "updates": progress.updates,
        "buffer_wraps": round(progress.env_steps / args.capacity, 1),
        "restored_after": restored, "restored_buffer_full": again.size == args.capacity,
        "after_buffer_full": {k: growth(k) for k in ("rss_learner_mib", "rss_env_mib", "buffer_mib", "run_dir_mib",
                                                     "log_read_s")},  # fmt: skip
        "samples": samples,
        "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=2))


if __name__ == "__main__":
    main()
