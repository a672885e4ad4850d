"""Learner role: SAC-family updates at a bounded update-to-data ratio, versioned weight
publication and atomic checkpoints."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlinf_user.algorithms.sac import SAC

log = logging.getLogger(__name__)


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def unflatten_batch(flat: dict[str, np.ndarray], device, active_dims=None) -> dict[str, Any]:
    """Flat ``obs/state``-style keys -> the nested dict the algorithm takes, as tensors.
    ``active_dims`` selects the action columns the policy acts on."""
    if active_dims is not None and len(active_dims) != flat["action"].shape[-1]:
        flat = {**flat, "action": flat["action"][..., active_dims]}
    out: dict[str, Any] = {"obs": {"images": {}}, "next_obs": {"images": {}}}
    for key, arr in flat.items():
        t = torch.as_tensor(arr, device=device)
        parts = key.split("/")
        if parts[0] in ("obs", "next_obs"):
            if parts[1] == "state":
                out[parts[0]]["state"] = t
            else:
                out[parts[0]]["images"][parts[2]] = t
        else:
            out[key] = t.float() if t.dtype in (torch.float64, torch.bool) else t
    return out


class Learner:
    def __init__(
        self, cfg, spec: dict[str, Any], run_dir: str, weight_store=None, replay=None, recovering: bool = False
    ):
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(max(1, int(cfg.placement.torch_threads)))
        self.cfg = cfg
        self.device = resolve_device(cfg.placement.learner_device)
        self.agent = SAC(cfg.algo, cfg.policy, spec["state_dim"], spec["cameras"], spec["action_dim"], self.device)
        self.active_dims = spec.get("active_dims")
        self.spec = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.items()}
        self.spec["cameras"] = {k: list(v) for k, v in spec["cameras"].items()}
        self.run_dir = Path(run_dir)
        self.weight_store = weight_store
        self.version = -1
        self.env_steps_seen = 0
        self.lock = threading.RLock()  # publish() runs inside train() and on its own
        self.local_replay = None
        self.remote_replay = None
        if replay is None:  # collocated: the buffer lives in this process
            from rlinf_user.runtime.replay_service import ReplayService, interventions_as_demos, reward_settings

            self.local_replay = ReplayService(
                cfg.buffer.capacity,
                str(self.run_dir / "buffer") if cfg.buffer.persist else None,
                cfg.demos,
                seed=cfg.seed,
                cameras=list(spec["cameras"]),
                interventions_as_demos=interventions_as_demos(cfg),
                keep_full_log=bool(cfg.buffer.get("keep_full_log", False)),
                segment_mb=float(cfg.buffer.get("segment_mb", 256.0)),
                reward=reward_settings(cfg),
            )
        else:
            self.remote_replay = replay
        self._prefetch = None
        self._publisher = None
        self.update_time = 0.0
        self.bc_warmup_loss: float | None = None
        warm = int(getattr(cfg.algo, "bc_warmup_updates", 0) or 0) > 0
        if cfg.demos and warm and not cfg.resume and not recovering:
            self.bc_warmup(int(cfg.algo.bc_warmup_updates))

    def bc_warmup(self, updates: int) -> float:
        """Behaviour-clone the actor on the demonstrations before any RL update, so the
        first published policy already does what the demonstrator did."""
        from rlinf_user.algorithms.bc import BC

        bc = BC(self.agent.policy, lr=self.cfg.algo.actor_lr)
        loss = float("nan")
        for _ in range(updates):
            if self.local_replay is not None:
                flat = self.local_replay.sample_demos(self.cfg.algo.batch_size)
            else:
                import ray

                flat = ray.get(self.remote_replay.sample_demos.remote(self.cfg.algo.batch_size))
            if flat is None:
                log.warning("bc_warmup_updates set but no demonstrations were loaded")
                return loss
            batch = unflatten_batch(flat, self.agent.device, self.active_dims)
            loss = bc.update(batch["obs"], batch["action"])
        log.info("BC warm start: %d updates on the demonstrations, final loss %.4f", updates, loss)
        self.bc_warmup_loss = loss
        return loss

    def recover(self, checkpoint: str | None, version_floor: int) -> dict[str, Any]:
        """After a crash: the latest checkpoint (if any), and versions continuing above
        ``version_floor`` (the newest one already published)."""
        state = self.load_checkpoint(checkpoint) if checkpoint else {"env_steps": 0, "num_updates": 0}
        self.version = max(self.version, int(version_floor))
        return {**state, "version": self.version, "replay": self.replay_stats()}

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        """The node (and devices) this learner runs on, for the run summary."""
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "device": str(self.device)}

    # -- replay (collocated mode receives chunks here) --------------------------------
    def add(self, chunk: dict[str, np.ndarray]) -> int:
        return self.local_replay.add(chunk)

    def replay_stats(self) -> dict[str, Any]:
        if self.local_replay is not None:
            return self.local_replay.stats()
        import ray

        return ray.get(self.remote_replay.stats.remote())

    def _sample(self, num_batches: int) -> dict[str, np.ndarray]:
        bs, ratio = self.cfg.algo.batch_size, self.cfg.algo.demo_ratio
        if self.local_replay is not None:
            return self.local_replay.sample(bs, num_batches, ratio)
        import ray

        # Pipelined: the next batches are already on their way while we update.
        ref = self._prefetch or self.remote_replay.sample.remote(bs, num_batches, ratio)
        self._prefetch = self.remote_replay.sample.remote(bs, num_batches, ratio)
        return ray.get(ref)

    def _buffer_size(self) -> int:
        if self.local_replay is not None:
            return self.local_replay.size()
        import ray

        return ray.get(self.remote_replay.size.remote())

    # -- weights ------------------------------------------------------------------------
    def publish(self) -> int:
        from rlinf_user.runtime.weights import WeightPublisher

        with self.lock:  # never while an update is changing the weights
            if self._publisher is None:
                pl = self.cfg.placement
                self._publisher = WeightPublisher(
                    self.weight_store, changed_only=bool(pl.publish_changed_only),
                    transport=str(pl.get("weight_transport", "tcp")), port=int(pl.get("weight_port", 0)),
                )  # fmt: skip
            self.version += 1
            self._publisher.publish(self.agent.policy, self.version)
            return self.version

    # -- training -------------------------------------------------------------------------
    def train(self, max_updates: int, env_steps: int) -> dict[str, Any]:
        """Run up to ``max_updates`` updates without exceeding the UTD budget for
        ``env_steps`` collected so far. Returns metrics (updates done may be 0)."""
        algo = self.cfg.algo
        self.env_steps_seen = max(self.env_steps_seen, env_steps)
        budget = int(algo.utd_ratio * (self.env_steps_seen - algo.learning_starts)) - self.agent.num_updates
        n = max(0, min(max_updates, budget))
        if n == 0 or self._buffer_size() < algo.batch_size:
            time.sleep(0.02)
            return {"updates": 0, "num_updates": self.agent.num_updates, "version": self.version}
        t0 = time.perf_counter()
        flat = self._sample(n)
        metrics: dict[str, float] = {}
        with self.lock:
            for i in range(n):
                batch = unflatten_batch({k: v[i] for k, v in flat.items()}, self.device, self.active_dims)
                m = self.agent.update(batch)
                for k, v in m.items():
                    metrics[k] = v
                if self.agent.num_updates % self.cfg.publish_every_updates == 0:
                    self.publish()
        dt = time.perf_counter() - t0
        self.update_time += dt
        return {"updates": n, "seconds": dt, "num_updates": self.agent.num_updates, "version": self.version, **metrics}

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, env_steps: int, extra: dict[str, Any] | None = None) -> str:
        ckpt_dir = self.run_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        with self.lock:
            state = {
                "agent": self.agent.checkpoint_state(),
                "version": self.version,
                "env_steps": env_steps,
                "spec": self.spec,  # what the policy takes and gives (a fleet's union)
                "rng": torch.get_rng_state(),
                **(extra or {}),
            }
            path = ckpt_dir / f"ckpt-{env_steps:09d}.pt"
            tmp = path.with_suffix(".tmp")
            torch.save(state, tmp)
            os.replace(tmp, path)  # atomic: a crash never leaves a half checkpoint
            latest = ckpt_dir / "latest"
            tmp_latest = ckpt_dir / "latest.tmp"
            tmp_latest.write_text(path.name)
            os.replace(tmp_latest, latest)
        keep = int(self.cfg.get("keep_checkpoints", 3))
        if keep > 0:  # disk stays bounded on a long run
            for old in sorted(ckpt_dir.glob("ckpt-*.pt"))[:-keep]:
                if old != path:
                    old.unlink(missing_ok=True)
        return str(path)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.agent.load_checkpoint_state(state["agent"])
        self.version = int(state["version"])
        self.env_steps_seen = int(state["env_steps"])
        torch.set_rng_state(state["rng"])
        return {"env_steps": self.env_steps_seen, "version": self.version, "num_updates": self.agent.num_updates}

    def num_updates(self) -> int:
        return self.agent.num_updates

    def close(self) -> None:
        if self.local_replay is not None:
            self.local_replay.close()


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpt_dir = Path(run_dir) / "checkpoints"
    pointer = ckpt_dir / "latest"
    if pointer.exists():
        path = ckpt_dir / pointer.read_text().strip()
        if path.exists():
            return path
    found = sorted(ckpt_dir.glob("ckpt-*.pt"))
    return found[-1] if found else None
