"""Replay batches onto the learner's device, the next one on its way while this one trains.

A replay batch is host memory (numpy columns); an update wants device tensors. On a CPU
learner the conversion is a view and nothing is gained by overlapping it. On a GPU, moving
a pixel batch (two 128 x 128 cameras, observation and next observation, 256 rows: 50 MB)
from pageable memory costs milliseconds of the learner's thread per update; here a worker
thread gathers the next batch (when the source samples lazily), stages it in pinned memory
and queues its copy on the device's stream, while the learner's thread runs the current
update. The copy is queued behind the update already queued, so the batch is complete
before the next update reads it (one stream, in order), and nothing changes but the wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from rlinf_user.env.spec import Col, EnvSpec, columns_to_torch


def replay_batch(flat: Mapping[str, np.ndarray], spec: EnvSpec, device) -> dict[str, Any]:
    """Replay columns -> the nested tensors an algorithm takes, actions over the active dims."""
    if Col.ACTION in flat:
        flat = {**flat, Col.ACTION: spec.policy_action(flat[Col.ACTION])}
    return columns_to_torch(flat, device)


def _to_device(tree: Any, device: torch.device) -> Any:
    """Host tensors -> ``device``: staged in pinned memory, copied without blocking."""
    if isinstance(tree, torch.Tensor):
        return tree.pin_memory().to(device, non_blocking=True)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    return tree  # instructions (a list of strings) stay on the host


def device_batches(host_batches: Iterable[Mapping[str, np.ndarray]], spec: EnvSpec, device) -> Iterator[dict[str, Any]]:
    """Each host batch of ``host_batches`` (a list, or a generator that samples lazily) as
    the algorithm's device tensors, in order. On a CUDA device the next batch is gathered
    and copied by a worker thread while the caller trains on the current one."""
    device = torch.device(device)
    if device.type != "cuda":
        for flat in host_batches:
            yield replay_batch(flat, spec, device)
        return
    source = iter(host_batches)
    end = object()

    def load():
        flat = next(source, end)
        return end if flat is end else _to_device(replay_batch(flat, spec, "cpu"), device)

    with ThreadPoolExecutor(1, thread_name_prefix="batch-to-device") as worker:
        pending = worker.submit(load)
        while (batch := pending.result()) is not end:
            pending = worker.submit(load)
            yield batch
