"""A reach goal drawn into a calibrated camera's frame, so a policy can only find it by looking.

The ``reach`` task's goal is a point in the robot base frame. With
``env.kwargs.goal_marker`` the task draws a disc of ``radius_m`` metres at that point
into one camera's frames, projected through the camera's hand-eye calibration
(``rlinf-user calibrate hand-eye``: intrinsics plus ``base_T_camera`` or ``tcp_T_camera``),
and with ``goal_in_state: false`` the goal leaves the state: the policy sees the TCP and the
picture. A disc seen by one camera fixes a ray, not a point, so put the goals on a plane
the camera sees face-on (for a camera in front of the arm: one ``x``, ``goal_low[0] ==
goal_high[0]``) or expect the policy to guess along the ray.

The disc is drawn on the frame the edge serves, before ``env.crops`` and the resize, in
the calibration's pixels (a frame of another size with the same aspect ratio scales the
intrinsics; any other size is refused).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class GoalMarker:
    camera: str
    K: np.ndarray  # 3x3, at (width, height)
    dist: np.ndarray
    width: int
    height: int
    mode: str  # eye_to_hand: T is base_T_camera; eye_in_hand: T is tcp_T_camera
    T: np.ndarray
    radius_m: float = 0.015
    colour: tuple[int, int, int] = (255, 0, 0)
    source: str = ""
    _scaled: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)
    hidden: int = 0  # frames in which the goal fell outside the view

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> GoalMarker:
        """``{camera, calibration, root, robot, radius_m, colour}``; ``calibration`` is a
        ``.yaml`` path or a name under ``<root>/<robot>/`` (default: the camera's name)."""
        from rlinf_user.calibration import store
        from rlinf_user.calibration.solve import Intrinsics

        opts = dict(options)
        unknown = set(opts) - {"camera", "calibration", "root", "robot", "radius_m", "colour"}
        if unknown:
            raise ValueError(f"env.kwargs.goal_marker: unknown key(s) {sorted(unknown)}; it takes camera, "
                             "calibration, root, robot, radius_m, colour")  # fmt: skip
        camera = opts.get("camera")
        if not camera:
            raise ValueError("env.kwargs.goal_marker.camera: the camera whose frames show the goal")
        ref = str(opts.get("calibration") or camera)
        path = store.resolve(ref, opts.get("root") or "calibration", opts.get("robot") or "franka")
        doc = store.load(path, "hand_eye")
        mode = doc.get("mode")
        key = {"eye_to_hand": "base_T_camera", "eye_in_hand": "tcp_T_camera"}.get(mode)
        if key is None or key not in doc or "intrinsics" not in doc:
            raise ValueError(f"{path}: not a hand-eye calibration with intrinsics (mode {mode!r})")
        intr = Intrinsics.from_dict(doc["intrinsics"])
        colour = tuple(int(c) for c in (opts.get("colour") or (255, 0, 0)))
        if len(colour) != 3 or not all(0 <= c <= 255 for c in colour):
            raise ValueError(f"env.kwargs.goal_marker.colour={list(colour)}: three values 0-255 (RGB)")
        radius = float(opts.get("radius_m", 0.015))
        if not radius > 0:
            raise ValueError(f"env.kwargs.goal_marker.radius_m={radius}: a positive size in metres")
        return cls(str(camera), intr.K, intr.dist, intr.width, intr.height, mode,
                   np.asarray(doc[key], dtype=np.float64), radius, colour, str(path))  # fmt: skip

    def _intrinsics(self, width: int, height: int) -> np.ndarray:
        if (width, height) == (self.width, self.height):
            return self.K
        K = self._scaled.get((width, height))
        if K is None:
            s = width / self.width
            if abs(height - self.height * s) > 1.0:
                raise ValueError(
                    f"camera {self.camera!r} serves {width}x{height} frames, but {self.source} was made at "
                    f"{self.width}x{self.height} (another aspect ratio): recalibrate at the served size"
                )
            K = self.K.copy()
            K[:2, :] *= s
            self._scaled[(width, height)] = K
        return K

    def camera_pose(self, base_T_tcp: np.ndarray | None) -> np.ndarray:
        """``base_T_camera`` for this frame (an eye-in-hand camera moves with the TCP)."""
        if self.mode == "eye_to_hand":
            return self.T
        if base_T_tcp is None:
            raise ValueError("an eye-in-hand goal marker needs the TCP pose in the state")
        return base_T_tcp @ self.T

    def pixel(self, goal: Sequence[float], image_shape: tuple[int, ...], base_T_tcp=None) -> tuple[np.ndarray, float] | None:
        """The goal's pixel and its disc's radius in pixels, or None behind the camera."""
        from rlinf_user.calibration.solve import inv, project

        h, w = image_shape[:2]
        K = self._intrinsics(w, h)
        cam_T_base = inv(self.camera_pose(base_T_tcp))
        px, front = project(np.asarray(goal, np.float64).reshape(1, 3), cam_T_base, K, self.dist)
        if not front[0]:
            return None
        depth = float(cam_T_base[2, :3] @ np.asarray(goal, np.float64) + cam_T_base[2, 3])
        return px[0], float(K[0, 0] * self.radius_m / depth)

    def draw(self, image: np.ndarray, goal: Sequence[float], base_T_tcp=None) -> np.ndarray:
        """A copy of ``image`` (H, W, 3 uint8 RGB) with the goal's disc on it."""
        import cv2

        out = np.ascontiguousarray(np.array(image, copy=True))
        hit = self.pixel(goal, out.shape, base_T_tcp)
        h, w = out.shape[:2]
        if hit is None or not (0 <= hit[0][0] < w and 0 <= hit[0][1] < h):
            self.hidden += 1
            if self.hidden == 1:
                log.warning("the reach goal %s lies outside camera %r's view: the policy cannot see it "
                            "(move the goal box into the view)", np.round(goal, 3).tolist(), self.camera)  # fmt: skip
            if hit is None:
                return out
        (u, v), r = hit
        shift = 4  # sub-pixel centre and radius (1/16 px)
        centre = (int(round(u * 2**shift)), int(round(v * 2**shift)))
        cv2.circle(out, centre, max(int(round(r * 2**shift)), 2**shift), self.colour, -1, cv2.LINE_AA, shift)
        return out
