"""Versioned weight publication: learner -> env/rollout workers, never blocking either.

The learner's :class:`WeightPublisher` packs the policy's tensors into chunks of at most
``chunk_bytes`` (a tensor larger than that is split), puts them into the Ray object store
and hands the references to the :class:`WeightStore` with a monotonically increasing
version. With ``changed_only`` a version carries only the tensors that changed since the
last one (a frozen backbone is sent once), and the store remembers which version holds
each tensor's current value.

A :class:`WeightSubscriber` asks for anything newer than what it holds with a call it does
not wait on, then fetches the chunks it lacks in the background (``ray.wait`` with
``fetch_local``: across nodes the bytes move while the worker keeps stepping) and swaps
them in between two steps once all have arrived. Versions never go backwards. A worker
that falls more than ``max_lag`` versions behind waits for the newest (a staleness bound).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 2**20


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bf16: ship the bits, the receiver knows its dtype
        t = t.view(torch.int16)
    return t.numpy()


def to_numpy_state(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: _to_numpy(v) for k, v in state.items()}


def pack(state: dict[str, np.ndarray], chunk_bytes: int = CHUNK_BYTES) -> list[dict[str, Any]]:
    """Tensors grouped into chunks of at most ``chunk_bytes``; a larger tensor is split
    into flat parts ``{"part": i, "parts": n, "shape": ..., "data": ...}``."""
    chunks: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    size = 0
    for name, arr in state.items():
        arr = np.ascontiguousarray(arr)
        if arr.nbytes > chunk_bytes:
            flat = arr.reshape(-1)
            per = max(1, chunk_bytes // max(1, arr.itemsize))
            n = -(-flat.size // per)
            for i in range(n):
                chunks.append({name: {"part": i, "parts": n, "shape": arr.shape, "data": flat[i * per : (i + 1) * per]}})
            continue
        if current and size + arr.nbytes > chunk_bytes:
            chunks.append(current)
            current, size = {}, 0
        current[name] = arr
        size += arr.nbytes
    if current:
        chunks.append(current)
    return chunks


def unpack(chunks: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    parts: dict[str, dict[int, Any]] = {}
    shapes: dict[str, tuple] = {}
    counts: dict[str, int] = {}
    for chunk in chunks:
        for name, val in chunk.items():
            if isinstance(val, dict) and "part" in val:
                parts.setdefault(name, {})[val["part"]] = val["data"]
                shapes[name], counts[name] = tuple(val["shape"]), int(val["parts"])
            else:
                out[name] = val
    for name, got in parts.items():
        if len(got) != counts[name]:
            raise ValueError(f"weights: tensor {name} arrived in {len(got)} of {counts[name]} parts")
        out[name] = np.concatenate([got[i] for i in range(counts[name])]).reshape(shapes[name])
    return out


def _assign(tensor: torch.Tensor, arr: np.ndarray) -> None:
    """Copy ``arr`` (possibly a read-only view of the object store) into ``tensor``."""
    target = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
    if target.device.type == "cpu" and target.is_contiguous():
        np.copyto(target.detach().numpy(), np.asarray(arr).reshape(target.shape), casting="same_kind")
    else:
        with torch.no_grad():
            target.copy_(torch.from_numpy(np.array(arr)).reshape(target.shape))


class WeightStore:
    """Holds, for every tensor, the version (and chunk references) of its current value
    (a Ray actor in the runtime)."""

    def __init__(self) -> None:
        self.version = -1
        self.tensor_version: dict[str, int] = {}
        self.chunks: dict[int, list] = {}  # version -> its chunk references
        self.published_at: dict[int, float] = {}

    def publish(self, version: int, ref_box: list, names: list[str]) -> int:
        """``ref_box``: the version's chunk references (in a list so Ray does not resolve
        them); ``names``: the tensors it carries, on top of what earlier versions hold."""
        if version <= self.version:
            raise ValueError(f"weight version {version} is not newer than {self.version}")
        for n in names:
            self.tensor_version[n] = version
        self.version = version
        self.chunks[version] = list(ref_box)
        self.published_at[version] = time.time()
        live = set(self.tensor_version.values()) | {version}
        for v in [v for v in self.chunks if v not in live]:  # nobody's current value: drop
            del self.chunks[v]
            self.published_at.pop(v, None)
        return self.version

    def latest(self, newer_than: int = -1) -> tuple[int, list, float] | None:
        """``(version, [(v, [refs...]), ...], published_at)`` for the versions holding a
        tensor newer than ``newer_than`` (oldest first), or None when nothing is newer."""
        if self.version <= newer_than:
            return None
        wanted = sorted({v for v in self.tensor_version.values() if v > newer_than})
        return self.version, [(v, self.chunks[v]) for v in wanted], self.published_at[self.version]

    def current_version(self) -> int:
        return self.version


class WeightPublisher:
    """Learner side: publish a module's (or a state dict's) weights as version ``v``.

    With ``changed_only``, given a module: trainable parameters are always sent, frozen
    ones (``requires_grad=False``) only the first time, and buffers when their values
    changed. Given a bare state dict, every tensor is compared with what was last sent."""

    def __init__(self, store, changed_only: bool = True, chunk_bytes: int = CHUNK_BYTES):
        self.store = store
        self.changed_only = changed_only
        self.chunk_bytes = chunk_bytes
        self._sent: set[str] = set()
        self._last: dict[str, np.ndarray] = {}  # copies of the tensors compared by value
        self.last_stats: dict[str, Any] = {}

    def publish(self, source: torch.nn.Module | dict[str, torch.Tensor], version: int) -> int:
        import ray

        t0 = time.perf_counter()
        frozen: set[str] = set()
        trainable: set[str] = set()
        if isinstance(source, torch.nn.Module):
            state = source.state_dict()
            for name, p in source.named_parameters():
                (trainable if p.requires_grad else frozen).add(name)
        else:
            state = source
        arrays = to_numpy_state(state)
        changed: dict[str, np.ndarray] = {}
        for k, a in arrays.items():
            if not self.changed_only or k not in self._sent or k in trainable:
                changed[k] = a
            elif k not in frozen and not np.array_equal(a, self._last[k]):
                changed[k] = a
        chunks = pack(changed, self.chunk_bytes)
        refs = [ray.put(c) for c in chunks]
        ray.get(self.store.publish.remote(version, refs, list(changed)))
        if self.changed_only:
            self._sent.update(changed)
            self._last.update({k: a.copy() for k, a in changed.items() if k not in trainable and k not in frozen})
        self.last_stats = {
            "version": version, "tensors": len(changed), "of": len(arrays), "chunks": len(refs),
            "bytes": int(sum(a.nbytes for a in changed.values())), "seconds": time.perf_counter() - t0,
        }  # fmt: skip
        return version


class WeightSubscriber:
    """Worker side: polls the store without blocking and applies new weights between steps."""

    def __init__(self, store, module: torch.nn.Module, min_interval_s: float = 0.05, max_lag: int | None = None):
        self.store = store
        self.min_interval_s = min_interval_s
        self.max_lag = max_lag
        self._last_ask = 0.0
        self.module = module
        self.version = -1
        self.latest_seen = -1
        self._ask = None  # pending store.latest call
        self._fetch: tuple[int, list, list, float] | None = None  # (version, [(v, refs)], all refs, t_pub)
        self.applied = 0
        self.waits = 0  # times the staleness bound made the worker wait
        self.last_latency_s: float | None = None  # publish -> applied, for the newest version

    def poll(self) -> bool:
        """Call between steps; returns True when new weights were applied."""
        import ray

        if self._fetch is not None:
            version, groups, refs, t_pub = self._fetch
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
            if len(ready) < len(refs):
                return self._bound()
            self._fetch = None
            try:
                self._apply(version, groups, t_pub)
            except ray.exceptions.ObjectLostError as err:
                # its publisher (a learner that crashed) is gone; the next version replaces it
                log.warning("weights v%d are lost with their publisher (%s); asking again", version, type(err).__name__)
                return False
            return True
        if self._ask is None:
            now = time.monotonic()
            if now - self._last_ask < self.min_interval_s:
                return self._bound()
            self._last_ask = now
            self._ask = self.store.latest.remote(self.version)
            return self._bound()
        ready, _ = ray.wait([self._ask], timeout=0)
        if not ready:
            return self._bound()
        answer = ray.get(self._ask)
        self._ask = None
        if answer is None:
            return False
        version, groups, t_pub = answer
        self.latest_seen = max(self.latest_seen, version)
        refs = [r for _, rs in groups for r in rs]
        if not refs:  # a version that changed nothing: just take its number
            self._apply(version, groups, t_pub)
            return True
        ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)  # start moving the bytes
        self._fetch = (version, groups, refs, t_pub)
        return self._bound()

    def _bound(self) -> bool:
        if self.max_lag is not None and self.version >= 0 and self.latest_seen - self.version > self.max_lag:
            self.waits += 1
            self.sync()
            return True
        return False

    def _apply(self, version: int, groups: list, t_pub: float) -> None:
        import ray

        current = self.module.state_dict()
        for _, refs in groups:  # oldest first: a newer value of a tensor overwrites an older one
            for name, arr in unpack(ray.get(list(refs))).items():
                if name not in current:
                    raise KeyError(f"weights: published tensor {name!r} is not in this worker's policy")
                _assign(current[name], arr)
        self.version = version
        self.latest_seen = max(self.latest_seen, version)
        self.applied += 1
        self.last_latency_s = time.time() - t_pub

    def lag(self) -> int:
        return max(0, self.latest_seen - self.version)

    def sync(self, timeout: float = 60.0) -> None:
        """Block until the newest published version is applied (start-up, evaluation)."""
        import ray

        if self._ask is not None:
            ray.get(self._ask, timeout=timeout)  # drop the stale in-flight answer
            self._ask = None
        self._fetch = None
        deadline = time.monotonic() + timeout
        while True:
            answer = ray.get(self.store.latest.remote(self.version), timeout=timeout)
            if answer is None:
                if self.version < 0:
                    raise RuntimeError("no policy weights were published before the worker started")
                return
            version, groups, t_pub = answer
            try:
                self._apply(version, groups, t_pub)
                return
            except ray.exceptions.ObjectLostError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)  # a restarted learner is about to publish a complete version
