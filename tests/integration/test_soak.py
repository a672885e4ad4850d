"""A long run, scaled down: memory and disk stay bounded and the buffer on disk stays
readable while it is written (the full-length version is ``benchmarks/bench_soak.py``).

The buffer holds 500 transitions and the run collects 5x that: the replay log deletes
segments it no longer needs, old checkpoints go, and the processes' resident memory
stops growing once the buffer is full."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_user.config.compose import compose_config, validate  # noqa: E402
from rlinf_user.data.replay import ReplayBuffer  # noqa: E402
from rlinf_user.rundir import create_run_dir  # noqa: E402
from rlinf_user.runtime.orchestration.resources import run_snapshot  # noqa: E402
from rlinf_user.runtime.orchestration.trainer import Trainer  # noqa: E402

CAPACITY = 500
STEPS = 2500


@pytest.mark.slow
def test_long_run_stays_bounded_and_its_buffer_readable(tmp_path):
    import ray

    cfg = compose_config(
        [
            "env.task=PushCube-v1", f"total_env_steps={STEPS}", "algo.learning_starts=300", "algo.batch_size=64",
            "policy.hidden=[64,64]", "publish_every_updates=10", f"buffer.capacity={CAPACITY}", "buffer.chunk_steps=25",
            "buffer.segment_mb=0.02", "checkpoint_every_steps=300", "keep_checkpoints=2", "eval_every_steps=800",
            "eval_episodes=2", f"run_root={tmp_path}", "run_name=soak", "progress=false",
        ],
        sim="maniskill",  # paced enough for progress samples at every stage of the run
    )  # fmt: skip
    validate(cfg)
    run_dir = create_run_dir(cfg)
    trainer = Trainer(cfg, run_dir)
    samples: list[dict] = []
    pids: dict[str, int] = {}

    def sample(p) -> None:
        if not pids:
            pids.update(trainer.pids())
        samples.append({"steps": p.env_steps, **run_snapshot(run_dir, pids)})  # reads the log while it is written

    trainer.on_progress = sample
    try:
        progress = trainer.run()
    finally:
        trainer.close()
        ray.shutdown()
    assert progress.env_steps >= STEPS and progress.worker_restarts == 0
    full = [s for s in samples if s["steps"] >= 2 * CAPACITY]
    early = [s for s in samples if 2 * CAPACITY <= s["steps"] < 3 * CAPACITY]
    late = [s for s in samples if s["steps"] >= 4 * CAPACITY]
    assert early and late, [s["steps"] for s in samples]
    # disk: the log stops growing once it holds a capacity's worth (a linear log would more than double)
    assert max(s["buffer_bytes"] for s in late) <= 1.3 * max(s["buffer_bytes"] for s in early)
    assert all(s["log_records"] > 0 for s in full)
    # checkpoints: 2 kept (a sample can catch the moment a new one exists before the oldest goes)
    assert max(s["checkpoints"] for s in samples) <= 3
    # memory: no growth once the buffer is full (allowance for allocator noise)
    for role in pids:
        grown = max(s[f"rss_{role}"] for s in late) - float(np.median([s[f"rss_{role}"] for s in early]))
        assert grown < 24 * 2**20, (role, grown)  # measured: about 2 MB over 3000 steps (capacity 800)
    # the log on disk restores a full buffer of the newest transitions
    again = ReplayBuffer(CAPACITY, run_dir / "buffer")
    assert again.restore() >= CAPACITY and again.size == CAPACITY
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert len([c for c in ckpts if c.startswith("ckpt-")]) == 2 and "latest" in ckpts
