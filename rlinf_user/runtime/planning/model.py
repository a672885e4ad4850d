"""The cost model of a training pipeline: what a placement would do, from measured role costs.

The pipeline is env workers -> (rollout server) -> replay or segments -> learner -> weights.
Each role's cost comes from :mod:`.profile` (seconds of wall clock and of CPU, measured on
this machine); a :class:`Candidate` is one way to place the roles. :func:`predict` gives a
candidate's env steps/s and updates/s as the tightest of its bottlenecks:

* **each env worker** is one process stepping its ``E`` envs in lockstep: a vector step
  costs the envs' step, the policy's act on ``E`` observations (or a round trip to the
  rollout server), and the rows' write and send; ``W`` workers give at most
  ``W * E / t_worker`` env steps/s;
* **the learner** is one process: per update it samples a batch (in process when
  collocated; from the replay actor otherwise, pipelined) and updates; when collocated it
  also stores every row the workers send. Its busy time per second is at most 1;
* **the rollout server** (when on) answers every worker's act in shared batches: per
  second at most 1 of its time, at the batch the workers' requests form;
* **data-parallel learner replicas** (``placement.learner_replicas = N``, replay algorithms):
  each replica updates on ``1/N`` of the batch, so an update costs the update at ``B / N``
  plus what the replicas add (the shards sent to them, the gradients' all-reduce, the wait
  for the slowest), measured at ``N = 2`` and taken as flat in ``N`` (a ring all-reduce
  sends about twice the gradients per replica whatever ``N``; the shards shrink). An update
  bound by launching kernels, not by arithmetic, costs as much at ``B / N`` as at ``B``: there
  replicas only add their overhead. On CPUs each replica is a busy process;
* **the CPU**: every process's CPU seconds per second summed stay within the cores
  (``cores * efficiency``; the efficiency is what the scheduler and the runtime's own
  threads leave, calibrated against measured runs in ``benchmarks/bench_placement.py``).

Replay algorithms run at their update-to-data ratio ``u`` (``paced``: the workers wait for
the learner): env steps/s ``R`` is the largest with ``u R`` updates/s fitting every
bottleneck above. On-policy rounds run one after the other: collect ``num_steps`` per env,
then update (:func:`predict` sums them). Robots step at their own rate: a candidate whose
learner would hold a robot back is marked, never chosen.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

MODES = ("collocated", "disaggregated")
NEAR = 0.98  # predictions this close to the best are equals: the simpler placement wins
CPU_EFFICIENCY = 0.9  # the share of the cores the roles get (the rest: Ray, the driver, the OS)


@dataclass
class Curve:
    """Seconds per call at measured batch sizes (wall and CPU), interpolated between them
    and extrapolated linearly past the largest."""

    wall: dict[int, float] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)

    def _at(self, table: dict[int, float], n: float) -> float:
        if not table:
            return 0.0
        xs = sorted(table)
        if n <= xs[0]:
            return table[xs[0]] * (n / xs[0] if xs[0] > 1 else 1.0)
        for a, b in zip(xs, xs[1:]):
            if n <= b:
                f = (n - a) / (b - a)
                return table[a] + f * (table[b] - table[a])
        if len(xs) == 1:
            return table[xs[0]] * n / xs[0]
        a, b = xs[-2], xs[-1]
        slope = max(0.0, (table[b] - table[a]) / (b - a))
        return table[b] + slope * (n - b)

    def wall_s(self, n: float) -> float:
        return self._at(self.wall, n)

    def cpu_s(self, n: float) -> float:
        return self._at(self.cpu or self.wall, n)

    @classmethod
    def from_dict(cls, d: dict) -> Curve:
        return cls({int(k): float(v) for k, v in d.get("wall", {}).items()},
                   {int(k): float(v) for k, v in d.get("cpu", {}).items()})  # fmt: skip


@dataclass
class Costs:
    """What :mod:`.profile` measured on this machine (seconds)."""

    cores: int
    gpus: int = 0
    env_step: Curve = field(default_factory=Curve)  # one vector step of E envs, by E
    # one step of the real env worker with its own policy (env, act, writer, sends), by E
    worker: Curve = field(default_factory=Curve)
    act: dict[str, Curve] = field(default_factory=dict)  # the policy's act on B observations, by device
    row: Curve = field(default_factory=Curve)  # a worker's write and send of B rows (its side)
    store: Curve = field(default_factory=Curve)  # the buffer's side of storing B rows
    # one learner update (sampling included), by device; "<device>_beside_worker": the same
    # while a real env worker steps in its own process beside it (the cores and caches shared)
    update: dict[str, Curve] = field(default_factory=dict)
    sample_transfer: Curve = field(default_factory=Curve)  # a batch from the replay actor (disaggregated), by B
    # the learner's own sampling of a batch from its buffer (collocated), by B: part of
    # ``update``; disaggregated, the replay actor samples while the learner updates
    sampling: Curve = field(default_factory=Curve)
    call_s: float = 0.0  # one actor call's fixed cost (a rollout call, a request to the rollout server)
    request: Curve = field(default_factory=Curve)  # a request to the rollout server for E observations, alone
    # what N >= 2 data-parallel learner replicas add to an update, by device: keyed by N
    # (measured at 2; flat past the largest measured)
    dp_overhead: dict[str, Curve] = field(default_factory=dict)
    # starting one data-parallel replica until its first update (its process, the gradient
    # group), by device: what a run or a re-plan that adds replicas pays once
    replica_start_s: dict[str, float] = field(default_factory=dict)
    publish_s: float = 0.0  # publishing the weights once (learner side)
    apply_s: float = 0.0  # a worker taking one publication
    robot_hz: float | None = None  # the env steps at a robot's fixed rate: its step is 1 / hz

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Costs:
        return cls(
            cores=int(d["cores"]), gpus=int(d.get("gpus", 0)), env_step=Curve.from_dict(d.get("env_step", {})),
            worker=Curve.from_dict(d.get("worker", {})),
            act={k: Curve.from_dict(v) for k, v in d.get("act", {}).items()}, row=Curve.from_dict(d.get("row", {})),
            store=Curve.from_dict(d.get("store", {})),
            update={k: Curve.from_dict(v) for k, v in d.get("update", {}).items()},
            sample_transfer=Curve.from_dict(d.get("sample_transfer", {})), call_s=float(d.get("call_s", 0.0)),
            sampling=Curve.from_dict(d.get("sampling", {})),
            request=Curve.from_dict(d.get("request", {})),
            dp_overhead={k: Curve.from_dict(v) for k, v in d.get("dp_overhead", {}).items()},
            replica_start_s={k: float(v) for k, v in d.get("replica_start_s", {}).items()},
            publish_s=float(d.get("publish_s", 0.0)), apply_s=float(d.get("apply_s", 0.0)),
            robot_hz=d.get("robot_hz"),
        )  # fmt: skip


@dataclass(frozen=True)
class Pipeline:
    """What the algorithm asks of the pipeline (its data plan) and the run's fixed settings."""

    on_policy: bool
    batch_size: int = 256
    utd_ratio: float = 1.0
    paced: bool = True
    horizon: int = 1  # actions per decision: a chunk's act serves H env steps
    chunk_rows: bool = False  # a chunk is one replay row
    num_steps: int = 0  # on-policy: env steps per env in a round
    publish_every_updates: int = 50
    rollout_steps: int = 100  # env steps per rollout call of a worker
    send_rows: int = 50  # rows a worker batches per send (buffer.chunk_steps)
    robots: int = 0  # env workers pinned to robots (their count is fixed)


