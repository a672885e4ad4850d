"""Learner role: an algorithm from the registry fed by its data source, versioned
weight publication and atomic checkpoints.

The algorithm declares its data plan (:mod:`rlinf_user.algorithms.base`):

* a replay plan: batches from the replay buffer (in this process when collocated, the
  replay actor otherwise) at a bounded update-to-data ratio, demonstrations mixed in;
* an on-policy plan: ordered segments from the env workers in the algorithm's own segment
  store; one policy iteration per ``train`` call once a rollout's worth of rows is here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlinf_user.algorithms.base import ON_POLICY, algorithm_class, build_algorithm
from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.runtime.learning.device_batches import device_batches, replay_batch
from rlinf_user.runtime.learning.ordered_sink import SenderOrder

log = logging.getLogger(__name__)


def resolve_device(name: str, role: str = "learner") -> torch.device:
    """``auto``: CUDA where present; ``cuda`` without a device is an error naming the role."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(name).startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"the {role} device is {name} but this node has no CUDA device")
    return torch.device(name)


def as_spec(spec) -> EnvSpec:
    return spec if isinstance(spec, EnvSpec) else EnvSpec.from_dict(spec)


def fit_batches(got: dict[str, np.ndarray], wanted: int, sample_more) -> dict[str, np.ndarray]:
    """``wanted`` batches from ``got`` (stacked on the leading axis): its first ``wanted``, or
    all of it and ``sample_more(k)`` for the ``k`` it lacks."""
    have = len(next(iter(got.values())))
    if have < wanted:
        more = sample_more(wanted - have)
        return {k: np.concatenate([v, more[k]]) for k, v in got.items()}
    return {k: v[:wanted] for k, v in got.items()} if have > wanted else got


