"""The learner's side of the profile (:mod:`.profile`): the real learner's update, alone,
beside a real env worker and as two data-parallel replicas; an on-policy round's update."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlinf_user.env.spec import Col
from rlinf_user.runtime.planning.model import Costs, Curve
from rlinf_user.runtime.planning.stand_ins import _sink_class

TRAIN_CALL_UPDATES = 50  # updates per train call of the streaming loop
ROLLOUT_STEPS = 100  # env steps per rollout call of the streaming loop (runtime.orchestration.loops)
REPLICA_GAIN_FLOOR = 0.9  # below: two replicas on half batches are worth profiling


def _timed(fn: Callable[[], Any], min_s: float, min_reps: int = 3, max_reps: int = 200) -> tuple[float, float]:
    """(wall, CPU) seconds per call of ``fn``: after one untimed call, repeated until
    ``min_s`` and ``min_reps``; the median of the wall times, CPU time averaged."""
    fn()
    walls, reps = [], 0
    c0, t_end = time.process_time(), time.perf_counter() + min_s
    while reps < min_reps or (time.perf_counter() < t_end and reps < max_reps):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
        reps += 1
    return float(np.median(walls)), (time.process_time() - c0) / reps


def steady_state(plan) -> dict[str, Any]:
    """Config overrides that skip the algorithm's opening phase (its data plan's
    ``steady_overrides``), so that a profiled update is the run's steady one."""
    return {"algo": dict(plan.steady_overrides)} if getattr(plan, "steady_overrides", ()) else {}


def _fill(learner, chunk: dict[str, np.ndarray], batch: int) -> None:
    """Chunks into ``learner``'s replay until it holds a batch and two chunks."""
    while learner._buffer_size() < max(batch, 2 * len(chunk[Col.REWARD])):
        if not learner.add(chunk):
            raise RuntimeError("the learner's replay refused the profile's rows (its log says why)")


