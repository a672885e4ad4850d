"""HG-DAgger's learner role: aggregates labelled samples (demonstrations + human
corrections) and retrains the policy continuously on its own thread, publishing
versioned weights that the acting side picks up between steps, never waiting for them."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import torch

from rlinf_user.algorithms.base import ALGORITHMS
from rlinf_user.policies.base import build_policy
from rlinf_user.runtime.learner import as_spec
from rlinf_user.runtime.weights import WeightPublisher

log = logging.getLogger(__name__)


class BCLearner:
    def __init__(
        self,
        policy_cfg: Any,
        spec: dict[str, Any],
        weight_store: Any,
        batch_size: int = 256,
        lr: float = 1e-3,
        publish_every: int = 100,
        seed: int = 0,
        threads: int = 1,
    ):
        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        self.spec = spec = as_spec(spec)
        self.policy = build_policy(policy_cfg, spec)
        self.bc = ALGORITHMS.get("bc").for_policy(self.policy, lr=lr)
        self.weight_store = weight_store
        self.batch_size = batch_size
        self.publish_every = publish_every
        self.rng = np.random.default_rng(seed)
        self.states: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self.sources: list[np.ndarray] = []  # 0: demonstration, 1: correction
        self.lock = threading.Lock()
        self.version = -1
        self.last_loss = float("nan")
        self._stop = threading.Event()
        self._publisher: WeightPublisher | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ data
    def add(self, states: np.ndarray, actions: np.ndarray, source: int = 1) -> int:
        """Aggregate labelled samples; ``actions`` are 7-D contract actions."""
        states = np.asarray(states, np.float32)
        labels = self.spec.policy_action(np.asarray(actions, np.float32))
        if states.ndim != 2 or states.shape[1] != self.spec.state_dim or len(states) != len(labels):
            raise ValueError(f"samples of shape {states.shape} / {labels.shape} do not fit state_dim {self.spec.state_dim}")
        if not (np.isfinite(states).all() and np.isfinite(labels).all()):
            raise ValueError("NaN/Inf in labelled samples; nothing was added")
        with self.lock:
            self.states.append(states)
            self.labels.append(labels)
            self.sources.append(np.full(len(states), source, np.int8))
            return self.size()

    def size(self) -> int:
        return int(sum(len(s) for s in self.states))

    def _batch(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        with self.lock:
            if len(self.states) > 1:
                self.states = [np.concatenate(self.states)]
                self.labels = [np.concatenate(self.labels)]
                self.sources = [np.concatenate(self.sources)]
            s, a = self.states[0], self.labels[0]
        idx = self.rng.integers(0, len(s), size=min(self.batch_size, max(len(s), 1)))
        return {"state": torch.from_numpy(s[idx]), "images": {}}, torch.from_numpy(a[idx])

    # ------------------------------------------------------------ training
    def train(self, updates: int) -> dict[str, Any]:
        for _ in range(updates):
            if self.size() == 0:
                break
            if self.bc.num_updates == 0:
                self._fit_normalizer()
            obs, target = self._batch()
            self.last_loss = self.bc.step(obs, target)
            if self.bc.num_updates % self.publish_every == 0:
                self.publish()
        return self.stats()

    def _fit_normalizer(self) -> None:
        """State statistics from the data held before the first update (the demonstrations)."""
        with self.lock:
            states = np.concatenate(self.states)
        self.policy.fit_normalizer(torch.from_numpy(states))

    def publish(self) -> int:
        self.version += 1
        if self._publisher is None:
            self._publisher = WeightPublisher(self.weight_store)
        self._publisher.publish(self.policy, self.version)
        return self.version

    def start(self, max_updates_per_s: float = 200.0) -> None:
        """Train continuously on a thread (rate-capped so a small machine keeps a core)."""

        def loop() -> None:
            period = 1.0 / max_updates_per_s if max_updates_per_s > 0 else 0.0
            while not self._stop.is_set():
                if self.size() == 0:
                    time.sleep(0.05)
                    continue
                t = time.monotonic()
                self.train(1)
                rest = period - (time.monotonic() - t)
                if rest > 0:
                    time.sleep(rest)

        self._thread = threading.Thread(target=loop, name="bc-learner", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            src = np.concatenate(self.sources) if self.sources else np.zeros(0, np.int8)
        return {
            "updates": self.bc.num_updates,
            "version": self.version,
            "samples": int(len(src)),
            "corrections": int((src == 1).sum()),
            "loss": self.last_loss,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "updates": self.bc.num_updates, "version": self.version}
