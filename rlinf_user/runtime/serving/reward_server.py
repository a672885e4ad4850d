"""Reward role: a learned success classifier scoring every env worker's steps.

With ``reward.classifier=PATH`` (a checkpoint from ``rlinf-user train-reward``) the run
starts one reward server; env workers send it each step's resulting observations (their
env's own, before any fleet adaptation) and store ``reward.success_reward`` where the
classifier says success, 0 elsewhere, in place of the env's reward. The env's own
``success`` (when it has one) still drives evaluation and statistics, next to the
classified success rate, so a classifier that drifts from the truth shows.

The server is a named Ray actor: a worker whose call fails (the server died) looks the
name up again until the run has started a new one, so a server crash costs a pause,
not a step.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any

import numpy as np

from rlinf_user.env.spec import Col

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 120.0


def server_name(run_dir: str) -> str:
    return f"rlinf-user-reward:{os.path.abspath(run_dir)}"


class RewardServer:
    def __init__(self, path: str, threshold: float | None = None, success_reward: float = 1.0):
        import torch

        from rlinf_user.reward.classifier import SuccessClassifier

        torch.set_num_threads(1)
        # requests arrive as read-only arrays (Ray's zero-copy reads); the classifier only reads them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.model, state = SuccessClassifier.load(path)
        self.threshold = float(state["threshold"] if threshold is None else threshold)
        self.success_reward = float(success_reward)
        self.calls = 0
        self.rows = 0
        self.positives = 0

    def spec(self) -> dict[str, Any]:
        return {"state_dim": self.model.state_dim, "cameras": dict(self.model.cameras), "threshold": self.threshold}

    def score(self, obs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """(reward, success) per row of a batch of observations."""
        state = np.asarray(obs[Col.STATE], np.float32)
        if state.ndim != 2 or state.shape[1] != self.model.state_dim:
            raise ValueError(
                f"reward: state of shape {state.shape} for a classifier of state_dim {self.model.state_dim}"
            )
        for k, (h, w) in self.model.cameras.items():
            img = obs[Col.IMAGES].get(k)
            if img is None or np.asarray(img).shape != (state.shape[0], h, w, 3):
                raise ValueError(f"reward: the classifier needs camera {k!r} as ({state.shape[0]}, {h}, {w}, 3) uint8")
        prob = self.model.probability({Col.STATE: state, Col.IMAGES: obs[Col.IMAGES]})
        success = prob >= self.threshold
        self.calls += 1
        self.rows += len(success)
        self.positives += int(success.sum())
        return (success * self.success_reward).astype(np.float32), success

    def stats(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "rows": self.rows,
            "classified_success": self.positives,
            "threshold": self.threshold,
        }

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


class RewardClient:
    """Worker side: scores batches, finding the run's server again after it was replaced."""

    def __init__(self, name: str):
        self.name = name
        self.handle = None
        self.reconnects = 0

    def score(self, obs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        import ray

        deadline = time.monotonic() + LOOKUP_TIMEOUT_S
        while True:
            try:
                if self.handle is None:
                    try:
                        self.handle = ray.get_actor(self.name)
                    except ValueError as err:  # not registered (yet): the replacement is starting
                        raise LookupError(str(err)) from err
                return ray.get(self.handle.score.remote(obs))  # a ValueError here is the server's refusal
            except (ray.exceptions.RayActorError, LookupError) as err:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the reward server {self.name} is gone and was not replaced") from err
                if self.handle is not None:
                    log.error("the reward server is gone (%s); waiting for the new one", type(err).__name__)
                    self.reconnects += 1
                self.handle = None
                time.sleep(0.5)