class LearnerProfiles:
    """Mixed into :class:`~.profile.Profiler` (its ``cfg``)."""

    def _updates(self, rows, spec, plan, share: float, gpus: int) -> tuple[dict[str, Curve], Curve]:
        """The real learner (:class:`~rlinf_user.runtime.learning.learner.Learner`, in this
        process, its buffer inside it, the run's demonstrations loaded): its ``train`` calls
        as the training loop makes them, sampling included, per update; and its ``add`` of a
        worker's chunk (what a collocated learner spends on every row)."""
        import tempfile

        from omegaconf import OmegaConf

        from rlinf_user.runtime.learning.learner import Learner

        batch = int(plan.batch_size)
        chunk = self._chunk(rows)
        out, ingest = {}, Curve()
        for device in ["cpu"] + (["cuda"] if gpus else []):
            cfg = OmegaConf.merge(self.cfg, steady_state(plan),
                                  {"placement": {"learner_device": device, "learner_replicas": 1},
                                   "buffer": {"persist": False}, "publish_every_updates": 10**9})  # fmt: skip
            with tempfile.TemporaryDirectory() as run_dir:
                learner = Learner(cfg, spec, run_dir)
                try:
                    _fill(learner, chunk, batch)
                    if device == "cpu":
                        send = len(chunk[Col.REWARD])
                        ingest.wall[send], ingest.cpu[send] = _timed(lambda lr=learner: lr.add(chunk), 0.2, max_reps=50)
                        # its own sampling, part of every update here (the replay actor's, disaggregated)
                        k = TRAIN_CALL_UPDATES // 5
                        wall, cpu = _timed(lambda lr=learner, k=k: lr._sample(k), share / 4, max_reps=20)
                        out["sampling"] = Curve({batch: wall / k}, {batch: cpu / k})
                    wall, cpu = self._train_s(learner, share * 2 / (2 if gpus else 1))
                    curve = Curve({batch: wall}, {batch: cpu})
                    if batch >= 2:  # half the batch: what each of two data-parallel replicas updates on
                        learner.batch_size = batch // 2
                        curve.wall[batch // 2], curve.cpu[batch // 2] = self._train_s(learner, share / (2 if gpus else 1))
                        learner.batch_size = batch
                    if device == "cpu":  # and with a real env worker stepping beside it, as in a run
                        beside = self._beside_a_worker(lambda lr=learner: lr.train(TRAIN_CALL_UPDATES // 5, 10**9),
                                                       share)  # fmt: skip
                        out["cpu_beside_worker"] = Curve({batch: beside[0]}, {batch: beside[1]})
                finally:
                    learner.close()
            out[device] = curve
        return out, ingest

    def _chunk(self, rows) -> dict[str, np.ndarray]:
        """A worker's chunk as the run sends it (``buffer.chunk_steps`` rows of ``rows``)."""
        n = len(rows[Col.REWARD])
        send = int(self.cfg.buffer.get("chunk_steps", 50) or 50)
        return {k: v[np.arange(send) % n] for k, v in rows.items()}

    @staticmethod
    def _train_s(learner, seconds: float) -> tuple[float, float]:
        """(wall, CPU) seconds per update of the learner's ``train`` calls, over ``seconds``
        (at least 4 updates) after one untimed call."""
        learner.train(2, 10**9)
        t0, c0, done = time.perf_counter(), time.process_time(), 0
        while done < 4 or time.perf_counter() - t0 < seconds:
            done += int(learner.train(TRAIN_CALL_UPDATES // 5, 10**9)["updates"])
        return (time.perf_counter() - t0) / done, (time.process_time() - c0) / done

    def _replicas(self, rows, spec, plan, costs: Costs, share: float, gpus: int) -> dict[str, Curve]:
        """What two data-parallel learner replicas add to an update, per device where two fit
        (two cores, or two GPUs): the real lead learner and one
        :class:`~rlinf_user.runtime.learning.data_parallel.LearnerReplica` on its own Ray
        actor, each updating on half of every batch (the shards' send, the gradients'
        all-reduce, the wait for the other), less one learner's update at half the batch.
        The replica's start-up (until its first update) goes to ``costs.replica_start_s``."""
        import tempfile

        from omegaconf import OmegaConf

        from rlinf_user.runtime.learning.learner import Learner

        batch = int(plan.batch_size)
        devices = [d for d in ["cpu"] + (["cuda"] if gpus >= 2 else []) if (costs.cores if d == "cpu" else gpus) >= 2]
        # a replica's half batch costing at least REPLICA_GAIN_FLOOR of the whole batch's
        # update: replicas cannot gain there even with no overhead, and their start is the
        # profile's costliest step (DSRL over lite_vla: the noise actor's update took as long
        # at 16 rows as at 32, and a replica's start 25 s)
        devices = [d for d in devices if d in costs.update and batch // 2 in costs.update[d].wall
                   and costs.update[d].wall[batch // 2] < REPLICA_GAIN_FLOOR * costs.update[d].wall[batch]]  # fmt: skip
        if batch < 2 or not devices:
            return {}
        chunk = self._chunk(rows)
        out = {}
        for device in devices:
            cfg = OmegaConf.merge(self.cfg, steady_state(plan),
                                  {"placement": {"learner_device": device, "learner_replicas": 2},
                                   "buffer": {"persist": False}, "publish_every_updates": 10**9})  # fmt: skip
            options = self._here(**({"num_gpus": 1} if device == "cuda" else {}))
            with tempfile.TemporaryDirectory() as run_dir:
                t0 = time.perf_counter()
                learner = Learner(cfg, spec, run_dir, replica_options=options)
                try:
                    if learner.dp is None:  # a warm start due: the replicas join after it (not profiled)
                        learner.start_replicas()
                    _fill(learner, chunk, batch)
                    learner.train(1, 10**9)  # the replica's process, its gradient group, its first update
                    start_s = time.perf_counter() - t0
                    # the start-up counts against this step's share of the budget (a quarter
                    # of it stays for the timed updates)
                    wall, cpu = self._train_s(learner, max(share / 4, share - start_s) / (2 if gpus else 1))
                finally:
                    learner.close()
            costs.replica_start_s[device] = round(start_s, 3)
            half = costs.update[device]
            out[device] = Curve({2: max(0.0, wall - half.wall_s(batch / 2))}, {2: max(0.0, cpu - half.cpu_s(batch / 2))})
        return out

    def _beside_a_worker(self, train: Callable[[], dict], share: float) -> tuple[float, float]:
        """(wall, CPU) seconds per update of ``train`` calls while the real env worker runs
        its rollouts in its own process beside them: what the cores' and caches' sharing
        costs an update (on 2 vCPUs of one physical core, an update took 1.2-1.9x its time
        alone inside the runs of ``benchmarks/bench_placement.py``)."""
        import ray

        from rlinf_user.runtime.rollout.env_worker import EnvWorker

        sink = _sink_class().options(**self._here()).remote()
        worker = ray.remote(EnvWorker).options(**self._here()).remote(self.cfg, worker_id=0, sink=sink,
                                                                  seed=int(self.cfg.seed))  # fmt: skip
        try:
            ray.get(worker.rollout.remote(10))  # started and stepping: its start-up is not the cost
            calls = [worker.rollout.remote(ROLLOUT_STEPS) for _ in range(2)]
            t0, c0, done = time.perf_counter(), time.process_time(), 0
            while done < 4 or time.perf_counter() - t0 < share:
                done += int(train()["updates"])
                ready, calls = ray.wait(calls, timeout=0)
                calls += [worker.rollout.remote(ROLLOUT_STEPS) for _ in ready]  # two always queued
            return (time.perf_counter() - t0) / done, (time.process_time() - c0) / done
        finally:
            ray.kill(worker)
            ray.kill(sink)

    def _rounds(self, spec, plan, share: float, gpus: int) -> dict[str, Curve]:
        """On-policy: the real learner's update on one round of the real env worker's rows
        (``num_steps`` per env, log-probs and values included), and on half of its envs'
        rows: seconds per update by the rows in the round (the model interpolates between)."""
        import tempfile

        import ray
        from omegaconf import OmegaConf

        from rlinf_user.runtime.learning.learner import Learner
        from rlinf_user.runtime.rollout.env_worker import EnvWorker

        envs = max(8, int(self.cfg.placement.envs_per_worker))  # rounds large enough to see the slope
        sink = _sink_class().options(**self._here()).remote()
        ray.get(sink.keep.remote(True))
        worker = EnvWorker(self.cfg, worker_id=0, sink=sink, seed=int(self.cfg.seed), num_envs=envs)
        try:
            worker.rollout(int(plan.num_steps), min_version=0)
        finally:
            worker.close()
        chunks = ray.get(sink.keep.remote(False))
        rows = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
        half = {k: v[rows[Col.ENV_ID] < envs // 2] for k, v in rows.items()}
        out = {}
        for device in ["cpu"] + (["cuda"] if gpus else []):
            cfg = OmegaConf.merge(self.cfg, {"placement": {"learner_device": device}, "buffer": {"persist": False}})
            curve = Curve()
            with tempfile.TemporaryDirectory() as run_dir:
                learner = Learner(cfg, spec, run_dir)
                learner.publish = lambda: 0  # a round ends in a publication: profiled on its own (publish_s)
                try:
                    for part in (half, rows, half, rows):  # the first of each size warms up
                        learner.add(part)
                        t0, c0 = time.perf_counter(), time.process_time()
                        learner.train(0, 0, 1)
                        n = len(part[Col.REWARD])
                        curve.wall[n], curve.cpu[n] = time.perf_counter() - t0, time.process_time() - c0
                finally:
                    learner.close()
            out[device] = curve
        return out
