"""Training-side tasks for robots served by the edge daemon.

The edge daemon serves a robot: state, images, checked motion. What counts as reward and
success is the task's business and lives on the training side, so changing the task
never touches the robot PC. ``edge`` takes reward/success from the daemon (a served
simulator computes them); ``reach`` is a goal-reaching task on the TCP position.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


class Task:
    extra_dim = 0  # floats appended to the robot state
    # action dims the task uses (None: all the robot offers); the policy acts on these only
    active: tuple[bool, ...] | None = None

    def reset(self, rng: np.random.Generator, state: np.ndarray) -> None:
        pass

    def observe(self, state: np.ndarray) -> np.ndarray:
        return state

    def draw(self, images: dict[str, np.ndarray], state: np.ndarray) -> dict[str, np.ndarray]:
        """The camera frames as the policy sees them (a task may draw into them)."""
        return images

    def evaluate(self, state: np.ndarray, body: dict[str, Any]) -> tuple[float, bool, bool]:
        """(reward, terminated, success) for the state reached by a step."""
        raise NotImplementedError


class EdgeTask(Task):
    """Reward, termination and success as computed by the served backend."""

    def evaluate(self, state, body):
        reward = body.get("reward")
        if reward is None:
            raise ValueError(
                "env.task=edge needs a backend that computes rewards (a served simulator); a "
                "robot needs a training-side task such as env.task=reach"
            )
        return float(reward), bool(body.get("terminated")), bool(body.get("success"))


@dataclasses.dataclass
class ReachTask(Task):
    """Move the TCP to a goal drawn uniformly from a box; success within ``radius`` metres.

    Observation: robot state + (goal - tcp) (3 floats). Reward: ``-distance / scale``.
    With ``goal_marker`` the goal is drawn into a calibrated camera's frames
    (:mod:`rlinf_user.env.goal_marker`); with ``goal_in_state=False`` it leaves the state,
    so the policy finds it from pixels only.
    """

    tcp_index: int
    goal_low: Sequence[float] = (0.40, -0.15, 0.25)
    goal_high: Sequence[float] = (0.60, 0.15, 0.45)
    radius: float = 0.02
    scale: float = 0.1

    translate_only: bool = True
    goal_marker: dict[str, Any] | None = None
    goal_in_state: bool = True

    def __post_init__(self) -> None:
        self.extra_dim = 3 if self.goal_in_state else 0
        self.marker = None
        if self.goal_marker:
            from rlinf_user.env.goal_marker import GoalMarker

            self.marker = GoalMarker.from_options(dict(self.goal_marker))
        elif not self.goal_in_state:
            raise ValueError("env.kwargs.goal_in_state=false hides the reach goal: show it in a camera "
                             "with env.kwargs.goal_marker.camera (and its hand-eye calibration)")  # fmt: skip
        self.low = np.asarray(self.goal_low, dtype=np.float64)
        self.high = np.asarray(self.goal_high, dtype=np.float64)
        if self.low.shape != (3,) or self.high.shape != (3,) or np.any(self.low > self.high):
            raise ValueError("reach goal box needs 3 lows <= 3 highs")
        self.goal = (self.low + self.high) / 2
        if self.translate_only:
            self.active = (True, True, True, False, False, False, False)

    def tcp(self, state: np.ndarray) -> np.ndarray:
        return np.asarray(state[self.tcp_index : self.tcp_index + 3], dtype=np.float64)

    def reset(self, rng, state):
        self.goal = rng.uniform(self.low, self.high)

    def observe(self, state):
        if not self.goal_in_state:
            return state
        return np.concatenate([state, (self.goal - self.tcp(state)).astype(np.float32)])

    def draw(self, images, state):
        if self.marker is None:
            return images
        if self.marker.camera not in images:
            raise ValueError(f"env.kwargs.goal_marker.camera={self.marker.camera!r} is not one of env.cameras "
                             f"{sorted(images)}")  # fmt: skip
        base_T_tcp = None
        if self.marker.mode == "eye_in_hand":
            from scipy.spatial.transform import Rotation

            s = np.asarray(state, dtype=np.float64)
            base_T_tcp = np.eye(4)
            base_T_tcp[:3, :3] = Rotation.from_quat(s[self.tcp_index + 3 : self.tcp_index + 7]).as_matrix()
            base_T_tcp[:3, 3] = s[self.tcp_index : self.tcp_index + 3]
        out = dict(images)
        out[self.marker.camera] = self.marker.draw(images[self.marker.camera], self.goal, base_T_tcp)
        return out

    def evaluate(self, state, body):
        dist = float(np.linalg.norm(self.goal - self.tcp(state)))
        success = dist < self.radius
        return -dist / self.scale, success, success


def make_task(name: str, spec: dict[str, Any], options: dict[str, Any]) -> Task:
    if name == "edge":
        return EdgeTask()
    if name == "reach":
        names = list(spec.get("state_names") or [])
        if "tcp_x" not in names:
            raise ValueError("task 'reach' needs a robot whose state has tcp_x/y/z (an arm)")
        keys = ("goal_low", "goal_high", "radius", "scale", "translate_only", "goal_marker", "goal_in_state")
        return ReachTask(names.index("tcp_x"), **{k: options[k] for k in keys if k in options})
    raise ValueError(f"unknown robot task {name!r}; available: reach, edge")