@dataclass
class Sites:
    """A cluster candidate whose workers and learner are on different nodes (:mod:`.cluster`):
    the learner's node's CPUs, where the rollout server is, and what the link between the
    two nodes costs (measured between them)."""

    learner_cores: float
    rollout_with_learner: bool = True  # the rollout server on the learner's node (else the workers')
    link_rows_s: float = 0.0  # a worker's chunk of ``send_rows`` rows, from its node to the learner's
    link_weights_s: float = 0.0  # one publication of the weights, from the learner's node to a worker's
    rollout_act: dict[str, Curve] | None = None  # the policy's act on the rollout server's node, by device


@dataclass(frozen=True)
class Candidate:
    mode: str
    workers: int
    envs_per_worker: int
    rollout: bool = False
    learner_device: str = "cpu"
    act_device: str = "cpu"  # where the policy acts: each worker's, or the rollout server's
    learner_replicas: int = 1  # data-parallel copies of the learner, each on 1/N of a batch
    # node groups (``placement.groups``) on a cluster; "" on one machine (:mod:`.cluster`)
    learner_group: str = ""  # the learner, its replay buffer and weight store
    worker_group: str = ""  # the env workers ("" with robots: their robots' nodes)
    rollout_group: str = ""  # the rollout server

    def label(self) -> str:
        served = f" + rollout server ({self.act_device})" if self.rollout else ""
        dev = "" if self.learner_device == "cpu" else f", learner on {self.learner_device}"
        dp = f", {self.learner_replicas} learner replicas" if self.learner_replicas > 1 else ""
        return f"{self.mode}, {self.workers} x {self.envs_per_worker} envs{served}{dev}{dp}{self.where()}"

    def where(self) -> str:
        """The node groups, where the candidate names them."""
        if not (self.learner_group or self.worker_group):
            return ""
        served = f", server on {self.rollout_group}" if self.rollout and self.rollout_group else ""
        return f" [learner on {self.learner_group}, workers on {self.worker_group or 'the robots'}{served}]"

    def overrides(self) -> list[str]:
        """The command-line overrides that set this placement."""
        p = self.placement()
        return [f"placement={p['mode']}", f"placement.num_env_workers={p['num_env_workers']}",
                f"placement.envs_per_worker={p['envs_per_worker']}",
                f"placement.rollout.enabled={str(self.rollout).lower()}",
                *([f"placement.rollout.device={self.act_device}"] if self.rollout else []),
                f"placement.learner_device={self.learner_device}",
                f"placement.learner_replicas={self.learner_replicas}",
                *[f"placement.{role}.group={g}" for role, g in self.groups().items()]]  # fmt: skip

    def groups(self) -> dict[str, str]:
        """The node group of each placed role (``placement.<role>.group``); empty on one machine."""
        if not self.learner_group:
            return {}
        out = {"learner": self.learner_group, "buffer": self.learner_group}
        if self.worker_group:  # a simulator's evaluation steps beside its workers
            out["env_worker"] = out["eval_worker"] = self.worker_group
        if self.rollout and self.rollout_group:
            out["rollout"] = self.rollout_group
        return out

    def placement(self) -> dict[str, Any]:
        """The ``placement.*`` values this candidate sets."""
        out = {"mode": self.mode, "num_env_workers": self.workers, "envs_per_worker": self.envs_per_worker,
               "rollout": {"enabled": self.rollout, "device": self.act_device},
               "learner_device": self.learner_device, "learner_replicas": self.learner_replicas}  # fmt: skip
        if self.groups():
            out["groups"] = self.groups()
        return out


