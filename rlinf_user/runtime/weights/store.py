"""Versioned weight publication: learner -> env/rollout workers, never blocking either.

The learner's :class:`WeightPublisher` announces each version, with a monotonically
increasing number, to the :class:`WeightStore` (a small Ray actor). With ``changed_only``
a version carries only the tensors that changed since the last one (trainable parameters,
buffers whose values moved; a frozen backbone is sent once). Two transports move the bytes:

* ``tcp`` (default): the learner process serves its staged tensors itself
  (:mod:`rlinf_user.runtime.weights.stream`); workers pull over one persistent connection
  straight into their own buffers.
* ``ray``: tensors packed into chunks of at most ``chunk_bytes`` (a larger tensor is
  split) go into the Ray object store, and the store remembers which version holds each
  tensor's current value. Needs nothing but Ray's own ports between nodes.

A :class:`WeightSubscriber` asks for anything newer than what it holds with a call it does
not wait on, fetches in the background (the worker keeps stepping) and swaps the new
values in between two steps once all have arrived. Versions never go backwards. A worker
that falls more than ``max_lag`` versions behind waits for the newest (a staleness bound).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from rlinf_user.runtime.weights.versions import WeightStore  # noqa: F401  (re-exported)

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
                part = flat[i * per : (i + 1) * per]
                chunks.append({name: {"part": i, "parts": n, "offset": i * per, "shape": arr.shape, "data": part}})
            continue
        if current and size + arr.nbytes > chunk_bytes:
            chunks.append(current)
            current, size = {}, 0
        current[name] = arr
        size += arr.nbytes
    if current:
        chunks.append(current)
    return chunks


def _assign(tensor: torch.Tensor, arr: np.ndarray, offset: int | None = None) -> None:
    """Copy ``arr`` (possibly a read-only view of the object store) into ``tensor``, or,
    with ``offset``, into its flat elements ``[offset, offset + arr.size)`` (one part of a
    split tensor goes straight to its place: no reassembly buffer)."""
    target = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
    arr = np.asarray(arr)
    if target.device.type == "cpu" and target.is_contiguous():
        dst = target.detach().numpy()
        if offset is None:
            np.copyto(dst, arr.reshape(dst.shape), casting="same_kind")
        else:
            np.copyto(dst.reshape(-1)[offset : offset + arr.size], arr.reshape(-1), casting="same_kind")
        return
    src = torch.from_numpy(np.array(arr))
    with torch.no_grad():
        if offset is None:
            target.copy_(src.reshape(target.shape))
        else:
            target.view(-1)[offset : offset + src.numel()].copy_(src.reshape(-1))


TRANSPORTS = ("tcp", "ray")


class WeightPublisher:
    """Learner side: publish a module's (or a state dict's) weights as version ``v``.

    With ``changed_only``, given a module: trainable parameters are always sent, frozen
    ones (``requires_grad=False``) only the first time, and buffers when their values
    changed. Given a bare state dict, every tensor is compared with what was last sent.
    ``port`` (tcp): where the weight server listens (0: any free port)."""

    def __init__(
        self, store, changed_only: bool = True, chunk_bytes: int = CHUNK_BYTES, transport: str = "tcp", port: int = 0
    ):
        if transport not in TRANSPORTS:
            raise ValueError(f"weight transport must be one of {TRANSPORTS}, got {transport!r}")
        self.store = store
        self.changed_only = changed_only
        self.chunk_bytes = chunk_bytes
        self.transport = transport
        self.port = int(port)
        self._server = None
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
        by_value = {k for k in state if k not in trainable and k not in frozen}
        values = {k: _to_numpy(state[k]) for k in by_value} if self.changed_only else {}
        changed: dict[str, torch.Tensor] = {}
        for k, t in state.items():
            if not self.changed_only or k not in self._sent or k in trainable:
                changed[k] = t
            elif k in by_value and (k not in self._last or not np.array_equal(values[k], self._last[k])):
                changed[k] = t
        if self.transport == "tcp":
            if self._server is None:
                from rlinf_user.runtime.weights.stream import WeightServer

                self._server = WeightServer(port=self.port)
            self._server.begin(version, changed)  # workers may start pulling before the copies end
            announced = self.store.publish.remote(version, [], list(changed), self._server.endpoint())
            self._server.fill(changed)
            ray.get(announced)
            n_chunks = 0
        else:
            chunks = pack(to_numpy_state(changed), self.chunk_bytes)
            refs = [ray.put(c) for c in chunks]
            ray.get(self.store.publish.remote(version, refs, list(changed)))
            n_chunks = len(refs)
        if self.changed_only:
            self._sent.update(changed)
            self._last.update({k: values[k].copy() for k in changed if k in by_value})
        self.last_stats = {
            "version": version, "tensors": len(changed), "of": len(state), "chunks": n_chunks,
            "bytes": int(sum(t.numel() * t.element_size() for t in changed.values())),
            "seconds": time.perf_counter() - t0,
        }  # fmt: skip
        return version

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


class WeightSubscriber:
    """Worker side: polls the store without blocking and applies new weights between steps."""

    def __init__(
        self, store, module: torch.nn.Module, min_interval_s: float = 0.05, max_lag: int | None = None, link=None
    ):
        """``link`` (:class:`rlinf_user.netem.LinkSpec`, tcp transport): pull through an
        emulated link."""
        self.store = store
        self.link = link
        self.min_interval_s = min_interval_s
        self.max_lag = max_lag
        self._last_ask = 0.0
        self.module = module
        self.version = -1
        self.latest_seen = -1
        self._ask = None  # pending store.latest call
        self._fetch: tuple[int, list, list, float] | None = None  # ray: (version, [(v, refs)], all refs, t_pub)
        self._pull: tuple[Future, float] | None = None  # tcp: (the background fetch, t_pub)
        self._client = None
        self._pool: ThreadPoolExecutor | None = None
        self._shared: set[int] | None = None  # storages several state-dict entries use
        self.applied = 0
        self.waits = 0  # times the staleness bound made the worker wait
        self.last_latency_s: float | None = None  # publish -> applied, for the newest version
        # where that time went (seconds after the store had the version): "answered"
        # (the store's answer came back), "fetched" (every byte is here), "applied"
        self.last_timing: dict[str, float] = {}
        self._t_answer = 0.0

    def poll(self) -> bool:
        """Call between steps; returns True when new weights were applied."""
        import ray

        if self._pull is not None:
            fut, t_pub = self._pull
            if not fut.done():
                return self._bound()
            self._pull = None
            try:
                version, got = fut.result()
            except (ConnectionError, OSError) as err:
                log.warning("weights: pull from the learner failed (%s); asking again", err)
                return False
            self._apply_stream(version, got, t_pub, time.time())
            return True
        if self._fetch is not None:
            version, groups, refs, t_pub = self._fetch
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
            if len(ready) < len(refs):
                return self._bound()
            self._fetch = None
            t_fetched = time.time()
            try:
                self._apply(version, groups, t_pub, t_fetched)
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
        self._t_answer = time.time()
        if answer is None:
            return False
        version, groups, t_pub = answer
        self.latest_seen = max(self.latest_seen, version)
        if isinstance(groups, dict):  # tcp: pull from the learner on a background thread
            self._pull = (self._executor().submit(self._stream_client().fetch, groups["stream"], self.version), t_pub)
            return self._bound()
        refs = [r for _, rs in groups for r in rs]
        if not refs:  # a version that changed nothing: just take its number
            self._apply(version, groups, t_pub, self._t_answer)
            return True
        ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)  # start moving the bytes
        self._fetch = (version, groups, refs, t_pub)
        return self._bound()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="weight-pull")
        return self._pool

    def _stream_client(self):
        if self._client is None:
            from rlinf_user.runtime.weights.stream import WeightStreamClient

            self._client = WeightStreamClient(link=self.link)
        return self._client

    def _bound(self) -> bool:
        if self.max_lag is not None and self.version >= 0 and self.latest_seen - self.version > self.max_lag:
            self.waits += 1
            self.sync()
            return True
        return False

    def _done(self, version: int, t_pub: float, t_fetched: float) -> None:
        now = time.time()
        self.version = version
        self.latest_seen = max(self.latest_seen, version)
        self.applied += 1
        self.last_latency_s = now - t_pub
        self.last_timing = {"answered": self._t_answer - t_pub, "fetched": t_fetched - t_pub, "applied": now - t_pub}

    def _apply(self, version: int, groups: list, t_pub: float, t_fetched: float) -> None:
        import ray

        current = self.module.state_dict()
        for _, refs in groups:  # oldest first: a newer value of a tensor overwrites an older one
            for chunk in ray.get(list(refs)):
                for name, val in chunk.items():
                    if name not in current:
                        raise KeyError(f"weights: published tensor {name!r} is not in this worker's policy")
                    if isinstance(val, dict) and "part" in val:
                        _assign(current[name], val["data"], val["offset"])
                    else:
                        _assign(current[name], val)
        self._done(version, t_pub, t_fetched)

    def _apply_stream(self, version: int, got: dict[str, torch.Tensor], t_pub: float, t_fetched: float) -> None:
        """Swap the received buffers in (the module's old storage becomes the next receive
        buffer); copy where a swap is not safe (another device, views, shared storage)."""
        live = self.module.state_dict(keep_vars=True)
        if self._shared is None:
            seen: dict[int, int] = {}
            for t in live.values():
                seen[t.data_ptr()] = seen.get(t.data_ptr(), 0) + 1
            self._shared = {p for p, n in seen.items() if n > 1}
        for name, buf in got.items():
            t = live.get(name)
            if t is None:
                raise KeyError(f"weights: published tensor {name!r} is not in this worker's policy")
            src = buf.view(torch.bfloat16) if t.dtype == torch.bfloat16 else buf
            if src.shape != t.shape:
                raise ValueError(
                    f"weights: {name!r} arrived with shape {tuple(src.shape)}, the policy has {tuple(t.shape)}"
                )
            swap = (
                t.device.type == "cpu" and t.dtype == src.dtype and t.is_contiguous()
                and t.data_ptr() not in self._shared and t.untyped_storage().nbytes() == t.numel() * t.element_size()
            )  # fmt: skip
            with torch.no_grad():
                if swap:
                    old = t.data
                    t.data = src
                    self._client.give_back(name, old.view(torch.int16) if old.dtype == torch.bfloat16 else old)
                else:
                    t.copy_(src)
        self._done(version, t_pub, t_fetched)

    def wait_for(self, version: int, timeout: float = 120.0) -> None:
        """Block until ``version`` (or a newer one) is applied: a synchronous on-policy
        round starts only from the policy the last update published."""
        deadline = time.monotonic() + timeout
        while True:
            self.sync(timeout)
            if self.version >= version:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"policy version {version} was not published within {timeout:.0f} s (have {self.version})")
            time.sleep(0.01)

    def sync(self, timeout: float = 60.0) -> None:
        """Block until the newest published version is applied (start-up, evaluation)."""
        import ray

        if self._ask is not None:
            ray.get(self._ask, timeout=timeout)  # drop the stale in-flight answer
            self._ask = None
        self._fetch = None
        if self._pull is not None:  # the client is busy until its fetch ends
            try:
                self._pull[0].result(timeout=timeout)
            except (ConnectionError, OSError):
                pass
            self._pull = None
        deadline = time.monotonic() + timeout
        while True:
            answer = ray.get(self.store.latest.remote(self.version), timeout=timeout)
            if answer is None:
                if self.version < 0:
                    raise RuntimeError("no policy weights were published before the worker started")
                return
            version, groups, t_pub = answer
            self._t_answer = time.time()
            try:
                if isinstance(groups, dict):
                    got_version, got = self._stream_client().fetch(groups["stream"], self.version)
                    self._apply_stream(got_version, got, t_pub, time.time())
                else:
                    self._apply(version, groups, t_pub, time.time())
                return
            except (ray.exceptions.ObjectLostError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)  # a restarted learner is about to publish a complete version

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()
