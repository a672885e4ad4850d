"""HG-DAgger's learner role: aggregates labelled samples (demonstrations + human
corrections) and retrains the policy continuously on its own thread, publishing
versioned weights that the acting side picks up between steps, never waiting for them.

A sample is an observation (state, and for a VLA its camera frames and instruction) and
a target chunk of the policy's horizon ``H``: the labelled action at that step and the
next ``H - 1`` actions of the same episode, each marked valid only where it is a label
too (a demonstration's step, or a step the person fully controlled) and the episode had
not ended. A per-step policy (``H = 1``) trains on exactly the labelled actions."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import torch

from rlinf_user.algorithms.bc import BC
from rlinf_user.env.spec import Col
from rlinf_user.policies.base import build_policy
from rlinf_user.runtime.learning.learner import as_spec
from rlinf_user.runtime.weights.store import WeightPublisher

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
        device: str = "cpu",
    ):
        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        self.spec = spec = as_spec(spec)
        self.device = torch.device(device)
        self.policy = build_policy(policy_cfg, spec).to(self.device)
        self.bc = BC.for_policy(self.policy, lr=lr)
        self.weight_store = weight_store
        self.batch_size = batch_size
        self.publish_every = publish_every
        self.rng = np.random.default_rng(seed)
        self.horizon = int(getattr(self.policy, "horizon", 1))
        self.cameras = list(spec.cameras)
        self.cols: dict[str, list] = {"state": [], "target": [], "valid": [], "source": [], "instruction": []}
        for cam in self.cameras:
            self.cols[f"images/{cam}"] = []
        self.lock = threading.Lock()
        self.version = -1
        self.last_loss = float("nan")
        self._stop = threading.Event()
        self._publisher: WeightPublisher | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ data
    def add(self, states: np.ndarray, actions: np.ndarray, source: int = 1) -> int:
        """Aggregate labelled steps of state-only observations; ``actions`` are 7-D
        contract actions, each a label on its own (no chunk continues past it)."""
        states = np.asarray(states, np.float32)
        n = len(states)
        return self.add_episode({Col.STATE: states}, actions, np.ones(n, bool), source, chunks=False)

    def add_episode(self, obs: dict[str, Any], actions: np.ndarray, labelled: np.ndarray, source: int = 1,
                    chunks: bool = True) -> int:  # fmt: skip
        """Aggregate the labelled steps of one episode: ``obs`` holds the episode's
        observations as arrays (``state`` (T, S), ``images`` {camera: (T, H, W, 3)},
        optionally ``instruction`` (T,)), ``actions`` (T, 7) what was executed, ``labelled``
        (T,) which steps are labels. Nothing is added when anything does not fit."""
        states = np.asarray(obs[Col.STATE], np.float32)
        acts = self.spec.policy_action(np.asarray(actions, np.float32))
        labelled = np.asarray(labelled, bool)
        t = len(states)
        if states.ndim != 2 or states.shape[1] != self.spec.state_dim or len(acts) != t or len(labelled) != t:
            raise ValueError(f"samples of shape {states.shape} / {acts.shape} do not fit state_dim {self.spec.state_dim}")
        if not (np.isfinite(states).all() and np.isfinite(acts).all()):
            raise ValueError("NaN/Inf in labelled samples; nothing was added")
        images = dict(obs.get(Col.IMAGES) or {})
        missing = [c for c in self.cameras if c not in images or len(images[c]) != t]
        if missing:
            raise ValueError(f"labelled samples lack the frames of camera(s) {missing}; nothing was added")
        idx = np.flatnonzero(labelled)
        if not len(idx):
            return self.size()
        h = self.horizon if chunks else 1
        ahead = idx[:, None] + np.arange(h)[None]  # (n, H) step indices of each target chunk
        inside = ahead < t
        ahead = np.minimum(ahead, t - 1)
        target = acts[ahead]
        valid = inside & labelled[ahead]
        texts = obs.get(Col.INSTRUCTION)
        texts = np.asarray(texts if texts is not None else [""] * t).astype(str)
        with self.lock:
            self.cols[Col.STATE].append(states[idx])
            self.cols["target"].append(target.astype(np.float32))
            self.cols["valid"].append(valid)
            self.cols["source"].append(np.full(len(idx), source, np.int8))
            self.cols[Col.INSTRUCTION].append(texts[idx])
            for cam in self.cameras:
                self.cols[f"images/{cam}"].append(np.asarray(images[cam], np.uint8)[idx])
            return self.size()

    def size(self) -> int:
        return int(sum(len(s) for s in self.cols[Col.STATE]))

    def _merged(self) -> dict[str, np.ndarray]:
        with self.lock:
            for k, parts in self.cols.items():
                if len(parts) > 1:
                    self.cols[k] = [np.concatenate(parts)]
            return {k: v[0] for k, v in self.cols.items()}

    def _batch(self) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
        d = self._merged()
        n = len(d[Col.STATE])
        idx = self.rng.integers(0, n, size=min(self.batch_size, max(n, 1)))
        dev = self.device
        obs: dict[str, Any] = {Col.STATE: torch.from_numpy(d[Col.STATE][idx]).to(dev),
                               Col.IMAGES: {c: torch.from_numpy(d[f"images/{c}"][idx]).to(dev) for c in self.cameras}}  # fmt: skip
        if self.spec.instruction:
            obs[Col.INSTRUCTION] = [str(x) for x in d[Col.INSTRUCTION][idx]]
        return obs, torch.from_numpy(d["target"][idx]).to(dev), torch.from_numpy(d["valid"][idx]).to(dev)

    # ------------------------------------------------------------ training
    def train(self, updates: int) -> dict[str, Any]:
        for _ in range(updates):
            if self.size() == 0:
                break
            if self.bc.num_updates == 0:
                self._fit_normalizer()
            obs, target, valid = self._batch()
            if self.horizon > 1:
                self.last_loss = self.bc.step(obs, target, valid)
            else:
                self.last_loss = self.bc.step(obs, target[:, 0])
            if self.bc.num_updates % self.publish_every == 0:
                self.publish()
        return self.stats()

    def _fit_normalizer(self) -> None:
        """State statistics from the data held before the first update (the demonstrations)."""
        states = self._merged()[Col.STATE]
        if hasattr(self.policy, "fit_normalizer"):
            self.policy.fit_normalizer(torch.from_numpy(states).to(self.device))

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
            src = np.concatenate(self.cols["source"]) if self.cols["source"] else np.zeros(0, np.int8)
        return {
            "updates": self.bc.num_updates,
            "version": self.version,
            "samples": int(len(src)),
            "corrections": int((src == 1).sum()),
            "loss": self.last_loss,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "updates": self.bc.num_updates, "version": self.version}