@dataclass
class Prediction:
    candidate: Candidate
    env_steps_per_s: float
    updates_per_s: float
    bottleneck: str  # what limits it: workers, learner, rollout server, cpu, link, robot (its control rate)
    usage: dict[str, float]  # each role's busy share at that rate (learner, rollout, cpu)
    holds_robot: bool = False  # a robot would wait for the learner
    score: float = 0.0  # what ranks it: env steps/s at the algorithm's update-to-data ratio

    def row(self) -> dict[str, Any]:
        return {"placement": self.candidate.label(), "env_steps_per_s": round(self.env_steps_per_s, 2),
                "updates_per_s": round(self.updates_per_s, 2), "bottleneck": self.bottleneck,
                **{f"busy_{k}": round(v, 2) for k, v in self.usage.items()}}  # fmt: skip


def worker_step(costs: Costs, pipe: Pipeline, c: Candidate) -> tuple[float, float]:
    """(wall, CPU) seconds of one vector step of a worker's ``E`` envs, the rollout server's
    own time excluded."""
    e = c.envs_per_worker
    h = max(1, pipe.horizon)
    if costs.worker.wall and not costs.robot_hz:  # measured whole: the local act swapped for a request if served
        wall, cpu = costs.worker.wall_s(e), costs.worker.cpu_s(e)
        if c.rollout:
            act = costs.act[c.act_device]
            wall = max(wall - act.wall_s(e) / h, 0.0) + _request_s(costs, e) / h
            cpu = max(cpu - act.cpu_s(e) / h, 0.0) + costs.call_s / h
        return wall, cpu
    if costs.robot_hz:
        env_wall, env_cpu = 1.0 / costs.robot_hz, costs.env_step.cpu_s(e)
    else:
        env_wall, env_cpu = costs.env_step.wall_s(e), costs.env_step.cpu_s(e)
    if c.rollout:  # a request per decision; the server's time is its own bottleneck
        act_wall, act_cpu = _request_s(costs, e) / h, costs.call_s / h
    else:
        act = costs.act[c.act_device]
        act_wall, act_cpu = act.wall_s(e) / h, act.cpu_s(e) / h
    # rows go out in chunks of ``send_rows``; the send does not wait for the receiver
    rows = e / h if pipe.chunk_rows or pipe.on_policy and h > 1 else e
    send = costs.row.cpu_s(pipe.send_rows) / pipe.send_rows * rows
    call = costs.call_s / pipe.rollout_steps
    return env_wall + act_wall + send + call, env_cpu + act_cpu + send + call


