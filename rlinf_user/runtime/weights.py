"""Versioned weight publication: learner -> env/rollout workers, never blocking either.

The learner puts a CPU state dict into the Ray object store and hands the reference to
the :class:`WeightStore` with a monotonically increasing version. Workers ask for
anything newer than what they hold with a call they do not wait on; when the answer
arrives they swap weights between two steps. Versions never go backwards.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch


def to_numpy_state(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


def to_torch_state(state: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)) for k, v in state.items()}


class WeightStore:
    """Holds the latest published version (a Ray actor in the runtime)."""

    def __init__(self) -> None:
        self.version = -1
        self.ref: Any = None

    def publish(self, version: int, ref_box: list) -> int:
        # The reference arrives wrapped in a list so Ray does not resolve it on the way in.
        if version <= self.version:
            raise ValueError(f"weight version {version} is not newer than {self.version}")
        self.version, self.ref = version, ref_box[0]
        return self.version

    def latest(self, newer_than: int = -1) -> tuple[int, list] | None:
        """``(version, [ref])`` if something newer than ``newer_than`` exists, else None."""
        if self.version > newer_than:
            return self.version, [self.ref]
        return None

    def current_version(self) -> int:
        return self.version


class WeightSubscriber:
    """Worker-side helper: polls the store without blocking and applies new weights."""

    def __init__(self, store, module: torch.nn.Module, min_interval_s: float = 0.05):
        self.store = store
        self.min_interval_s = min_interval_s
        self._last_ask = 0.0
        self.module = module
        self.version = -1
        self._pending = None
        self.applied = 0

    def poll(self) -> bool:
        """Call between steps; returns True when new weights were applied."""
        import ray

        if self._pending is None:
            now = time.monotonic()
            if now - self._last_ask < self.min_interval_s:
                return False
            self._last_ask = now
            self._pending = self.store.latest.remote(self.version)
            return False
        ready, _ = ray.wait([self._pending], timeout=0)
        if not ready:
            return False
        answer = ray.get(self._pending)
        self._pending = None
        if answer is None:
            return False
        version, box = answer
        state = ray.get(box[0])
        self.module.load_state_dict(to_torch_state(state))
        self.version = version
        self.applied += 1
        return True

    def sync(self, timeout: float = 60.0) -> None:
        """Block until the newest published version is applied (start-up, evaluation)."""
        import ray

        if self._pending is not None:
            ray.get(self._pending, timeout=timeout)  # drop the stale in-flight answer
            self._pending = None
        answer = ray.get(self.store.latest.remote(self.version), timeout=timeout)
        if answer is None:
            if self.version < 0:
                raise RuntimeError("no policy weights were published before the worker started")
            return
        version, box = answer
        self.module.load_state_dict(to_torch_state(ray.get(box[0])))
        self.version = version
        self.applied += 1
