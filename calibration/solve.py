"""Calibration maths on top of OpenCV: camera intrinsics from ChArUco views and the
hand-eye transform from paired robot and board poses, each with the residuals that say
whether to trust it, and the checks that refuse a pose set too poor to solve.

Conventions: ``a_T_b`` is the 4x4 pose of frame b in frame a. Cameras use OpenCV's frame
(z forward, x right, y down). ``base`` is the robot base, ``tcp`` the tool centre point
the edge daemon reports, ``board`` the ChArUco board's frame.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from rlinf_user.calibration.board import BoardSpec, Detection, board_poses

log = logging.getLogger(__name__)

MODES = ("eye_in_hand", "eye_to_hand")


class PoorPoseSet(ValueError):
    """The views cannot determine a calibration; the message says what to change."""


def inv(T: np.ndarray) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = T[:3, :3].T
    out[:3, 3] = -T[:3, :3].T @ T[:3, 3]
    return out


def project(points_base: np.ndarray, cam_T_base: np.ndarray, K: np.ndarray, dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixels (N, 2) of base-frame points (N, 3) and whether each lies in front of the camera."""
    import cv2

    pts = np.c_[points_base, np.ones(len(points_base))] @ cam_T_base.T
    front = pts[:, 2] > 1e-3
    px, _ = cv2.projectPoints(pts[:, :3].astype(np.float64), np.zeros(3), np.zeros(3), K, dist)
    return px.reshape(-1, 2), front


def pose(R: np.ndarray, t: np.ndarray) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = np.asarray(R).reshape(3, 3), np.asarray(t).reshape(3)
    return T


def rotation_angle(R: np.ndarray) -> float:
    """The angle (radians) of a rotation matrix."""
    return float(np.arccos(np.clip((np.trace(R[:3, :3]) - 1) / 2, -1.0, 1.0)))


