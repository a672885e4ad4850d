"""Rollout server: the policy-inference role, shared by every env worker of a run.

With ``placement.rollout.enabled`` env workers hold no policy: each step they send their
observations here and get actions back, with the policy version that produced them. The
server keeps one copy of the policy on its device (a GPU for a large model or a VLA),
subscribes to the learner's weights like a worker would, and batches requests
continuously: whatever arrived while the previous forward pass ran goes into the next
one (up to ``max_batch`` rows), so N workers cost one forward pass, not N, and a lone
worker waits for nobody. ``max_wait_ms`` > 0 holds a batch open that long for more.

It is an async Ray actor: requests queue on its event loop while the forward passes
(and weight polls) run on one worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from rlinf_user.env.spec import Col, batch_size, concat_obs, index_obs_torch, obs_to_torch
from rlinf_user.policies.chunk_graph import refuse_unusable_graphs
from rlinf_user.runtime.learning.learner import as_spec, resolve_device

log = logging.getLogger(__name__)


def batch_rows(obs: dict[str, Any]) -> int:
    return batch_size(obs)


class RolloutServer:
    def __init__(self, cfg, spec: dict[str, Any], weight_store=None):
        from rlinf_user.netem import LinkSpec
        from rlinf_user.policies.base import build_policy
        from rlinf_user.runtime.weights.store import WeightSubscriber

        rcfg = cfg.placement.rollout
        # requests arrive as read-only arrays (Ray's zero-copy reads); the policy only reads them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        torch.set_num_threads(max(1, int(cfg.placement.torch_threads)))
        self.device = resolve_device(str(rcfg.get("device", "auto")), "rollout")
        self.max_batch = int(rcfg.get("max_batch", 256))
        self.max_wait_s = float(rcfg.get("max_wait_ms", 0.0)) / 1000.0
        self.spec = spec = as_spec(spec)
        self.policy = build_policy(cfg.policy, spec).to(self.device)
        self.policy.eval()
        refuse_unusable_graphs(self.policy, self.device)
        self.weights = None
        if weight_store is not None:
            lag = cfg.placement.get("max_policy_lag")
            self.weights = WeightSubscriber(
                weight_store,
                self.policy,
                max_lag=None if lag is None else int(lag),
                link=LinkSpec.from_config(cfg.placement.get("weight_link")),
            )
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="rollout-forward")
        self._queue: list[tuple[dict[str, Any], bool, asyncio.Future, int | None]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.requests = 0
        self.rows = 0
        self.batches = 0
        self.max_rows = 0
        self.forward_s = 0.0
        self.oom_splits = 0  # batches that ran out of device memory and were split

    # -- serving ----------------------------------------------------------------------------
    async def act(
        self, obs: dict[str, Any], deterministic: bool = False, min_version: int | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
        """Action chunks ``(B, H, A)`` (over the spec's active dims, float32) for a batch of
        observations already adapted to the run's spec, the policy's extras (log-prob,
        value ...) per row, and the version that made them. ``min_version`` (synchronous
        on-policy rounds): answered by that version or a newer one, waiting for it."""
        n = batch_rows(obs)
        features = obs.get(Col.FEATURES) or {}  # policy.frame_features: a camera's maps in place of its frames
        for k in self.spec.cameras:
            seen = obs[Col.IMAGES].get(k) if k in obs[Col.IMAGES] else features.get(k)
            if seen is None or np.asarray(seen).shape[0] != n:
                raise ValueError(f"rollout: camera {k!r} is missing or has a different batch size than state ({n})")
        if np.asarray(obs[Col.STATE]).shape[1:] != (self.spec.state_dim,):
            raise ValueError(
                f"rollout: state of shape {np.asarray(obs[Col.STATE]).shape} for state_dim {self.spec.state_dim}"
            )
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._serve())
        fut = loop.create_future()
        self._queue.append((obs, bool(deterministic), fut, min_version))
        self._wake.set()
        return await fut

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.max_wait_s > 0 and sum(batch_rows(item[0]) for item in self._queue) < self.max_batch:
                await asyncio.sleep(self.max_wait_s)
            while self._queue:
                take, rows, rest = [], 0, []
                mode = self._queue[0][1]
                for item in self._queue:  # requests of one mode, up to max_batch rows (at least one)
                    n = batch_rows(item[0])
                    if item[1] == mode and (not take or rows + n <= self.max_batch):
                        take.append(item)
                        rows += n
                    else:
                        rest.append(item)
                self._queue = rest
                try:
                    joined = concat_obs([item[0] for item in take])
                    floor = max((item[3] for item in take if item[3] is not None), default=None)
                    actions, extras, version = await loop.run_in_executor(self._exec, self._forward, joined, mode, floor)
                except Exception as err:  # noqa: BLE001 - the callers get it, the server serves on
                    for item in take:
                        if not item[2].done():
                            item[2].set_exception(err)
                    continue
                start = 0
                for o, _, fut, _ in take:
                    n = batch_rows(o)
                    if not fut.done():
                        fut.set_result((actions[start : start + n], {k: v[start : start + n] for k, v in extras.items()}, version))
                    start += n
                self.requests += len(take)
                self.rows += rows
                self.batches += 1
                self.max_rows = max(self.max_rows, rows)

    def _forward(
        self, obs: dict[str, Any], deterministic: bool, min_version: int | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
        if self.weights is not None:
            if min_version is not None and self.weights.version < min_version:
                self.weights.wait_for(min_version)
            elif self.weights.version < 0:
                self.weights.sync()
            else:
                self.weights.poll()
        t0 = time.perf_counter()
        with torch.no_grad():
            out, extras = self._act(obs_to_torch(obs, self.device), deterministic)
        self.forward_s += time.perf_counter() - t0
        if not np.isfinite(out).all():
            raise FloatingPointError("rollout: the policy produced non-finite actions")
        return out, extras, self.weights.version if self.weights is not None else -1

    def _act(self, obs: dict[str, Any], deterministic: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The policy on a batch; out of device memory, the batch is halved (and
        ``max_batch`` with it, for every later batch) until it fits, so the server goes on
        serving smaller batches. Out of memory on a single row is the callers' error."""
        n = int(obs[Col.STATE].shape[0])
        try:
            result = self.policy.act(obs, deterministic=deterministic)
            return result.actions.float().cpu().numpy(), {k: v.float().cpu().numpy() for k, v in result.extras.items()}
        except torch.OutOfMemoryError as err:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if n == 1:
                raise RuntimeError(f"rollout: out of memory on {self.device} for a batch of 1 row: the model does not fit") from err
            self.oom_splits += 1
            self.max_batch = min(self.max_batch, max(1, n // 2))
            log.error("rollout: out of memory on %s for a batch of %d rows; serving batches of at most %d from now on",
                      self.device, n, self.max_batch)  # fmt: skip
        parts, start = [], 0
        while start < n:  # pieces of the size that fits now (a piece that fails shrinks it further)
            size = self.max_batch
            parts.append(self._act(index_obs_torch(obs, torch.arange(start, min(n, start + size))), deterministic))
            start += size
        extras = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
        return np.concatenate([p[0] for p in parts]), extras

    # -- bookkeeping ----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "rows": self.rows,
            "batches": self.batches,
            "mean_batch_rows": self.rows / self.batches if self.batches else 0.0,
            "max_batch_rows": self.max_rows,
            "forward_ms_mean": 1000 * self.forward_s / self.batches if self.batches else 0.0,
            "policy_version": self.weights.version if self.weights is not None else -1,
            "device": str(self.device),
            "oom_splits": self.oom_splits,
            "max_batch": self.max_batch,
        }

    def ping(self) -> int:
        return os.getpid()

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def close(self) -> None:
        if self.weights is not None:
            self.weights.close()
        self._exec.shutdown(wait=False, cancel_futures=True)
