"""Data-parallel learners: ``placement.learner_replicas = N`` copies of the algorithm, each on
its own Ray actor (and its own GPU where the learner role has one), training on a 1/N shard
of every batch with their gradients averaged over a ``torch.distributed`` group (gloo on
CPUs, NCCL on GPUs).

The learner the trainer talks to is rank 0, the *lead*: it samples or assembles the batch,
keeps the replay buffer or the on-policy segments, publishes the weights (versioned
publication is unchanged: the rollout side never sees the replicas) and writes the
checkpoints. It starts the ``N - 1`` :class:`LearnerReplica` actors itself, so they share
its fate: when the lead dies, Ray ends them, and the restarted lead starts new ones.

Why not ``DistributedDataParallel`` itself: DDP averages gradients from hooks its
``forward`` arms, and the algorithms here call several policy methods per loss
(``log_prob``, ``value``, ``sample_features``), not one ``forward``. The algorithms instead
call :meth:`rlinf_user.algorithms.base.Algorithm.backward`, which runs DDP's reduction
(one flat all-reduce of the optimiser's gradients, divided by N) before each optimiser
step. The replicas start from the lead's weights and optimiser state and take the same
averaged step, so they stay identical; a test checks that two replicas on half batches
end where one learner on the whole batch does.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import numpy as np
import torch

from rlinf_user.algorithms.base import Algorithm, build_algorithm
from rlinf_user.env.spec import Col, EnvSpec

log = logging.getLogger(__name__)

GROUP_TIMEOUT_S = 120.0  # a replica that stops answering fails the update instead of hanging it


def open_rendezvous(world: int):
    """The lead's rendezvous store, listening on a port the OS gives it as it binds (a port
    chosen first and bound later can be taken in between: EADDRINUSE under a busy test
    suite), and ``tcp://<this node's address>:<that port>`` for the replicas."""
    import torch.distributed as dist

    try:
        import ray

        host = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray: this machine only
        host = "127.0.0.1"
    store = dist.TCPStore(host, 0, world, is_master=True, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S),
                          wait_for_workers=False)  # fmt: skip
    return store, f"tcp://{host}:{store.port}"


def join_group(algo: Algorithm, address: str, rank: int, world: int, store=None) -> None:
    """Join the process group (the call returns once all ``world`` members have joined);
    the lead passes the ``store`` it opened, the replicas its ``address``."""
    import torch.distributed as dist

    backend = "nccl" if algo.device.type == "cuda" else "gloo"
    if dist.is_initialized():
        dist.destroy_process_group()
    timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    if store is None and address.startswith("tcp://"):  # a replica: a client of the lead's store
        host, port = address[len("tcp://") :].rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world, is_master=False, timeout=timeout)
    if store is not None:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:  # file:// and env:// rendezvous
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=world, timeout=timeout)
    algo.grad_world = world


def weights_digest(module: torch.nn.Module) -> float:
    """A checksum of a module's floating-point weights (the replicas must agree on it)."""
    return float(sum(v.double().sum() for v in module.state_dict().values() if v.is_floating_point()))


