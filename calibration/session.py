"""The robot side of calibration, through the edge daemon: move the arm through a set of
poses (every step passes the daemon's safety filter: workspace box, step limits, tilt),
wait until it is still, and take a camera frame and the measured TCP pose together.

Only the measured pose matters: where the safety filter stops a motion short, the view is
taken where the arm is. Views in which the board is not found are skipped and counted.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from rlinf_user.calibration.board import BoardNotFound, BoardSpec, board_pose, detect
from rlinf_user.calibration.solve import PoorPoseSet, pose

log = logging.getLogger(__name__)

TCP_NAMES = ("tcp_x", "tcp_y", "tcp_z", "tcp_qx", "tcp_qy", "tcp_qz", "tcp_qw")


@dataclasses.dataclass
class View:
    base_T_tcp: np.ndarray
    image: np.ndarray
    stamp: float


class EdgeArm:
    """An arm and its cameras behind an edge daemon (an :class:`EdgeClient` it owns)."""

    def __init__(self, client, camera: str | None = None, hello_timeout_s: float = 10.0):
        self.client = client
        spec = client.hello(timeout_s=hello_timeout_s)
        names = list(spec.get("state_names") or [])
        if not all(n in names for n in TCP_NAMES):
            raise ValueError(f"the edge daemon serves {spec.get('description')!r} without a TCP pose in its state "
                             "(calibration needs a robot arm: rlinf-user edge --robot ...)")  # fmt: skip
        self.tcp_index = [names.index(n) for n in TCP_NAMES]
        cams = dict(spec.get("cameras") or {})
        if camera is not None and camera not in cams:
            raise ValueError(f"the edge daemon has no camera {camera!r}; it serves {sorted(cams) or 'none'} "
                             "(add it to the edge's cameras=[...])")  # fmt: skip
        self.camera = camera
        self.spec = spec
        act = spec.get("action") or {}
        self.max_translation = float(act.get("max_translation", 0.02))
        self.max_rotation = float(act.get("max_rotation", 0.1))
        self.workspace = spec.get("workspace")

    # -- reading ---------------------------------------------------------------------
    def _tcp(self, state: np.ndarray) -> np.ndarray:
        s = np.asarray(state, np.float64)[self.tcp_index]
        return pose(Rotation.from_quat(s[3:7]).as_matrix(), s[:3])

    def _image(self, msg) -> tuple[np.ndarray | None, float]:
        name = self.camera
        if name is None:
            return None, -np.inf
        stamp = float((msg.body.get("image_stamps") or {}).get(name, -np.inf))
        if f"image/{name}" in msg.arrays:
            return np.array(msg.arrays[f"image/{name}"]), stamp
        if f"jpeg/{name}" in msg.arrays:
            from PIL import Image

            return np.asarray(Image.open(io.BytesIO(msg.arrays[f"jpeg/{name}"].tobytes())).convert("RGB")), stamp
        return None, stamp

    def camera_info(self) -> dict[str, Any]:
        return dict((self.client.telemetry().get("camera_info") or {}).get(self.camera) or {})

    # -- moving ----------------------------------------------------------------------
    def home(self) -> np.ndarray:
        return self._tcp(self.client.reset(home=True).arrays["state"])

    def hold(self) -> tuple[np.ndarray, Any]:
        msg = self.client.act(np.zeros(7, np.float32))
        return self._tcp(msg.arrays["state"]), msg

    def move_to(self, target: np.ndarray, tol_mm: float = 3.0, tol_deg: float = 1.0, max_steps: int = 150,
                gain: float = 0.6, gripper: float = -1.0) -> np.ndarray:  # fmt: skip
        """Servo towards ``target`` (base_T_tcp) with normalised deltas; returns where the
        arm ended (within tolerance, or stopped short by the safety filter)."""
        current, _ = self.hold()
        best, stalled = np.inf, 0
        for _ in range(max_steps):
            dp = target[:3, 3] - current[:3, 3]
            dr = Rotation.from_matrix(target[:3, :3] @ current[:3, :3].T).as_rotvec()
            err = np.linalg.norm(dp) * 1e3 + np.degrees(np.linalg.norm(dr))
            if np.linalg.norm(dp) * 1e3 < tol_mm and np.degrees(np.linalg.norm(dr)) < tol_deg:
                break
            stalled = stalled + 1 if err > best - 0.2 else 0
            best = min(best, err)
            if stalled > 15:
                log.info("the arm stopped %.1f mm / %.1f deg short of a calibration pose (safety limits?): "
                         "using where it is", np.linalg.norm(dp) * 1e3, np.degrees(np.linalg.norm(dr)))  # fmt: skip
                break
            a = np.zeros(7, np.float32)
            a[:3] = np.clip(gain * dp / self.max_translation, -1, 1)
            a[3:6] = np.clip(gain * dr / max(self.max_rotation, 1e-9), -1, 1)
            a[6] = gripper
            current = self._tcp(self.client.act(a).arrays["state"])
        return current

    def still_view(self, settle_mm: float = 0.2, settle_deg: float = 0.05, max_steps: int = 60) -> View:
        """Hold until the TCP is still, then the first camera frame taken after that."""
        prev, _ = self.hold()
        still_at = None
        for _ in range(max_steps):
            cur, msg = self.hold()
            moved = np.linalg.norm(cur[:3, 3] - prev[:3, 3]) * 1e3
            turned = np.degrees(Rotation.from_matrix(cur[:3, :3] @ prev[:3, :3].T).magnitude())
            prev = cur
            if still_at is None and moved < settle_mm and turned < settle_deg:
                still_at = float(msg.body["stamp"])
            if still_at is not None:
                image, stamp = self._image(msg)
                if image is not None and stamp >= still_at:
                    return View(cur, image, stamp)
        raise TimeoutError(f"the arm did not come to rest (or camera {self.camera!r} sent no fresh frame) "
                           f"within {max_steps} control periods")  # fmt: skip

    def close(self) -> None:
        self.client.close()


def pose_set(center: np.ndarray, n: int, tilt_rad: float = 0.25, spin_rad: float = 0.4,
             pivot_m: float = 0.0, shift_m: float = 0.03) -> list[np.ndarray]:  # fmt: skip
    """``n`` TCP poses around ``center`` that rotate about two axes and more, each turned
    about a pivot ``pivot_m`` along the tool axis (a wrist camera keeps a board below in
    view) and shifted a little. Deterministic."""
    a, b = tilt_rad, spin_rad
    rotations = [(0, 0, 0), (a, 0, 0), (-a, 0, 0), (0, a, 0), (0, -a, 0), (0, 0, b), (0, 0, -b),
                 (a, a, b / 2), (-a, a, -b / 2), (a, -a, -b / 2), (-a, -a, b / 2), (a / 2, 0, -b),
                 (0, a / 2, b), (-a / 2, -a / 2, 0), (a / 2, -a / 2, b / 2), (-a / 2, a / 2, -b / 2)]  # fmt: skip
    shifts = [(0, 0, 0), (1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1), (1, 1, 0)]
    out = []
    pivot = center[:3, 3] + center[:3, :3] @ np.array([0.0, 0.0, pivot_m])
    for k in range(n):
        R = center[:3, :3] @ Rotation.from_rotvec(rotations[k % len(rotations)]).as_matrix()
        p = pivot - R @ np.array([0.0, 0.0, pivot_m]) + shift_m * np.asarray(shifts[(k * 3) % len(shifts)], float)
        out.append(pose(R, p))
    return out


def collect(arm: EdgeArm, board: BoardSpec, targets: list[np.ndarray], K: np.ndarray | None, dist: np.ndarray | None,
            on_view: Callable[[int, str], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Visit ``targets``; per view the TCP pose, the board detection and (given K) the
    board's pose in the camera. Views without the board are counted, not kept."""
    views, detections, missed = [], [], []
    for k, target in enumerate(targets):
        arm.move_to(target)
        view = arm.still_view()
        try:
            det = detect(board, view.image)
        except BoardNotFound as err:
            missed.append(k)
            if on_view:
                on_view(k, f"board not found ({err})")
            continue
        entry = {"base_T_tcp": view.base_T_tcp, "detection": det, "image": view.image}
        if K is not None:
            entry["cam_T_board"], entry["rms_px"] = board_pose(board, det, K, dist if dist is not None else np.zeros(5))
        views.append(entry)
        detections.append(det)
        if on_view:
            on_view(k, f"{len(det)} corners")
    return {"views": views, "detections": detections, "missed": missed}


def require_views(found: int, asked: int, minimum: int) -> None:
    if found < minimum:
        raise PoorPoseSet(f"the board was found in {found} of {asked} views; {minimum} are needed: put the board "
                          "where the camera sees it from every pose (eye-in-hand: below the wrist camera; "
                          "eye-to-hand: facing the fixed camera), or set calibration.pivot_m / tilt_deg")  # fmt: skip


def wait_for_frames(arm: EdgeArm, timeout_s: float = 10.0) -> None:
    """Block until the camera has served a frame (a renderer or sensor starting up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, msg = arm.hold()
        if arm._image(msg)[0] is not None:
            return
    raise TimeoutError(f"camera {arm.camera!r} served no frame within {timeout_s} s")