def update_s(costs: Costs, upd: Curve, batch: int, c: Candidate) -> tuple[float, float]:
    """(wall, CPU) seconds of one update of the learner role on curve ``upd``: one learner at
    ``batch``, or ``N`` replicas each at ``batch / N`` plus their overhead (every replica's
    CPU counted on CPUs). ``batch / N`` scales ``upd`` at ``batch`` as the learner device's
    own curve shrinks (a curve measured beside a worker has only the run's batch)."""
    n = max(1, int(c.learner_replicas))
    wall, cpu = upd.wall_s(batch), upd.cpu_s(batch)
    if n == 1:
        return wall, cpu
    base = costs.update.get(c.learner_device, upd)
    wall *= _shrunk(base.wall, batch / n) / max(base.wall_s(batch), 1e-12)
    cpu *= _shrunk(base.cpu or base.wall, batch / n) / max(base.cpu_s(batch), 1e-12)
    over = costs.dp_overhead[c.learner_device]
    at = min(n, max(over.wall))  # flat past the largest measured
    return wall + over.wall_s(at), (n * cpu if c.learner_device == "cpu" else cpu) + over.cpu_s(at)


def _shrunk(table: dict[int, float], n: float) -> float:
    """A learner curve at a batch ``n`` that may be below its smallest measured one: the first
    segment's slope carried down (flat stays flat; proportional stays proportional), never
    below proportional to the batch."""
    xs = sorted(table)
    if not xs or n >= xs[0] or len(xs) == 1:
        return Curve(table).wall_s(n)
    a, b = xs[0], xs[1]
    slope = max(0.0, (table[b] - table[a]) / (b - a))
    return max(table[a] - slope * (a - n), table[a] * n / a)


def _request_s(costs: Costs, e: int) -> float:
    """A worker's wait for the rollout server's answer to E observations: the measured round
    trip (the call, the server's queue and forward pass) where profiled, else an empty call."""
    return costs.request.wall_s(e) if costs.request.wall else costs.call_s