def shard(columns: dict[str, Any], world: int, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s rows of a batch of columns (nested ``obs`` dicts too): equal shards,
    the remainder (fewer than ``world`` rows) left out, so every replica runs the same
    number of minibatches and collectives."""
    n = len(next(iter(_leaves(columns))))
    per = n // world
    if per == 0:
        raise ValueError(f"a batch of {n} rows cannot feed {world} data-parallel replicas")
    sl = slice(rank * per, (rank + 1) * per)
    return _take(columns, sl)


def _leaves(columns):
    for v in columns.values():
        if isinstance(v, dict):
            yield from _leaves(v)
        else:
            yield v


def _take(columns, sl):
    out = {}
    for k, v in columns.items():
        if isinstance(v, dict):
            out[k] = _take(v, sl)
        elif isinstance(v, (np.ndarray, torch.Tensor)):
            out[k] = v[sl]
        else:  # lists (instructions)
            out[k] = list(v)[sl]
    return out


class LearnerReplica:
    """Rank ``rank`` > 0 of a data-parallel learner (a Ray actor the lead starts)."""

    def __init__(self, cfg, spec, rank: int):
        from rlinf_user.runtime.learning.learner import resolve_device

        torch.manual_seed(cfg.seed)
        torch.set_num_threads(max(1, int(cfg.placement.torch_threads)))
        self.rank = rank
        self.spec = spec if isinstance(spec, EnvSpec) else EnvSpec.from_dict(spec)
        self.algo = build_algorithm(cfg.algo, cfg.policy, self.spec, resolve_device(cfg.placement.learner_device))

    def join(self, address: str, world: int, state: dict[str, Any]) -> int:
        self.algo.load_checkpoint_state(state)
        join_group(self.algo, address, self.rank, world)
        return os.getpid()

    def load(self, state: dict[str, Any]) -> None:
        self.algo.load_checkpoint_state(state)

    def update(self, batches: list[dict[str, Any]], replay: bool) -> dict[str, float]:
        from rlinf_user.runtime.learning.device_batches import device_batches

        # replay batches reach the device as they do on the learner: the next one copied during
        # this update, so a replica keeps pace with the learner it all-reduces with
        metrics: dict[str, float] = {}
        for b in device_batches(batches, self.spec, self.algo.device) if replay else batches:
            metrics = self.algo.update(b)
            self.algo.sync_buffers()
        return metrics

    def weights_digest(self) -> float:
        return weights_digest(self.algo.policy)


class DataParallel:
    """The lead's side: starts the replicas, shards each batch, runs the updates together."""

    def __init__(self, cfg, spec: EnvSpec, algo: Algorithm, world: int, actor_options: dict[str, Any]):
        import ray

        self.world, self.algo = int(world), algo
        cls = ray.remote(LearnerReplica)
        self.replicas = [cls.options(**actor_options).remote(cfg, spec.to_dict(), r) for r in range(1, self.world)]
        self.store, address = open_rendezvous(self.world)
        state = algo.checkpoint_state()
        joins = [r.join.remote(address, self.world, state) for r in self.replicas]
        join_group(algo, address, 0, self.world, store=self.store)
        self.pids = ray.get(joins)
        log.info("data-parallel learner: %d replicas (%s) joined at %s", self.world, self._backend(), address)

    def _backend(self) -> str:
        import torch.distributed as dist

        return str(dist.get_backend())

    def sync_state(self) -> None:
        """After the lead loaded a checkpoint: every replica takes the same state."""
        import ray

        state = self.algo.checkpoint_state()
        ray.get([r.load.remote(state) for r in self.replicas])

    def update_on_policy(self, batch: dict[str, Any]) -> dict[str, float]:
        import ray

        refs = [r.update.remote([shard(batch, self.world, i + 1)], False) for i, r in enumerate(self.replicas)]
        metrics = self.algo.update(shard(batch, self.world, 0))
        self.algo.sync_buffers()
        ray.get(refs)
        return {**metrics, "rows": float(len(batch[Col.ADVANTAGE])), "data_parallel": float(self.world)}

    def start_replay(self, batches: list[dict[str, np.ndarray]]) -> tuple[list, list[dict[str, np.ndarray]]]:
        """Sends each replica its shards of the sampled ``batches`` (they start updating at
        once); returns their futures and the lead's own shards, to update on alongside."""
        refs = [
            r.update.remote([shard(b, self.world, j + 1) for b in batches], True) for j, r in enumerate(self.replicas)
        ]
        return refs, [shard(b, self.world, 0) for b in batches]

    @staticmethod
    def wait(refs: list) -> None:
        import ray

        ray.get(refs)

    def digests(self) -> list[float]:
        import ray

        return ray.get([r.weights_digest.remote() for r in self.replicas])
