"""A hand-eye calibration's raw views as ``rlinf-user calibrate hand-eye`` saves them
(``<name>-views.npz`` beside the result): TCP poses, detected board corners per view and
the intrinsics used. Re-solving from them needs no robot: audits, other solvers, and the
study of how the result degrades with pixel noise (``benchmarks/bench_calibration.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlinf_user.calibration.board import BoardSpec, Detection, board_poses
from rlinf_user.calibration.solve import HandEyeResult, hand_eye, refine_hand_eye


def load_views(path: str | Path) -> tuple[list[np.ndarray], list[Detection], np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        poses = list(z["base_T_tcp"])
        size = tuple(int(v) for v in z["image_size"])
        dets = [Detection(z["corners"][z["view"] == k], z["ids"][z["view"] == k], size) for k in range(len(poses))]
        return poses, dets, z["K"], z["dist"]


def resolve_with_noise(board: BoardSpec, mode: str, poses, dets: list[Detection], K, dist, noise_px: float,
                       rng: np.random.Generator, min_views: int = 6, refine: bool = True) -> HandEyeResult:  # fmt: skip
    """Hand-eye from the saved views with Gaussian noise of ``noise_px`` added to every
    detected corner (both image axes), refined on reprojection error unless ``refine=False``."""
    noisy = [Detection(d.corners + rng.normal(0.0, noise_px, d.corners.shape), d.ids, d.image_size) for d in dets]
    cams, rms = board_poses(board, noisy, K, dist)
    result = hand_eye(mode, poses, cams, rms, min_views)
    return refine_hand_eye(result, poses, noisy, board, K, dist) if refine else result