def predict(costs: Costs, pipe: Pipeline, c: Candidate, sites: Sites | None = None) -> Prediction:
    """``c``'s throughput; ``sites``: its workers and learner on different nodes of a cluster
    (``costs`` is then the workers' node's, with the learner's curves, :mod:`.cluster`)."""
    if pipe.on_policy:
        return _predict_rounds(costs, pipe, c, sites)
    e, w, h = c.envs_per_worker, c.workers, max(1, pipe.horizon)
    step_wall, step_cpu = worker_step(costs, pipe, c)
    if sites is not None:  # a worker fetches at most one publication across the link a rollout call
        step_wall += sites.link_weights_s / pipe.rollout_steps
    u = max(pipe.utd_ratio, 1e-9)
    # the learner's update as it runs beside the workers (measured so where profiled)
    upd = costs.update.get(f"{c.learner_device}_beside_worker") or costs.update[c.learner_device]
    if sites is not None:  # no worker beside it on its own node
        upd = costs.update[c.learner_device]
    upd_wall, upd_cpu = update_s(costs, upd, pipe.batch_size, c)
    if c.mode == "disaggregated":  # the replay actor samples the next batch while the learner updates
        own = costs.sampling.wall_s(pipe.batch_size)  # (a pixel learner in a run: ~19% of its time)
        upd_wall = max(upd_wall - own, costs.sample_transfer.wall_s(pipe.batch_size))
        upd_cpu += costs.sample_transfer.cpu_s(pipe.batch_size)  # the sampling's CPU: the replay actor's now
    per_update = upd_wall + costs.publish_s / max(1, pipe.publish_every_updates)
    rows_per_step = 1.0 / h if pipe.chunk_rows else 1.0
    n = pipe.send_rows
    store_wall = costs.store.wall_s(n) / n * rows_per_step  # per env step, where the buffer lives
    store_cpu = costs.store.cpu_s(n) / n * rows_per_step
    learner_store = store_wall if c.mode == "collocated" else 0.0
    # CPU seconds per env step, the learner's updates aside (on a cluster: the workers' node's)
    worker_cpu = step_cpu / e + (store_cpu if sites is None else 0.0)
    limits = {"workers": w * e / step_wall}
    if sites is not None and sites.link_rows_s > 0:  # every row crosses the link to the learner's node
        limits["link"] = n / rows_per_step / sites.link_rows_s
    serve_cpu = 0.0
    if c.rollout:
        act = (sites.rollout_act if sites is not None and sites.rollout_act else costs.act)[c.act_device]
        batch = w * e  # the workers' requests arrive together in lockstep
        limits["rollout server"] = batch * h / act.wall_s(batch)
        serve_cpu = act.cpu_s(batch) / (batch * h) if c.act_device == "cpu" else 0.0
    cores = costs.cores * CPU_EFFICIENCY
    served_far = sites is not None and sites.rollout_with_learner  # the server's CPU on the learner's node
    if pipe.paced:  # the workers wait for the learner: u updates per env step
        limits["learner"] = 1.0 / (u * per_update + learner_store)
        if sites is None:
            limits["cpu"] = cores / (worker_cpu + serve_cpu + u * upd_cpu)
        else:
            limits["cpu"] = cores / max(worker_cpu + (0.0 if served_far else serve_cpu), 1e-12)
            limits["learner's node cpu"] = sites.learner_cores * CPU_EFFICIENCY / max(
                u * upd_cpu + store_cpu + (serve_cpu if served_far else 0.0), 1e-12)
        neck = min(limits, key=limits.get)
        rate = limits[neck]
        updates = u * rate
    else:  # both run free: the OS shares the cores among the busy processes
        replicas = c.learner_replicas - 1 if c.learner_device == "cpu" else 0
        server = 1 if c.rollout else 0
        learner_busy = 1 + replicas + (0.5 if c.mode == "disaggregated" else 0.0)
        if sites is None:
            share = learner_share = min(1.0, cores / (w + learner_busy + server))
            limits = {k: v * share for k, v in limits.items()}
        else:
            share = min(1.0, cores / (w + (0 if served_far else server)))
            learner_share = min(1.0, sites.learner_cores * CPU_EFFICIENCY / (learner_busy + (server if served_far else 0)))
            limits["workers"] *= share
            if c.rollout:
                limits["rollout server"] *= learner_share if served_far else share
        neck = min(limits, key=limits.get)
        rate = limits[neck]
        room = max(1e-9, 1.0 - rate * learner_store)  # a collocated learner also stores the rows
        updates = min(u * rate, room * learner_share / per_update)
        if updates < u * rate * 0.999:
            neck = "learner"
    # a robot steps at its own rate: held back only where paced workers would wait for the learner
    holds = bool(costs.robot_hz) and pipe.paced and neck != "workers"
    usage = {"learner": updates * per_update + rate * learner_store}
    if sites is None:
        usage["cpu"] = (rate * (worker_cpu + serve_cpu) + updates * upd_cpu) / costs.cores
    else:
        usage["cpu"] = rate * (worker_cpu + (0.0 if served_far else serve_cpu)) / costs.cores
        usage["learner_node_cpu"] = (rate * (store_cpu + (serve_cpu if served_far else 0.0)) + updates * upd_cpu) / sites.learner_cores
    if c.rollout:
        usage["rollout"] = rate / limits["rollout server"]
    if costs.robot_hz and neck == "workers":  # a robot's env steps at its control rate
        neck = "robot"
    elif holds:
        neck = "learner (the robot waits)"
    return Prediction(c, rate, updates, neck, usage, holds, min(rate, updates / u))


