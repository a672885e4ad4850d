"""The one environment contract shared by real robots and simulators.

Every backend (a Franka behind the edge daemon, ManiSkill, gym_hil, robosuite) is a
``gymnasium.Env`` whose spaces follow this module:

Observation (``gymnasium.spaces.Dict``)::

    {
      "state":      Box(float32, (D,))            proprioception (+ task state in sims)
      "images":     Dict{name: Box(uint8, (H, W, 3))}   one entry per camera (may be empty)
      "timestamps": Dict{"state": Box(float64, ()), name: Box(float64, ()) ...}
      "instruction": Text(max_length=256)           optional: the episode's language instruction
    }

A backend (or ``env.instruction`` in the config) that gives instructions sets one per
episode and repeats it in every observation of that episode; datasets record it as
LeRobot's ``task``.

Timestamps are capture times in seconds on the producing host's monotonic clock
(``time.monotonic``). A simulator stamps its simulated time.

Action: ``Box(-1, 1, (7,), float32)`` = normalised end-effector delta
``[dx, dy, dz, drx, dry, drz, gripper]``. Translation and rotation (axis-angle) deltas are
expressed in the frame named by :class:`ActionSpec.frame` (``"base"``: the robot base frame,
rotation about axes aligned with the base frame, applied at the tool centre point). A value
of 1 means the backend's per-step limit (``ActionSpec.max_translation`` metres,
``ActionSpec.max_rotation`` radians). ``gripper`` is -1 fully open, +1 fully closed.
Backends that cannot rotate the tool ignore dims 3-5 and say so in ``ActionSpec.active``.

``step`` returns ``terminated`` (task reached a terminal state: success or failure) apart
from ``truncated`` (time limit, lost connection), and ``info["success"]`` (bool) always.
"""

from __future__ import annotations

import dataclasses
import math
import string
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

ACTION_DIM = 7
MAX_INSTRUCTION_CHARS = 256
INSTRUCTION_CHARSET = string.printable
ACTION_NAMES = ("dx", "dy", "dz", "drx", "dry", "drz", "gripper")
FRAMES = ("base", "tool")


@dataclasses.dataclass(frozen=True)
class ActionSpec:
    """How a backend interprets the normalised 7-D action."""

    frame: str = "base"
    max_translation: float = 0.02  # metres per step at |a| = 1
    max_rotation: float = 0.1  # radians per step at |a| = 1
    active: tuple[bool, ...] = (True,) * ACTION_DIM

    def __post_init__(self) -> None:
        if self.frame not in FRAMES:
            raise ValueError(f"action frame must be one of {FRAMES}, got {self.frame!r}")
        if len(self.active) != ACTION_DIM:
            raise ValueError(f"ActionSpec.active needs {ACTION_DIM} flags")


def action_space() -> spaces.Box:
    return spaces.Box(-1.0, 1.0, shape=(ACTION_DIM,), dtype=np.float32)


def instruction_space() -> spaces.Text:
    return spaces.Text(max_length=MAX_INSTRUCTION_CHARS, min_length=0, charset=INSTRUCTION_CHARSET)


def observation_space(
    state_dim: int, cameras: Mapping[str, tuple[int, int]] | None = None, instruction: bool = False
) -> spaces.Dict:
    """Build the contract observation space for ``state_dim`` and ``{camera: (H, W)}``
    (with a language ``instruction`` entry when asked)."""
    cameras = dict(cameras or {})
    images = {
        name: spaces.Box(0, 255, shape=(h, w, 3), dtype=np.uint8) for name, (h, w) in cameras.items()
    }
    stamp = spaces.Box(0.0, np.inf, shape=(), dtype=np.float64)
    stamps = {"state": stamp, **{name: stamp for name in cameras}}
    entries = {
        "state": spaces.Box(-np.inf, np.inf, shape=(state_dim,), dtype=np.float32),
        "images": spaces.Dict(images),
        "timestamps": spaces.Dict(stamps),
    }
    if instruction:
        entries["instruction"] = instruction_space()
    return spaces.Dict(entries)


def make_observation(
    state: np.ndarray,
    images: Mapping[str, np.ndarray] | None = None,
    stamp: float = 0.0,
    image_stamps: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Assemble a contract observation, converting dtypes; the state stamp defaults images'."""
    images = dict(images or {})
    image_stamps = dict(image_stamps or {})
    return {
        "state": np.asarray(state, dtype=np.float32).reshape(-1),
        "images": {k: np.ascontiguousarray(v, dtype=np.uint8) for k, v in images.items()},
        "timestamps": {
            "state": np.float64(stamp),
            **{k: np.float64(image_stamps.get(k, stamp)) for k in images},
        },
    }


class ContractError(ValueError):
    """An observation, action or step result that breaks the env contract."""


def check_action(action: Any) -> np.ndarray:
    """Return ``action`` as a float32 (7,) array or raise :class:`ContractError`.

    NaN/Inf are refused (never silently replaced); values outside [-1, 1] are clipped,
    which is the documented meaning of the normalised action.
    """
    a = np.asarray(action, dtype=np.float32)
    if a.shape != (ACTION_DIM,):
        raise ContractError(f"action must have shape ({ACTION_DIM},), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ContractError(f"action contains NaN/Inf: {a.tolist()}")
    return np.clip(a, -1.0, 1.0)


def validate_observation(obs: Mapping[str, Any], space: spaces.Dict) -> None:
    """Raise :class:`ContractError` naming the first key that breaks the contract."""
    for key in ("state", "images", "timestamps"):
        if key not in obs:
            raise ContractError(f"observation lacks {key!r}")
    state = obs["state"]
    if not isinstance(state, np.ndarray) or state.dtype != np.float32:
        raise ContractError("observation['state'] must be a float32 numpy array")
    if state.shape != space["state"].shape:
        raise ContractError(f"state shape {state.shape} != {space['state'].shape}")
    if not np.all(np.isfinite(state)):
        raise ContractError("observation['state'] contains NaN/Inf")
    for name, sub in space["images"].spaces.items():
        img = obs["images"].get(name)
        if img is None:
            raise ContractError(f"camera {name!r} missing from observation['images']")
        if img.dtype != np.uint8 or img.shape != sub.shape:
            raise ContractError(
                f"camera {name!r}: expected uint8 {sub.shape}, got {img.dtype} {img.shape}"
            )
        if name not in obs["timestamps"]:
            raise ContractError(f"camera {name!r} has no capture timestamp")
    if "state" not in obs["timestamps"]:
        raise ContractError("observation['timestamps'] lacks 'state'")
    if "instruction" in space.spaces:
        text = obs.get("instruction")
        if not isinstance(text, str) or text not in space["instruction"]:
            raise ContractError(
                f"observation['instruction'] must be a string of at most {MAX_INSTRUCTION_CHARS} printable "
                f"characters, got {text!r:.80}"
            )
    for name, t in obs["timestamps"].items():
        if not math.isfinite(float(t)):
            raise ContractError(f"timestamp {name!r} is not finite")


def validate_step(result: Sequence[Any], space: spaces.Dict) -> None:
    """Check a ``step`` 5-tuple against the contract."""
    if len(result) != 5:
        raise ContractError("step must return (obs, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = result
    validate_observation(obs, space)
    if not math.isfinite(float(reward)):
        raise ContractError(f"reward is not finite: {reward}")
    if not isinstance(terminated, (bool, np.bool_)) or not isinstance(truncated, (bool, np.bool_)):
        raise ContractError("terminated and truncated must be bools")
    if "success" not in info:
        raise ContractError("info lacks 'success'")
