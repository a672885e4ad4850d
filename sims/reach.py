"""``reach``: a kinematic end-effector reach task in pure NumPy (no physics engine).

The smallest task behind the env contract: a tool-centre point moves inside a 40 x 40 x 30
cm workspace box by the contract's translation deltas (``max_translation`` metres per step
at ``|a| = 1``, rotation and gripper inactive) and must come within ``success_radius`` of a
goal drawn uniformly per episode. It steps in microseconds, so a learning run through the
whole runtime (Ray env workers, learner, weight sync, evaluation) takes seconds to minutes
on a CPU: the quick check of a config, an algorithm or a cluster before a long run, and the
easy task CI learns on. It says nothing about manipulation; the ManiSkill, gym_hil and
robosuite backends are the tasks that do.

Observation ``state`` (9): TCP position, goal position, goal - TCP (metres). Reward
``dense``: ``1 - tanh(10 * distance)``; ``sparse``: success as 0/1. Success terminates.

``ReachColor``: the same reach, but the goal is known only from a camera and the language
instruction. Two targets of different colours lie on a plane (z = 0.2 m): in two places
20 cm apart, each jittered by up to 3 cm, which colour is where drawn per episode
(``layout=slots``, default), or anywhere in the workspace (``layout=anywhere``: also a
test of visual localisation, which needs far more demonstrations); the instruction
names the goal's colour ("reach the red target"); the ``top`` camera (``image_size``
square, default 64) looks down on the workspace and shows both targets and the TCP (a
white cross; its height is in the state). ``state`` (3) is the TCP position only, so a
policy must ground the colour word in the image to succeed. A VLA's quick check on a CPU.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_user.env.base import ContractEnv
from rlinf_user.env.contract import ActionSpec, make_observation

TASKS = ("Reach", "ReachColor")
LOW = np.array([0.3, -0.2, 0.05])
HIGH = np.array([0.7, 0.2, 0.35])
KWARGS = ("max_translation", "success_radius", "image_size", "layout")
SLOTS = np.array([[0.5, -0.1], [0.5, 0.1]])  # ReachColor's layout=slots: two places, 20 cm apart
SLOT_JITTER = 0.03
PLANE_Z = 0.2  # ReachColor: the targets' height, and the TCP's at reset
COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 230), "yellow": (230, 210, 40)}
TARGET_RADIUS = 0.03  # drawn radius (metres)


class ReachEnv(ContractEnv):
    """Move the TCP to a goal drawn per episode (see the module docstring)."""

    def __init__(
        self,
        task: str = "Reach",
        *,
        reward: str = "dense",
        max_episode_steps: int = 50,
        control_hz: float = 10.0,
        seed: int | None = None,
        max_translation: float = 0.02,
        success_radius: float = 0.03,
        image_size: int = 64,
        layout: str = "slots",
        cameras=(),
    ) -> None:
        self.validate(task, reward, cameras)
        self.task = task
        self.color = task == "ReachColor"
        self.reward_mode = reward
        self.max_episode_steps = int(max_episode_steps)
        self.image_size = int(image_size)
        if layout not in ("slots", "anywhere"):
            raise ValueError(f"env.kwargs.layout={layout!r}: slots (two places, colours swapped at random) or anywhere")
        self.layout = layout
        if self.color and not 16 <= self.image_size <= 512:
            raise ValueError(f"env.kwargs.image_size={image_size}: 16..512 pixels")
        self.cameras = ("top",) if self.color else ()
        self._dt = 1.0 / float(control_hz)
        self._radius = float(success_radius)
        self.action_spec = ActionSpec(
            frame="base",
            max_translation=float(max_translation),
            max_rotation=0.0,
            active=(True, True, True, False, False, False, False),
        )
        self._pending_seed = seed
        self._tcp = (LOW + HIGH) / 2
        self._goal = self._tcp.copy()
        self._time = 0.0
        self._targets = np.zeros((2, 3))
        self._target_colors = ("red", "blue")
        self._goal_color = "red"
        if self.color:
            self.instructions = tuple(f"reach the {c} target" for c in COLORS)  # the observation carries one
            self._init_spaces(3, {"top": (self.image_size, self.image_size)})
        else:
            self._init_spaces(9, {})

    @staticmethod
    def validate(task: str, reward: str, cameras=()) -> None:
        if task not in TASKS:
            raise ValueError(f"reach task {task!r} is not supported; supported: {', '.join(TASKS)}")
        if reward not in ("dense", "sparse"):
            raise ValueError(f"env.reward must be dense or sparse, got {reward!r}")
        cams = list(cameras or ())
        if task == "ReachColor":
            if cams not in ([], ["top"]):
                raise ValueError(f"ReachColor has one camera, top (env.cameras: [] or [top]), not {cams}")
        elif cams:
            raise ValueError("the reach sim's Reach task has no cameras (env.cameras must be empty; ReachColor has one)")

    @classmethod
    def validate_config(cls, cfg: Any) -> None:
        cls.validate(cfg.task, cfg.reward, cfg.cameras)
        if cfg.task == "ReachColor" and cfg.get("instruction"):
            raise ValueError("ReachColor writes its own instruction (the goal's colour): leave env.instruction unset")
        unknown = sorted(set(cfg.kwargs or {}) - set(KWARGS))
        if unknown:
            raise ValueError(f"env.kwargs {unknown} are not reach options; it takes {', '.join(KWARGS)}")

    @classmethod
    def from_config(cls, cfg: Any, seed: int | None = None) -> ReachEnv:
        return cls(
            cfg.task,
            reward=cfg.reward,
            max_episode_steps=int(cfg.max_episode_steps),
            control_hz=float(cfg.control_hz),
            seed=seed,
            cameras=list(cfg.cameras or ()),
            **dict(cfg.kwargs or {}),
        )

    @property
    def tcp(self) -> np.ndarray:
        """The TCP position (metres, base frame)."""
        return self._tcp.copy()

    @property
    def goal(self) -> np.ndarray:
        """The goal position (privileged: a scripted expert's, never the policy's)."""
        return self._goal.copy()

    def _observation(self) -> dict[str, Any]:
        if self.color:
            return make_observation(self._tcp, {"top": self.render_top()}, stamp=self._time)
        state = np.concatenate([self._tcp, self._goal, self._goal - self._tcp])
        return make_observation(state, stamp=self._time)

    def _pixels(self, xy: np.ndarray) -> tuple[float, float]:
        """Base-frame (x, y) -> (row, col): x grows down the image, y to the right."""
        n = self.image_size
        return ((xy[0] - LOW[0]) / (HIGH[0] - LOW[0]) * n, (xy[1] - LOW[1]) / (HIGH[1] - LOW[1]) * n)

    def render_top(self) -> np.ndarray:
        """The ``top`` camera: the workspace seen from above (uint8, image_size square)."""
        n = self.image_size
        img = np.full((n, n, 3), 90, np.uint8)
        rows, cols = np.mgrid[0:n, 0:n] + 0.5
        radius = TARGET_RADIUS / (HIGH[0] - LOW[0]) * n
        for pos, name in zip(self._targets, self._target_colors):
            r, c = self._pixels(pos)
            img[(rows - r) ** 2 + (cols - c) ** 2 <= radius**2] = COLORS[name]
        r, c = self._pixels(self._tcp)
        half = max(1.0, n / 32)
        arm = max(1.0, n / 128)
        cross = ((np.abs(rows - r) <= arm) & (np.abs(cols - c) <= half)) | ((np.abs(cols - c) <= arm) & (np.abs(rows - r) <= half))
        img[cross] = 255
        return img

    def _distance(self) -> float:
        return float(np.linalg.norm(self._goal - self._tcp))

    def _reset(self, seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
            gym.Env.reset(self, seed=seed)  # the contract's per-episode draws use this stream too
        self._pending_seed = None
        rng = self.np_random
        self._time = 0.0
        if self.color:
            return self._reset_color(rng)
        self._tcp = rng.uniform(LOW, HIGH)
        self._goal = rng.uniform(LOW, HIGH)
        return self._observation(), {"success": False, "distance": self._distance()}

    def _reset_color(self, rng) -> tuple[dict[str, Any], dict[str, Any]]:
        """Two targets of two colours at least 10 cm apart; the TCP on their plane, away from both."""
        names = list(COLORS)
        pick = rng.choice(len(names), size=2, replace=False)
        self._target_colors = (names[pick[0]], names[pick[1]])
        lo, hi = LOW[:2] + 0.04, HIGH[:2] - 0.04
        while True:
            if self.layout == "slots":  # two fixed places (jittered); which colour where is random
                a, b = SLOTS[rng.permutation(2)] + rng.uniform(-SLOT_JITTER, SLOT_JITTER, (2, 2))
            else:
                a, b = rng.uniform(lo, hi), rng.uniform(lo, hi)
            tcp = rng.uniform(lo, hi)
            if np.linalg.norm(a - b) > 0.1 and min(np.linalg.norm(tcp - a), np.linalg.norm(tcp - b)) > 0.08:
                break
        self._targets = np.array([[*a, PLANE_Z], [*b, PLANE_Z]])
        self._tcp = np.array([*tcp, PLANE_Z])
        self._goal_color = self._target_colors[0]
        self._goal = self._targets[0].copy()
        return self._observation(), {"success": False, "distance": self._distance()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        if self.color:  # the instruction names the goal (the first target drawn; which one is random)
            self.instruction = f"reach the {self._goal_color} target"
            obs["instruction"] = self.instruction
        return obs, info

    def _step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        delta = action[:3].astype(np.float64) * self.action_spec.max_translation
        self._tcp = np.clip(self._tcp + delta, LOW, HIGH)
        self._time += self._dt
        dist = self._distance()
        success = dist < self._radius
        reward = float(success) if self.reward_mode == "sparse" else 1.0 - float(np.tanh(10.0 * dist))
        return self._observation(), reward, success, {"success": success, "distance": dist}
