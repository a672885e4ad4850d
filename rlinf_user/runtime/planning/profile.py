"""A short profile of the roles' costs on this machine, for the cost model (:mod:`.model`).

Each role's work is run for real, in this process and through Ray, for a few seconds:

* ``env_step``: the run's own env, stepped by the policy's own (untrained) actions, as a
  vector of 1, 2, 4, ... envs (a robot is never stepped here: its step is its control rate);
* ``act``: the acting policy on batches of those observations, on each device present;
* ``row`` and ``store``: real transitions as replay columns, through a Ray actor call (the
  worker's serialisation and send; the receiver's deserialisation) and into a replay buffer;
* ``update``: the algorithm's update on batches sampled from those rows, on each device,
  at the run's batch and at half of it, in its steady phase; ``sampling``: the learner's own
  sampling of a batch, part of that update when collocated;
* ``dp_overhead``: what two data-parallel learner replicas (the real ones, on their own
  Ray actor) add to an update over one learner at half the batch;
* ``request``: a worker's request to the real rollout server for E observations (round
  trip, measured alone);
* ``call_s``: an actor call's fixed cost; ``publish_s`` / ``apply_s``: the policy's
  weights serialised and loaded once.

Wall and CPU seconds are both kept: a role's wall time bounds its own rate, the CPU time
what it takes from the others. A step that fails names the role and its error
(:class:`ProfileError`).
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlinf_user.env.spec import Col
from rlinf_user.runtime.planning.model import Costs, Curve, Pipeline
from rlinf_user.runtime.planning.profile_learner import ROLLOUT_STEPS, LearnerProfiles, _timed
from rlinf_user.runtime.planning.stand_ins import _sink_class, _zero_obs

log = logging.getLogger(__name__)

ENV_COUNTS = (1, 2, 4, 8)
ACT_BATCHES = (1, 2, 4, 8, 16, 32)
ROW_BATCHES = (1, 8, 64)
SLOWEST_ACT_S = 0.5  # seconds per action above which a policy cannot run a control loop on this CPU


class ProfileError(RuntimeError):
    """A profile step failed: which role, and why."""


class Budget:
    """The profile's seconds, handed out as it goes: each step gets its weight's part of the
    time left, so what comes before it and is not a measurement (Ray's start, building envs,
    a learner, starting actors: 35 of 66 s on 2 slow vCPUs, when each step had a fixed
    seventh of the budget) is taken from the steps after it. Never less than a fortieth of
    the budget a step: on a machine too slow for the budget the profile runs over rather
    than measure nothing."""

    def __init__(self, seconds: float, end: float, weights: dict[str, float]):
        self.floor = seconds / 40
        self.end = end
        self.left = dict(weights)

    def share(self, step: str) -> float:
        weight = self.left.pop(step)
        return max(self.floor, (self.end - time.perf_counter()) * weight / (weight + sum(self.left.values())))


class Profiler(LearnerProfiles):
    """Measures one composed run config's roles; :meth:`run` returns (costs, pipeline)."""

    def __init__(self, cfg, budget_s: float = 60.0, progress: Callable[[str, float], None] | None = None,
                 pin: dict[str, Any] | None = None, replicas: bool = True):
        self.cfg = cfg
        self.budget_s = float(budget_s)
        self.progress = progress or (lambda what, share: None)
        self.robot = str(cfg.env.get("kind", "sim")) == "robot"
        # Ray options that keep the profile's helper actors on this process's node (a node
        # group's profile on a cluster, :mod:`.cluster`); none on one machine
        self.pin = dict(pin or {})
        self.with_replicas = replicas  # profile data-parallel learner replicas (one machine)
        self.sizes: dict[str, int] = {}  # bytes of a worker's chunk of rows and of a publication

    def _here(self, **options) -> dict[str, Any]:
        """Ray options for a helper actor of the profile: no CPU of its own, on this node."""
        return {"num_cpus": 0, **self.pin, **options}

    def _step(self, role: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as err:  # any failure: the role and its error, not a traceback
            raise ProfileError(f"profiling the {role} failed: {type(err).__name__}: {err}") from err

    def run(self) -> tuple[Costs, Pipeline]:
        import ray

        from rlinf_user.runtime.ray_session import start_ray

        end = time.perf_counter() + self.budget_s  # Ray's start counts against the budget too
        started = start_ray({"address": "local", "num_cpus": 2, "include_dashboard": False})
        try:
            return self._run(end)
        finally:
            if started:
                ray.shutdown()

    def _run(self, end: float) -> tuple[Costs, Pipeline]:
        import os

        import torch

        from rlinf_user.algorithms.base import ON_POLICY, build_algorithm
        from rlinf_user.env.registry import make_vector_env
        from rlinf_user.env.spec import EnvSpec, stack_obs

        torch.set_num_threads(max(1, int(self.cfg.placement.torch_threads)))
        gpus = torch.cuda.device_count()
        costs = Costs(cores=os.cpu_count() or 1, gpus=gpus)
        self.progress("env", 0.0)
        envs = self._step("env", lambda: make_vector_env(self.cfg.env, 1, int(self.cfg.seed)))
        spec = EnvSpec.of_env(envs)
        algo = self._step("learner", lambda: build_algorithm(self.cfg.algo, self.cfg.policy, spec, "cpu"))
        plan = algo.data_plan(self.cfg.algo)
        policy = algo.acting_policy.eval()
        on_policy = plan.data_mode == ON_POLICY
        horizon = max(1, int(getattr(policy, "horizon", 1) or 1))
        self._fits(spec, plan, on_policy, policy, gpus)
        # the steps' weights: the replay learner's is its update alone (twice), at half the
        # batch and beside a worker; its replicas' includes their start
        stepped = {"env": 1.0, "worker": 1.0, "request": 0.5} if not self.robot else {}
        learner = {} if self.robot and on_policy else {"update": 1.0} if on_policy else {"update": 4.0, "replicas": 1.5}
        if not self.with_replicas:
            learner.pop("replicas", None)
        budget = Budget(self.budget_s, end, {**stepped, "act": 1.0, **learner})
        if self.robot:
            envs.close()
            costs.robot_hz = float(self.cfg.env.get("control_hz") or 10.0)
            obs_rows = None
        else:
            costs.env_step, obs_rows = self._step("env", lambda: self._env_steps(envs, spec, policy, budget.share("env")))
        self.progress("act", 1 / 6)
        costs.act = self._step("policy (act)", lambda: self._acts(policy, obs_rows, spec, budget.share("act"), gpus))
        self.progress("rows", 2 / 6)
        # a robot's rows: zero observations of its spec's shapes (its learner's update and its
        # rows' transport cost what they cost whatever the pixels hold)
        rows = self._rows(obs_rows or [stack_obs([_zero_obs(spec)] * 513)], spec, policy, plan)
        costs.row, costs.store, costs.sample_transfer, costs.call_s = self._step(
            "replay (rows through Ray)", lambda: self._transport(rows, int(getattr(plan, "batch_size", 256))))
        if obs_rows is not None:
            self.progress("env worker", 2.5 / 6)
            costs.worker = self._step("env worker", lambda: self._workers(budget.share("worker")))
            self.progress("rollout server", 2.8 / 6)
            costs.request = self._step("rollout server", lambda: self._requests(obs_rows, spec, budget.share("request")))
        self.progress("update", 3 / 6)
        if on_policy and not self.robot:
            costs.update = self._step("learner (update)", lambda: self._rounds(spec, plan, budget.share("update"), gpus))
        if not on_policy:
            costs.update, ingest = self._step("learner (update)",
                                              lambda: self._updates(rows, spec, plan, budget.share("update") / 4, gpus))
            costs.sampling = costs.update.pop("sampling")
            if self.with_replicas:
                self.progress("learner replicas", 4 / 6)
                costs.dp_overhead = self._step("learner replicas (data-parallel update)",
                                               lambda: self._replicas(rows, spec, plan, costs, budget.share("replicas"), gpus))  # fmt: skip
            if ingest.wall:  # the learner's own add of a chunk, and the chunk's deserialisation
                costs.store = Curve({b: v + costs.row.wall_s(b) / 2 for b, v in ingest.wall.items()},
                                    {b: v + costs.row.cpu_s(b) / 2 for b, v in ingest.cpu.items()})  # fmt: skip
        self.progress("weights", 5 / 6)
        costs.publish_s, costs.apply_s = self._step("weights", lambda: self._weights(policy))
        self.progress("done", 1.0)
        pipe = Pipeline(
            on_policy=on_policy, batch_size=int(getattr(plan, "batch_size", 256) or 256),
            utd_ratio=float(getattr(plan, "utd_ratio", 1.0)), paced=bool(getattr(plan, "paced", False)),
            horizon=horizon, chunk_rows=bool(getattr(plan, "chunk_rows", False)),
            num_steps=int(getattr(plan, "num_steps", 0) or 0),
            publish_every_updates=int(self.cfg.get("publish_every_updates", 50) or 50),
            send_rows=int(self.cfg.buffer.get("chunk_steps", 50) or 50),
            robots=(len(self.cfg.get("fleet") or []) or 1) if self.robot else 0,
        )  # fmt: skip
        return costs, pipe

    # -- what the machine cannot hold -------------------------------------------------------
    def _fits(self, spec, plan, on_policy: bool, policy, gpus: int) -> None:
        """Refuse, before profiling, a run these resources cannot hold, with the change that
        would make it fit: a replay buffer larger than the memory, a policy too slow to act
        on this CPU without a GPU."""
        from rlinf_user.data.replay import check_fits, expected_schema
        from rlinf_user.env.spec import obs_to_torch, stack_obs
        from rlinf_user.policies.frame_features import frame_feature_settings

        if not on_policy:
            frames = frame_feature_settings(self.cfg) is None
            try:
                check_fits(int(self.cfg.buffer.capacity), expected_schema(spec.state_dim, dict(spec.cameras), frames))
            except MemoryError as err:
                raise ProfileError(f"the replay buffer cannot be held here: {err}") from err
        if gpus:
            return
        import torch

        obs = obs_to_torch(stack_obs([_zero_obs(spec)]))
        t0 = time.perf_counter()
        with torch.no_grad():
            policy.act(obs, deterministic=False)
        took = time.perf_counter() - t0
        horizon = max(1, int(getattr(policy, "horizon", 1) or 1))
        if took / horizon > SLOWEST_ACT_S:
            name = str(self.cfg.policy.get("base", {}).get("name") or self.cfg.policy.name)
            raise ProfileError(
                f"policy={name} took {took:.1f} s to act once on this CPU ({took / horizon:.2f} s an action), and this "
                "machine has no GPU: run it where one is (plan there, or give placement.rollout.device=cuda on a "
                "cluster with one), or choose a smaller policy (policy=lite_vla)"
            )

    # -- the roles ------------------------------------------------------------------------
    def _env_steps(self, envs1, spec, policy, share: float):
        """Vector steps of 1, 2, 4, ... envs, acted by the policy; the observations seen."""
        from rlinf_user.env.registry import make_vector_env
        from rlinf_user.env.spec import obs_to_torch
        from rlinf_user.policies.frame_features import frame_feature_settings

        settings = frame_feature_settings(self.cfg)
        featurizer = None
        if settings is not None:  # the worker computes the frozen encoder's maps on each step's frames
            from rlinf_user.policies.frame_features import FrameFeaturizer

            featurizer = FrameFeaturizer(settings)
        seen_as = featurizer.observation if featurizer is not None else (lambda o: o)
        curve, seen = Curve(), []
        per = share / len(ENV_COUNTS)
        for e in ENV_COUNTS:
            envs = envs1 if e == 1 else make_vector_env(self.cfg.env, e, int(self.cfg.seed) + e)
            try:
                state = {"now": seen_as(envs.reset(seed=int(self.cfg.seed)))}
                import torch

                with torch.no_grad():
                    act = policy.act(obs_to_torch(state["now"]), deterministic=False).actions.numpy()
                contract = spec.expand_action(act[:, 0] if act.ndim == 3 else act)

                def step(envs=envs, contract=contract, state=state):
                    state["now"] = seen_as(envs.step(contract)[0])
                    seen.append(state["now"])

                curve.wall[e], curve.cpu[e] = _timed(step, per)
            finally:
                envs.close()
            if curve.wall[e] * ENV_COUNTS[-1] / e > share:  # larger vectors would overrun the budget
                break
        return curve, seen

    def _workers(self, share: float) -> Curve:
        """The real env worker (:class:`~rlinf_user.runtime.rollout.env_worker.EnvWorker`,
        in this process, sending to an actor) stepping 1, 2, 4, ... envs: a whole vector
        step, the writer and the sends included."""
        import ray

        from rlinf_user.runtime.rollout.env_worker import EnvWorker

        curve = Curve()
        per = share / len(ENV_COUNTS)
        sink = _sink_class().options(**self._here()).remote()
        ray.get(sink.ping.remote())  # started: its start-up is not the worker's cost
        for e in ENV_COUNTS:
            worker = EnvWorker(self.cfg, worker_id=0, sink=sink, seed=int(self.cfg.seed), num_envs=e)
            try:
                t0 = time.perf_counter()
                worker.rollout(10)
                # calls as the training loop makes them (ROLLOUT_STEPS each), or shorter where slow
                steps = int(min(ROLLOUT_STEPS, max(10, per / 3 / max(1e-6, (time.perf_counter() - t0) / 10))))
                t0, c0 = time.perf_counter(), time.process_time()
                n = 0
                while n < 2 * steps or time.perf_counter() - t0 < per:
                    worker.rollout(steps)
                    n += steps
                curve.wall[e] = (time.perf_counter() - t0) / n
                curve.cpu[e] = (time.process_time() - c0) / n
            finally:
                worker.close()
            if curve.wall[e] * ENV_COUNTS[-1] / e > share:  # larger vectors would overrun the budget
                break
        return curve

    def _requests(self, obs_rows, spec, share: float) -> Curve:
        """A worker's request to the real rollout server (a Ray actor on this machine's CPU)
        for E observations, the round trip measured alone: the call, the server's queue and
        its forward pass at that batch."""
        import ray
        from omegaconf import OmegaConf

        from rlinf_user.env.spec import batch_size, index_obs, stack_obs
        from rlinf_user.runtime.serving.rollout_server import RolloutServer

        cfg = OmegaConf.merge(self.cfg, {"placement": {"rollout": {"device": "cpu"}}})
        server = ray.remote(RolloutServer).options(**self._here()).remote(cfg, spec.to_dict())
        singles = [index_obs(b, i) for b in obs_rows[:32] for i in range(batch_size(b))]
        curve = Curve()
        try:
            for e in ENV_COUNTS:
                obs = stack_obs([singles[i % len(singles)] for i in range(e)])
                curve.wall[e], curve.cpu[e] = _timed(lambda obs=obs: ray.get(server.act.remote(obs, False, None)),
                                                     share / len(ENV_COUNTS), max_reps=100)  # fmt: skip
        finally:
            ray.kill(server)
        return curve

    def _acts(self, policy, obs_rows, spec, share: float, gpus: int) -> dict[str, Curve]:
        import torch

        from rlinf_user.env.spec import batch_size, index_obs, obs_to_torch, stack_obs

        if obs_rows:
            singles = [index_obs(batch, i) for batch in obs_rows[:64] for i in range(batch_size(batch))]
        else:  # a robot: zeros of the spec's shapes
            singles = [_zero_obs(spec)]
        out = {}
        for device in ["cpu"] + (["cuda"] if gpus else []):
            p = policy.to(device)
            curve = Curve()
            for b in ACT_BATCHES:
                obs = obs_to_torch(stack_obs([singles[i % len(singles)] for i in range(b)]), device)

                def act(p=p, obs=obs, device=device):
                    with torch.no_grad():
                        p.act(obs, deterministic=False)
                    if device == "cuda":
                        torch.cuda.synchronize()

                curve.wall[b], curve.cpu[b] = _timed(act, share / len(ACT_BATCHES) / (2 if gpus else 1))
            out[device] = curve
        policy.to("cpu")
        return out

    def _rows(self, obs_rows, spec, policy, plan) -> dict[str, np.ndarray]:
        """Replay columns of the observed transitions (a policy's extras as zeros)."""
        from rlinf_user.env.spec import batch_size, flat_obs, index_obs, stack_obs

        singles = [index_obs(b, i) for b in obs_rows for i in range(batch_size(b))][:513]
        obs, nxt = stack_obs(singles[:-1]), stack_obs(singles[1:])
        n = len(obs[Col.STATE])
        cols = {**flat_obs(Col.OBS, obs), **flat_obs(Col.NEXT_OBS, nxt)}
        cols.update({Col.ACTION: np.zeros((n, spec.contract_action_dim), np.float32),
                     Col.REWARD: np.zeros(n, np.float32), Col.TERMINATED: np.zeros(n, np.float32),
                     Col.TRUNCATED: np.zeros(n, np.float32), Col.POLICY_VERSION: np.zeros(n, np.int64),
                     Col.INTERVENTION: np.zeros(n, bool), Col.ENV_ID: np.zeros(n, np.int64),
                     Col.STEP: np.arange(n, dtype=np.int64)})  # fmt: skip
        extras = tuple(getattr(plan, "extras", ()) or ())
        if extras:  # the policy's own extras (a noise, an embedding) on a few rows, repeated
            import torch

            from rlinf_user.env.spec import obs_to_torch

            few = stack_obs(singles[: min(8, n)])
            with torch.no_grad():
                out = policy.act(obs_to_torch(few), deterministic=False).extras
            for k in extras:
                v = np.asarray(out[k].float().numpy() if hasattr(out[k], "numpy") else out[k], np.float32)
                cols[k] = v[np.arange(n) % len(v)]
        return cols

    def _transport(self, rows: dict[str, np.ndarray], batch: int):
        """A worker's send and a buffer's store of B rows through a real actor call; a
        batch's transfer from a replay actor; an empty call's cost."""
        import ray

        from rlinf_user.data.replay import ReplayBuffer

        sink = _sink_class().options(**self._here()).remote()
        ray.get(sink.ping.remote())
        n = len(rows[Col.REWARD])
        pick = lambda b: {k: v[np.arange(b) % n] for k, v in rows.items()}  # noqa: E731
        send = int(self.cfg.buffer.get("chunk_steps", 50) or 50)
        self.sizes["chunk"] = int(sum(v.nbytes for v in pick(send).values()))
        row, store, transfer = Curve(), Curve(), Curve()
        buf = ReplayBuffer(max(4096, 8 * batch))
        for b in ROW_BATCHES:
            chunk = pick(b)
            row.wall[b], row.cpu[b] = _timed(lambda chunk=chunk: ray.get(sink.add.remote(chunk)), 0.3)
            store.wall[b], store.cpu[b] = _timed(lambda chunk=chunk: buf.add(chunk), 0.2)
        ray.get(sink.fill.remote(pick(batch)))
        transfer.wall[batch], transfer.cpu[batch] = _timed(lambda: ray.get(sink.batch.remote()), 0.3)
        call_s, _ = _timed(lambda: ray.get(sink.ping.remote()), 0.2)
        # the receiver's share: deserialising is about what serialising costs the sender
        store = Curve({b: store.wall[b] + row.wall[b] / 2 for b in store.wall},
                      {b: store.cpu[b] + row.cpu[b] / 2 for b in store.cpu})  # fmt: skip
        return row, store, transfer, call_s

    def _weights(self, policy) -> tuple[float, float]:
        import torch

        state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
        buf = {}

        def publish():
            b = io.BytesIO()
            torch.save(state, b)
            buf["bytes"] = b.getvalue()
            self.sizes["weights"] = len(buf["bytes"])

        publish_s, _ = _timed(publish, 0.2, max_reps=20)
        apply_s, _ = _timed(lambda: policy.load_state_dict(torch.load(io.BytesIO(buf["bytes"]), weights_only=True)),
                            0.2, max_reps=20)  # fmt: skip
        return publish_s, apply_s