class Learner:
    def __init__(
        self, cfg, spec, run_dir: str, weight_store=None, replay=None, recovering: bool = False,
        replica_options: dict[str, Any] | None = None, defer_demos: bool = False,
    ):  # fmt: skip
        """``defer_demos``: the collocated buffer's demonstrations are loaded by
        :meth:`load_demos` (a run calls it once this actor is placed), not here."""
        torch.manual_seed(cfg.seed)
        threads = cfg.placement.get("learner_threads")
        torch.set_num_threads(max(1, int(cfg.placement.torch_threads if threads is None else threads)))
        self.cfg = cfg
        self.spec = as_spec(spec)
        self.device = resolve_device(cfg.placement.learner_device)
        self.algo = build_algorithm(cfg.algo, cfg.policy, self.spec, self.device)
        self.plan = self.algo.data_plan(cfg.algo)
        self.on_policy = self.plan.data_mode == ON_POLICY
        if not self.on_policy:
            self.batch_size = self.plan.batch_size
            self.demo_ratio = self.plan.demo_ratio
            self.utd_ratio = self.plan.utd_ratio
            self.learning_starts = self.plan.learning_starts
        self.run_dir = Path(run_dir)
        self.weight_store = weight_store
        self.version = -1
        self.env_steps_seen = 0
        self.lock = threading.RLock()  # publish() runs inside train() and on its own
        self.order = SenderOrder()  # workers' chunks stored in each worker's order
        self.local_replay = None
        self.remote_replay = None
        self.segments = None
        self.on_policy_stats = {"updates": 0, "rows_trained": 0, "max_policy_lag": 0}
        if self.on_policy:
            self.segments = self.algo.segment_store()
        elif replay is None:  # collocated: the buffer lives in this process
            from rlinf_user.data.replay import expected_schema
            from rlinf_user.policies.frame_features import frame_feature_settings
            from rlinf_user.runtime.learning.replay_service import (
                ReplayService,
                interventions_as_demos,
                reward_settings,
            )

            self.local_replay = ReplayService(
                cfg.buffer.capacity,
                str(self.run_dir / "buffer") if cfg.buffer.persist else None,
                None if defer_demos else cfg.demos,
                seed=cfg.seed,
                cameras=list(self.spec.cameras),
                interventions_as_demos=interventions_as_demos(cfg),
                keep_full_log=bool(cfg.buffer.get("keep_full_log", False)),
                segment_mb=float(cfg.buffer.get("segment_mb", 256.0)),
                reward=reward_settings(cfg),
                instruction=bool(self.spec.instruction),
                nstep=self.plan.n_step,
                gamma=self.plan.gamma,
                frame_features=frame_feature_settings(cfg),
                expected=expected_schema(self.spec.state_dim, dict(self.spec.cameras),
                                         frames=frame_feature_settings(cfg) is None),
                embed_rows=self.algo.policy.row_embedder() if hasattr(self.algo.policy, "row_embedder") else None,
            )
        else:
            self.remote_replay = replay
        self._demos_due = cfg.demos if defer_demos and self.local_replay is not None else None
        self._prefetch = None
        self._publisher = None
        self.update_time = 0.0
        self.warm_start_loss: float | None = None
        warm = 0 if self.on_policy else self.plan.warm_start_updates
        # run by the trainer once the learner is placed (warm_start_if_due), not here: a long
        # warm start is not a learner that cannot be placed
        self._warm_due = warm if cfg.demos and warm > 0 and not cfg.resume and not recovering else 0
        self.dp = None
        self._replicas = (int(cfg.placement.get("learner_replicas", 1) or 1), replica_options or {})
        if not self._warm_due:  # else after the warm start: replicas join with the warmed weights
            self.start_replicas()

    def start_replicas(self) -> None:
        replicas, options = self._replicas
        if replicas > 1:  # data-parallel: this is rank 0 (see rlinf_user.runtime.learning.data_parallel)
            from rlinf_user.runtime.learning.data_parallel import DataParallel

            self.dp = DataParallel(self.cfg, self.spec, self.algo, replicas, options)

    def started(self) -> bool:
        """Answers once the constructor has run (the actor was placed and built)."""
        return True

    def load_demos(self) -> int:
        """The demonstrations a deferred constructor left (collocated buffer); rows loaded."""
        path, self._demos_due = self._demos_due, None
        return self.local_replay.load_demos(path) if path else 0

    def warm_start_if_due(self) -> int:
        """The warm start a fresh run asks for (none on resume or recovery); its update count."""
        updates, self._warm_due = self._warm_due, 0
        if updates:
            log.info("warm start: %d updates on the demonstrations before the first env step", updates)
            self.warm_start(updates)  # on this learner alone, before any replica joins
            self.start_replicas()
        return updates

    def warm_start(self, updates: int) -> float:
        """The algorithm's warm start on the demonstrations before any RL update (behaviour
        cloning, or an offline phase of its own losses), so the first published policy
        already does what the demonstrator did."""
        first = self._sample_demos()
        if first is None:
            log.warning("a warm start on the demonstrations was asked for but none were loaded")
            return float("nan")

        def batches():
            yield replay_batch(first, self.spec, self.device)
            for _ in range(updates - 1):
                yield replay_batch(self._sample_demos(), self.spec, self.device)

        loss = self.algo.warm_start(batches())
        log.info("warm start: %d updates on the demonstrations, final loss %.4f", updates, loss)
        self.warm_start_loss = loss
        return loss

    def _sample_demos(self) -> dict[str, np.ndarray] | None:
        if self.local_replay is not None:
            return self.local_replay.sample_demos(self.batch_size)
        import ray

        return ray.get(self.remote_replay.sample_demos.remote(self.batch_size))

    def recover(self, checkpoint: str | None, version_floor: int) -> dict[str, Any]:
        """After a crash: the latest checkpoint (if any), and versions continuing above
        ``version_floor`` (the newest one already published)."""
        state = self.load_checkpoint(checkpoint) if checkpoint else {"env_steps": 0, "num_updates": 0}
        self.version = max(self.version, int(version_floor))
        return {**state, "version": self.version, "replay": self.replay_stats()}

    def pid(self) -> int:
        return os.getpid()

    def policy_horizon(self) -> int:
        """Actions per decision (a chunk's length; 1 for per-step policies)."""
        return max(1, int(getattr(self.algo.policy, "horizon", 1) or 1))

    def where(self) -> dict[str, Any]:
        """The node (and devices) this learner runs on, for the run summary."""
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "device": str(self.device)}

    # -- replay (collocated mode receives chunks here) --------------------------------
    def add(self, chunk: dict[str, np.ndarray], sender: str | None = None, seq: int = 0, base: int = 0) -> int:
        """Store a worker's chunk; numbered chunks are stored in their sender's order
        (:mod:`rlinf_user.runtime.learning.ordered_sink`)."""
        return self.order.add(chunk, sender, seq, base, self._store)

    def _store(self, chunk: dict[str, np.ndarray]) -> int:
        if self.segments is not None:
            try:
                return self.segments.add(chunk)
            except ValueError as err:
                log.error("rejected an on-policy chunk (nothing stored): %s", err)
                return 0
        return self.local_replay.add(chunk)

    def replay_stats(self) -> dict[str, Any]:
        if self.segments is not None:
            return {"on_policy_rows_waiting": self.segments.rows(), "dropped_stale": self.segments.dropped_stale,
                    **self.on_policy_stats, **self.order.stats()}  # fmt: skip
        if self.local_replay is not None:
            return {**self.local_replay.stats(), **self.order.stats()}
        import ray

        return ray.get(self.remote_replay.stats.remote())

    def _sample(self, num_batches: int) -> dict[str, np.ndarray]:
        bs, ratio = self.batch_size, self.demo_ratio
        if ratio >= 1.0:  # demonstrations only (behaviour cloning)
            if self.local_replay is not None:
                draws = [self.local_replay.sample_demos(bs) for _ in range(num_batches)]
            else:
                import ray

                draws = ray.get([self.remote_replay.sample_demos.remote(bs) for _ in range(num_batches)])
            if draws[0] is None:
                raise RuntimeError(f"algo={self.cfg.algo.name} trains on demonstrations only: give demos=<dataset>")
            return {k: np.stack([d[k] for d in draws]) for k in draws[0]}
        if self.local_replay is not None:
            return self.local_replay.sample(bs, num_batches, ratio)
        import ray

        # Pipelined: the next batches are already on their way while we update. A call may
        # ask for more or fewer than the prefetch holds (its update-to-data budget): the
        # surplus is left out, a shortfall sampled now.
        ref = self._prefetch or self.remote_replay.sample.remote(bs, num_batches, ratio)
        self._prefetch = self.remote_replay.sample.remote(bs, num_batches, ratio)
        return fit_batches(ray.get(ref), num_batches,
                           lambda k: ray.get(self.remote_replay.sample.remote(bs, k, ratio)))  # fmt: skip

    def _steps_stored(self) -> int:
        if self.local_replay is not None:
            return self.local_replay.steps_stored()
        import ray

        return ray.get(self.remote_replay.steps_stored.remote())

    def _buffer_size(self) -> int:
        if self.local_replay is not None:
            return self.local_replay.size()
        import ray

        return ray.get(self.remote_replay.size.remote())

    # -- weights ------------------------------------------------------------------------
    def publish(self) -> int:
        from rlinf_user.runtime.weights.store import WeightPublisher

        with self.lock:  # never while an update is changing the weights
            self.algo.check_finite({})  # nothing non-finite leaves the learner
            if self._publisher is None:
                pl = self.cfg.placement
                self._publisher = WeightPublisher(
                    self.weight_store, changed_only=bool(pl.publish_changed_only),
                    transport=str(pl.get("weight_transport", "tcp")), port=int(pl.get("weight_port", 0)),
                )  # fmt: skip
            self.version += 1
            self._publisher.publish(self.algo.acting_policy, self.version)
            return self.version

    # -- training -------------------------------------------------------------------------
    def train(self, max_updates: int, env_steps: int, min_rows: int = 1) -> dict[str, Any]:
        """Replay: up to ``max_updates`` updates without exceeding the UTD budget for
        ``env_steps`` collected so far. On-policy: one policy iteration once ``min_rows``
        rows are here, then a new version. Returns metrics (updates done may be 0)."""
        self.env_steps_seen = max(self.env_steps_seen, env_steps)
        if self.on_policy:
            return self._train_on_policy(min_rows)
        # the budget counts rows as they land, not only the driver's count of rollouts that
        # returned (100 env steps a call): a paced learner worked in turns with its workers
        self.env_steps_seen = max(self.env_steps_seen, self._steps_stored())
        budget = int(self.utd_ratio * (self.env_steps_seen - self.learning_starts)) - self.algo.num_updates
        n = max(0, min(max_updates, budget))
        if n == 0 or (self.demo_ratio < 1.0 and self._buffer_size() < self.batch_size):
            time.sleep(0.02)
            return {"updates": 0, "num_updates": self.algo.num_updates, "version": self.version}
        t0 = time.perf_counter()
        flat = self._sample(n)
        metrics: dict[str, float] = {}
        batches = [{k: v[i] for k, v in flat.items()} for i in range(n)]
        refs = None
        if self.dp is not None:  # the replicas update on their shards alongside
            refs, batches = self.dp.start_replay(batches)
        with self.lock:
            for batch in device_batches(batches, self.spec, self.device):
                metrics.update(self.algo.update(batch))
                self.algo.sync_buffers()
                self.algo.check_finite(metrics, weights=False)  # the weights: when they leave (publish)
                if self.algo.num_updates % self.cfg.publish_every_updates == 0:
                    self.publish()
            if refs is not None:
                self.dp.wait(refs)
        dt = time.perf_counter() - t0
        self.update_time += dt
        return {"updates": n, "seconds": dt, "num_updates": self.algo.num_updates, "version": self.version, **metrics}

    def _train_on_policy(self, min_rows: int) -> dict[str, Any]:
        if self.segments.rows() < max(1, min_rows):
            time.sleep(0.02)
            return {"updates": 0, "num_updates": self.algo.num_updates, "version": self.version}
        t0 = time.perf_counter()
        lag = self.cfg.placement.get("max_policy_lag")
        with self.lock:
            batch = self.segments.take(self.algo.values, self.version, None if lag is None else int(lag))
            if batch is None:
                return {"updates": 0, "num_updates": self.algo.num_updates, "version": self.version}
            lags = self.version - batch[Col.POLICY_VERSION]
            st = self.on_policy_stats
            st["updates"] += 1
            st["rows_trained"] += len(lags)
            st["max_policy_lag"] = max(st["max_policy_lag"], int(lags.max()))
            metrics = self.algo.update(batch) if self.dp is None else self.dp.update_on_policy(batch)
            self.algo.check_finite(metrics, weights=False)  # the weights: in publish, next
            self.publish()
        dt = time.perf_counter() - t0
        self.update_time += dt
        return {"updates": 1, "seconds": dt, "num_updates": self.algo.num_updates, "version": self.version,
                "policy_lag_mean": float(lags.mean()), "advantage_mean": float(batch[Col.ADVANTAGE].mean()), **metrics}  # fmt: skip

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, env_steps: int, extra: dict[str, Any] | None = None) -> str:
        ckpt_dir = self.run_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self.algo.check_finite({})  # nothing non-finite is saved
            state = {
                "agent": self.algo.checkpoint_state(),
                "algo": str(self.cfg.algo.name),
                "version": self.version,
                "env_steps": env_steps,
                "spec": self.spec.to_dict(),  # what the policy takes and gives (a fleet's union)
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
        trained = str(state.get("algo", ""))
        if not algorithm_class(self.cfg.algo).resumes(trained):
            raise ValueError(f"{path} was trained by algo={trained}; this run is algo={self.cfg.algo.name}")
        self.algo.load_checkpoint_state(state["agent"])
        if self.dp is not None:
            self.dp.sync_state()
        self.version = int(state["version"])
        self.env_steps_seen = int(state["env_steps"])
        torch.set_rng_state(state["rng"])
        return {"env_steps": self.env_steps_seen, "version": self.version, "num_updates": self.algo.num_updates}

    def replica_digests(self) -> list[float]:
        """Checksums of the lead's then each data-parallel replica's policy weights."""
        from rlinf_user.runtime.learning.data_parallel import weights_digest

        return [weights_digest(self.algo.policy), *(self.dp.digests() if self.dp is not None else [])]

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
