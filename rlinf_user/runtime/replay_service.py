"""The replay role: a persistent buffer (plus optional demo buffer) behind add/sample.

In ``collocated`` placement it lives inside the learner process; in ``disaggregated``
placement it is its own Ray actor. Either way env workers call ``add`` directly.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_user.data.replay import ReplayBuffer, TransitionError

log = logging.getLogger(__name__)


class ReplayService:
    def __init__(
        self,
        capacity: int,
        directory: str | None,
        demo_path: str | None = None,
        seed: int = 0,
        cameras: list[str] | None = None,
    ):
        self.buffer = ReplayBuffer(capacity, directory)
        self.restored = self.buffer.restore()
        self.demos: ReplayBuffer | None = None
        if demo_path:
            self.demos = load_demo_buffer(demo_path, cameras)
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.rejected = 0

    def add(self, chunk: dict[str, np.ndarray]) -> int:
        with self.lock:
            try:
                return self.buffer.add(chunk)
            except TransitionError as err:
                self.rejected += 1
                log.error("rejected a transition chunk (nothing stored): %s", err)
                return 0

    def sample(self, batch_size: int, num_batches: int = 1, demo_ratio: float = 0.0) -> dict[str, np.ndarray]:
        """``num_batches`` batches stacked on a new leading axis: ``(num_batches, B, ...)``."""
        n_demo = int(round(batch_size * demo_ratio)) if self.demos is not None else 0
        with self.lock:
            total = batch_size * num_batches
            online = self.buffer.sample(total - n_demo * num_batches, self.rng)
            if n_demo:
                demo = self.demos.sample(n_demo * num_batches, self.rng)
        if n_demo:
            keys = [k for k in online if k in demo]
            online = {
                k: np.concatenate(
                    [online[k].reshape(num_batches, -1, *online[k].shape[1:]),
                     demo[k].reshape(num_batches, -1, *demo[k].shape[1:])], axis=1)
                for k in keys
            }
            return online
        return {k: v.reshape(num_batches, batch_size, *v.shape[1:]) for k, v in online.items()}

    def sample_demos(self, batch_size: int) -> dict[str, np.ndarray] | None:
        """A batch of demonstration transitions only (BC warm start); None without demos."""
        if self.demos is None:
            return None
        with self.lock:
            return self.demos.sample(batch_size, self.rng)

    def size(self) -> int:
        return self.buffer.size

    def stats(self) -> dict[str, Any]:
        return {
            "size": self.buffer.size,
            "total_added": self.buffer.total_added,
            "restored": self.restored,
            "rejected": self.rejected,
            "demos": 0 if self.demos is None else self.demos.size,
        }

    def close(self) -> None:
        self.buffer.close()


def load_demo_buffer(path: str, cameras: list[str] | None = None) -> ReplayBuffer:
    """Demonstrations from a LeRobotDataset v3.0 folder (``rlinf-user teleop`` output) or
    a replay log folder (a run's ``buffer/``). ``cameras``: image keys to load."""
    p = Path(path)
    if (p / "meta" / "info.json").exists():
        return _lerobot_demos(p, cameras or [])
    if (p / "buffer").is_dir():
        p = p / "buffer"
    if not p.is_dir() or not list(p.glob("seg-*.log")):
        raise FileNotFoundError(f"demos={path}: no replay log (seg-*.log) found there")
    demos = ReplayBuffer(capacity=10_000_000, directory=p)
    demos.restore()
    demos.log.close()
    demos.log = None  # read-only: never append to someone else's demos
    if demos.size == 0:
        raise ValueError(f"demos={path}: the log holds no transitions")
    return demos


def _lerobot_demos(root: Path, cameras: list[str]) -> ReplayBuffer:
    from rlinf_user.data.lerobot_reader import LeRobotReader, episode_transitions

    reader = LeRobotReader(root)
    chunks = []
    for ep in reader.episodes(images=bool(cameras)):
        chunk = episode_transitions(ep, cameras)
        if chunk is not None:
            chunks.append(chunk)
    if not chunks:
        raise ValueError(f"demos={root}: no usable transitions in {reader.num_episodes} episode(s)")
    n = sum(len(c["reward"]) for c in chunks)
    demos = ReplayBuffer(capacity=n)
    for c in chunks:
        demos.add(c)
    log.info("demos: %d transitions from %d LeRobot episodes in %s", n, len(chunks), root)
    return demos