def _predict_rounds(costs: Costs, pipe: Pipeline, c: Candidate, sites: Sites | None = None) -> Prediction:
    """Synchronous on-policy: collection (all workers at once), then the update (on a cluster,
    the round's rows cross the link to the learner and the weights come back)."""
    e, w = c.envs_per_worker, c.workers
    step_wall, step_cpu = worker_step(costs, pipe, c)
    busy = w * step_cpu / step_wall  # cores the workers would use at full speed
    stretch = max(1.0, busy / (costs.cores * CPU_EFFICIENCY))  # more workers than cores: they share
    collect = pipe.num_steps * step_wall * stretch
    if c.rollout:
        act = costs.act[c.act_device]
        collect = max(collect, pipe.num_steps / max(1, pipe.horizon) * act.wall_s(w * e))
    rows = pipe.num_steps * w * e
    upd = costs.update.get(c.learner_device)  # by the rows of a round (profile._rounds); absent: collection alone
    update = (upd.wall_s(rows) if upd is not None else 0.0) + costs.publish_s + costs.apply_s
    if sites is not None:  # the last chunk of the round, then the weights, cross the link
        update += sites.link_rows_s * min(1.0, rows / max(1, pipe.send_rows)) + sites.link_weights_s
    rate = rows / (collect + update)
    neck = "workers" if collect >= update else "learner"
    usage = {"learner": update / (collect + update), "cpu": min(1.0, busy / costs.cores) * collect / (collect + update)}
    return Prediction(c, rate, 1.0 / (collect + update), neck, usage, False, rate)


def replica_counts(costs: Costs, pipe: Pipeline, device: str) -> list[int]:
    """Learner replica counts worth predicting on ``device``: 1, and powers of two up to its
    GPUs (or its cores: the CPU sum weighs them against the workers) where the replicas' overhead
    was measured there; replay algorithms only (an on-policy round's update count is the
    algorithm's epochs and minibatches, which the model does not see)."""
    if pipe.on_policy or device not in costs.dp_overhead:
        return [1]
    limit = costs.gpus if device == "cuda" else costs.cores
    return [1] + [n for n in (2, 4, 8) if n <= limit and pipe.batch_size // n >= 1]


def candidates(costs: Costs, pipe: Pipeline, *, max_envs: int = 16, served: bool = True) -> list[Candidate]:
    """Every placement worth predicting on these resources: both modes; 1 to ``cores``
    workers (a robot's workers: its count); 1 to ``max_envs`` envs per worker in powers of
    two; the rollout server off, and on where there is more than one worker to batch
    (``served``: the policy can be served); each device present for the learner and act,
    with 1 or more learner replicas (:func:`replica_counts`)."""
    devices = ["cpu"] + (["cuda"] if costs.gpus > 0 else [])
    learner_devices = [d for d in devices if d in costs.update] or ["cpu"]  # (not "cpu_beside_worker")
    act_devices = [d for d in devices if d in costs.act] or ["cpu"]
    if pipe.robots:
        worker_counts, env_counts = [pipe.robots], [1]
    else:
        worker_counts = list(range(1, max(1, costs.cores) + 1))
        env_counts = [2**i for i in range(int(math.log2(max_envs)) + 1)]
    out = []
    for mode in MODES:
        for w in worker_counts:
            for e in env_counts:
                for ld in learner_devices:
                    for ad in act_devices:
                        for n in replica_counts(costs, pipe, ld):
                            out.append(Candidate(mode, w, e, False, ld, ad, n))
                            if served and w * e > 1:
                                out.append(Candidate(mode, w, e, True, ld, ad, n))
    return list(dict.fromkeys(out))


def rank(costs: Costs, pipe: Pipeline, cands: list[Candidate] | None = None,
         preds: list[Prediction] | None = None) -> list[Prediction]:
    """Predictions best first: the most env steps/s at the algorithm's update-to-data ratio
    (:attr:`Prediction.score`); never one that
    holds a robot back while another does not; between near-equals (within 2%), the one
    with fewer processes and envs (less to go wrong, less policy lag). ``preds``: already
    made (a cluster's, :mod:`.cluster`)."""
    if preds is None:
        preds = [predict(costs, pipe, c) for c in (cands or candidates(costs, pipe))]
    free = [p.score for p in preds if not p.holds_robot]
    best = max(free or [p.score for p in preds])

    def near(p: Prediction) -> bool:
        return not p.holds_robot and p.score >= NEAR * best

    def simpler(p: Prediction):
        c = p.candidate
        return (c.workers * c.envs_per_worker, c.learner_replicas, c.rollout, c.mode != "collocated", -p.score)

    head = sorted((p for p in preds if near(p)), key=simpler)
    rest = sorted((p for p in preds if not near(p)), key=lambda p: (p.holds_robot, -p.score))
    return head + rest
