"""Per-camera crop and resize from the run config, the same wherever frames are made.

``env.crops: {camera: [x, y, w, h]}`` cuts a box (pixels of the frame as the env makes it:
a simulator renders at ``env.render_size``, a robot's frames are what its edge serves),
and every camera is then resized to ``env.image_size`` squared. The env is wrapped where it is
built (:func:`rlinf_user.env.registry.make_env`), so training, evaluation, ``teleop``
datasets and HG-DAgger see the same pixels; the pixel work is
:func:`rlinf_user.robots.cameras.base.crop_resize`, which the edge's own camera crop uses.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_user.env.contract import observation_space


def parse_crops(env_cfg: Any) -> dict[str, tuple[int, int, int, int]]:
    """``env.crops`` checked: cameras the env has, four non-negative integers, a box of at
    least 8 x 8 pixels (``ValueError`` naming the key otherwise)."""
    raw = dict(env_cfg.get("crops") or {}) if hasattr(env_cfg, "get") else dict(getattr(env_cfg, "crops", None) or {})
    cameras = list(env_cfg.cameras or [])
    out = {}
    for cam, box in raw.items():
        if cam not in cameras:
            raise ValueError(f"env.crops.{cam}: not one of this env's cameras {cameras}")
        vals = list(box) if box is not None else []
        if len(vals) != 4 or any(int(v) != v or v < 0 for v in vals):
            raise ValueError(f"env.crops.{cam}={vals}: give [x, y, w, h], four non-negative pixel counts")
        x, y, w, h = (int(v) for v in vals)
        if w < 8 or h < 8:
            raise ValueError(f"env.crops.{cam}={vals}: the box is {w}x{h}, under 8x8 pixels")
        out[cam] = (x, y, w, h)
    return out


def render_config(env_cfg: Any) -> Any:
    """The config the backend builds from: its frames rendered at ``env.render_size``."""
    size = env_cfg.get("render_size") if hasattr(env_cfg, "get") else getattr(env_cfg, "render_size", None)
    if not size or int(size) == int(env_cfg.image_size):
        return env_cfg
    inner = copy.deepcopy(env_cfg)
    inner.image_size = int(size)
    return inner


class CropResize(gym.ObservationWrapper):
    """Crops each configured camera, then resizes every camera to ``size`` x ``size``."""

    def __init__(self, env: gym.Env, crops: dict[str, tuple[int, int, int, int]], size: int):
        super().__init__(env)
        self.crops = dict(crops)
        self.size = int(size)
        images = env.observation_space["images"].spaces
        for cam, (x, y, w, h) in self.crops.items():
            height, width = images[cam].shape[:2]
            if x + w > width or y + h > height:
                raise ValueError(
                    f"env.crops.{cam}=[{x}, {y}, {w}, {h}] lies outside the camera's {width}x{height} frame "
                    "(crops are in the pixels the env renders: env.render_size for a simulator)"
                )
        state_dim = env.observation_space["state"].shape[0]
        self.observation_space = observation_space(
            state_dim, {k: (self.size, self.size) for k in images}, "instruction" in env.observation_space.spaces
        )

    def observation(self, obs: dict[str, Any]) -> dict[str, Any]:
        from rlinf_user.robots.cameras.base import crop_resize

        images = obs.get("images") or {}
        out = dict(obs)
        out["images"] = {
            k: np.ascontiguousarray(crop_resize(v, self.crops.get(k), (self.size, self.size))) for k, v in images.items()
        }
        return out

    def __getattr__(self, name: str) -> Any:  # the backend's own attributes (max_episode_steps, ...)
        return getattr(self.env, name)