@dataclasses.dataclass
class Intrinsics:
    K: np.ndarray
    dist: np.ndarray
    width: int
    height: int
    rms_px: float | None = None  # reprojection error of the fit (None: from the driver)
    views: int = 0
    source: str = "charuco"

    def to_dict(self) -> dict[str, Any]:
        return {
            "width": self.width, "height": self.height, "fx": float(self.K[0, 0]), "fy": float(self.K[1, 1]),
            "cx": float(self.K[0, 2]), "cy": float(self.K[1, 2]), "dist": [float(v) for v in np.ravel(self.dist)],
            "rms_px": self.rms_px, "views": self.views, "source": self.source,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Intrinsics:
        K = np.array([[d["fx"], 0.0, d["cx"]], [0.0, d["fy"], d["cy"]], [0.0, 0.0, 1.0]])
        return cls(K, np.asarray(d.get("dist") or [0.0] * 5, np.float64), int(d["width"]), int(d["height"]),
                   d.get("rms_px"), int(d.get("views", 0)), d.get("source", "file"))  # fmt: skip


def intrinsics_from_views(board: BoardSpec, detections: list[Detection], min_views: int = 4) -> Intrinsics:
    """Fit K and distortion to ChArUco views (``cv2.calibrateCamera``)."""
    import cv2

    if len(detections) < min_views:
        raise PoorPoseSet(f"{len(detections)} board view(s) with the board found; intrinsics need >= {min_views} "
                          "from different angles and distances")  # fmt: skip
    size = detections[0].image_size
    if any(d.image_size != size for d in detections):
        raise PoorPoseSet("the views differ in image size: calibrate one camera mode at a time")
    obj = [d.object_points(board) for d in detections]
    img = [d.corners.astype(np.float32).reshape(-1, 1, 2) for d in detections]
    rms, K, dist, _, _ = cv2.calibrateCamera(obj, img, size, None, None)
    return Intrinsics(K, dist.reshape(-1), size[0], size[1], float(rms), len(detections))


@dataclasses.dataclass
class HandEyeResult:
    mode: str
    transform: np.ndarray  # eye_in_hand: tcp_T_cam; eye_to_hand: base_T_cam
    method: str
    views: int
    # the board's pose in its fixed frame (base for eye-in-hand, tcp for eye-to-hand) as
    # each view implies it: their spread is the calibration's consistency
    residual_mm: float  # RMS distance of the per-view board positions from their mean
    residual_deg: float  # RMS angle of the per-view board orientations from their mean
    max_residual_mm: float
    board_rms_px: float  # reprojection RMS: per-view board poses (closed form) or the one model (refined)

    def to_dict(self) -> dict[str, Any]:
        key = "tcp_T_camera" if self.mode == "eye_in_hand" else "base_T_camera"
        return {
            "mode": self.mode, key: np.round(self.transform, 9).tolist(), "method": self.method, "views": self.views,
            "residual_mm": round(self.residual_mm, 4), "residual_deg": round(self.residual_deg, 4),
            "max_residual_mm": round(self.max_residual_mm, 4), "board_rms_px": round(self.board_rms_px, 4),
        }  # fmt: skip


def check_pose_set(base_T_tcp: list[np.ndarray], min_views: int = 6, min_rotation_deg: float = 10.0) -> None:
    """Refuse poses that cannot determine a hand-eye transform: too few, rotations too
    small, or all about one axis (the translation along it is then unobservable)."""
    n = len(base_T_tcp)
    if n < min_views:
        raise PoorPoseSet(f"{n} usable view(s); hand-eye needs >= {min_views} poses with the board in view")
    axes, angles = [], []
    for i in range(n):
        for j in range(i + 1, n):
            rel = base_T_tcp[i][:3, :3].T @ base_T_tcp[j][:3, :3]
            a = rotation_angle(rel)
            angles.append(np.degrees(a))
            if a > np.radians(2.0):
                from scipy.spatial.transform import Rotation

                axes.append(Rotation.from_matrix(rel).as_rotvec() / a)
    biggest = max(angles) if angles else 0.0
    if biggest < min_rotation_deg:
        raise PoorPoseSet(f"the poses differ by at most {biggest:.1f} deg of rotation; hand-eye needs "
                          f">= {min_rotation_deg:.0f} deg: tilt the tool between views")  # fmt: skip
    s = np.linalg.svd(np.asarray(axes), compute_uv=False) if len(axes) >= 2 else np.zeros(2)
    if s[1] < 0.25 * s[0]:
        raise PoorPoseSet("all the poses rotate about (nearly) one axis; hand-eye needs rotations about "
                          "two different axes: tilt the tool both ways (e.g. roll and pitch)")  # fmt: skip


def _residuals(fixed: list[np.ndarray]) -> tuple[float, float, float]:
    from scipy.spatial.transform import Rotation

    pos = np.asarray([T[:3, 3] for T in fixed])
    d = np.linalg.norm(pos - pos.mean(0), axis=1)
    rots = Rotation.from_matrix(np.asarray([T[:3, :3] for T in fixed]))
    mean = rots.mean()
    ang = np.degrees((mean.inv() * rots).magnitude())
    return float(np.sqrt(np.mean(d**2)) * 1e3), float(np.sqrt(np.mean(ang**2))), float(d.max() * 1e3)


def hand_eye(mode: str, base_T_tcp: list[np.ndarray], cam_T_board: list[np.ndarray],
             board_rms_px: list[float] | None = None, min_views: int = 6) -> HandEyeResult:  # fmt: skip
    """Solve with each of OpenCV's hand-eye methods and keep the one whose board poses
    agree best across views (the methods fail differently on noisy data)."""
    import cv2

    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: one of {MODES}")
    if len(base_T_tcp) != len(cam_T_board):
        raise ValueError(f"{len(base_T_tcp)} robot poses but {len(cam_T_board)} board poses")
    check_pose_set(base_T_tcp, min_views)
    # eye-to-hand is eye-in-hand with the roles of base and tcp exchanged
    moving = base_T_tcp if mode == "eye_in_hand" else [inv(T) for T in base_T_tcp]
    R_a, t_a = [T[:3, :3] for T in moving], [T[:3, 3] for T in moving]
    R_b, t_b = [T[:3, :3] for T in cam_T_board], [T[:3, 3] for T in cam_T_board]
    methods = {"tsai": cv2.CALIB_HAND_EYE_TSAI, "park": cv2.CALIB_HAND_EYE_PARK, "horaud": cv2.CALIB_HAND_EYE_HORAUD,
               "andreff": cv2.CALIB_HAND_EYE_ANDREFF, "daniilidis": cv2.CALIB_HAND_EYE_DANIILIDIS}  # fmt: skip
    best = None
    for name, flag in methods.items():
        try:
            R, t = cv2.calibrateHandEye(R_a, t_a, R_b, t_b, method=flag)
        except cv2.error as err:
            log.debug("hand-eye method %s failed: %s", name, err)
            continue
        X = pose(R, t)
        R = np.asarray(R)
        if not np.all(np.isfinite(X)) or not np.allclose(R @ R.T, np.eye(3), atol=1e-3) or np.linalg.det(R) < 0:
            log.debug("hand-eye method %s gave no proper rotation; skipped", name)
            continue
        # the board in the frame it is fixed in, per view: base (eye-in-hand) or tcp
        fixed = [A @ X @ B for A, B in zip(moving, cam_T_board, strict=True)]
        res = _residuals(fixed)
        if best is None or res[0] + res[1] < best[1][0] + best[1][1]:
            best = (name, res, X)
    if best is None:
        raise PoorPoseSet("no hand-eye method converged on these views")
    name, (mm, deg, worst), X = best
    px = float(np.mean(board_rms_px)) if board_rms_px else float("nan")
    return HandEyeResult(mode, X, name, len(base_T_tcp), mm, deg, worst, px)


def transform_error(estimate: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(mm, deg) between two poses."""
    d = inv(truth) @ estimate
    return float(np.linalg.norm(d[:3, 3]) * 1e3), float(np.degrees(rotation_angle(d)))


def refine_hand_eye(result: HandEyeResult, base_T_tcp: list[np.ndarray], detections: list[Detection],
                    board: BoardSpec, K: np.ndarray, dist: np.ndarray) -> HandEyeResult:  # fmt: skip
    """Refine a closed-form hand-eye by minimising the corners' reprojection error over all
    views at once (the transform and the board's pose in its fixed frame, 12 parameters;
    Huber loss at 1 px). The closed-form solvers fit per-view board poses, which weighs a
    view's noisy depth like its precise image-plane position; pixels are what was measured."""
    import cv2
    from scipy.optimize import least_squares
    from scipy.spatial.transform import Rotation

    eye_in_hand = result.mode == "eye_in_hand"
    X0 = result.transform
    moving = base_T_tcp if eye_in_hand else [inv(T) for T in base_T_tcp]
    # the board in its fixed frame (base, or tcp for eye-to-hand) from the initial solution
    cams0, _ = board_poses(board, detections, K, dist)
    fixed = [A @ X0 @ B for A, B in zip(moving, cams0, strict=True)]
    Z0 = pose(Rotation.from_matrix(np.asarray([T[:3, :3] for T in fixed])).mean().as_matrix(),
              np.mean([T[:3, 3] for T in fixed], axis=0))  # fmt: skip

    def unpack(x):
        return pose(Rotation.from_rotvec(x[:3]).as_matrix(), x[3:6]), pose(Rotation.from_rotvec(x[6:9]).as_matrix(), x[9:12])

    def cam_T_board(X, Z, k):
        # eye-in-hand: camera = base_T_tcp X; eye-to-hand: camera = X, board = base_T_tcp Z
        return inv(base_T_tcp[k] @ X) @ Z if eye_in_hand else inv(X) @ base_T_tcp[k] @ Z

    def residuals(x):
        X, Z = unpack(x)
        out = []
        for k, det in enumerate(detections):
            T = cam_T_board(X, Z, k)
            px, _ = cv2.projectPoints(det.object_points(board).astype(np.float64), cv2.Rodrigues(T[:3, :3])[0],
                                      T[:3, 3], K, dist)  # fmt: skip
            out.append((px.reshape(-1, 2) - det.corners).ravel())
        return np.concatenate(out)

    x0 = np.concatenate([Rotation.from_matrix(X0[:3, :3]).as_rotvec(), X0[:3, 3],
                         Rotation.from_matrix(Z0[:3, :3]).as_rotvec(), Z0[:3, 3]])  # fmt: skip
    sol = least_squares(residuals, x0, loss="huber", f_scale=1.0, x_scale="jac")
    X, Z = unpack(sol.x)
    r = residuals(sol.x).reshape(-1, 2)
    rms = float(np.sqrt(np.mean(np.sum(r**2, axis=1))))
    fixed = [A @ X @ B for A, B in zip(moving, cams0, strict=True)]
    mm, deg, worst = _residuals(fixed)
    return HandEyeResult(result.mode, X, f"{result.method}+reprojection", result.views, mm, deg, worst, rms)

