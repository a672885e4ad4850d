"""Hand-eye and intrinsics maths against synthetic views with a known answer: board
corners projected through a known camera from known robot poses, with and without noise."""

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from rlinf_user.calibration.board import BoardSpec, Detection, board_pose, detect
from rlinf_user.calibration.solve import (
    PoorPoseSet,
    hand_eye,
    intrinsics_from_views,
    inv,
    pose,
    transform_error,
)

BOARD = BoardSpec(7, 5, 0.04, 0.03)
K = np.array([[415.7, 0, 320.0], [0, 415.7, 240.0], [0, 0, 1.0]])
TCP_T_CAM = pose(Rotation.from_euler("xyz", [3, -20, 88], degrees=True).as_matrix(), [-0.08, 0.01, -0.1])
BASE_T_BOARD = pose(Rotation.from_euler("z", 180, degrees=True).as_matrix(), [0.54, 0.10, 0.0])


def robot_poses(n, seed=0, axes="xyz"):
    rng = np.random.default_rng(seed)
    home = pose(Rotation.from_euler("x", 180, degrees=True).as_matrix(), [0.40, 0.0, 0.45])
    out = []
    for _ in range(n):
        rv = np.zeros(3)
        for i, a in enumerate("xyz"):
            if a in axes:
                rv[i] = rng.uniform(-0.35, 0.35)
        d = pose(Rotation.from_rotvec(rv).as_matrix(), rng.uniform([-0.06, -0.08, -0.05], [0.06, 0.08, 0.05]))
        out.append(pose(d[:3, :3] @ home[:3, :3], home[:3, 3] + d[:3, 3]))
    return out


def project(cam_T_board, noise_px=0.0, rng=None):
    import cv2

    pts = BOARD.corner_points()
    rvec = cv2.Rodrigues(cam_T_board[:3, :3])[0]
    img, _ = cv2.projectPoints(pts, rvec, cam_T_board[:3, 3], K, np.zeros(5))
    img = img.reshape(-1, 2)
    if noise_px:
        img = img + rng.normal(0, noise_px, img.shape)
    return Detection(img, np.arange(len(pts)), (640, 480))


def views(poses, noise_px=0.0, seed=1):
    rng = np.random.default_rng(seed)
    cams, px = [], []
    for base_T_tcp in poses:
        cam_T_board = inv(base_T_tcp @ TCP_T_CAM) @ BASE_T_BOARD
        T, rms = board_pose(BOARD, project(cam_T_board, noise_px, rng), K, np.zeros(5))
        cams.append(T)
        px.append(rms)
    return cams, px


def test_eye_in_hand_is_recovered_exactly_without_noise():
    poses = robot_poses(12)
    cams, px = views(poses)
    res = hand_eye("eye_in_hand", poses, cams, px)
    mm, deg = transform_error(res.transform, TCP_T_CAM)
    assert mm < 0.1 and deg < 0.01 and res.residual_mm < 0.1 and res.views == 12


def test_eye_to_hand_is_recovered_with_pixel_noise_and_residuals_grow_with_it():
    # a fixed camera, the board on the tool
    base_T_cam = pose(Rotation.from_euler("xyz", [-110, 0, 95], degrees=True).as_matrix(), [1.0, 0.1, 0.5])
    tcp_T_board = pose(Rotation.from_euler("y", 90, degrees=True).as_matrix(), [0.07, -0.07, 0.06])
    poses = robot_poses(15, seed=3)
    errs = []
    for noise in (0.0, 0.5, 2.0):
        rng = np.random.default_rng(7)
        cams, px = [], []
        for base_T_tcp in poses:
            T, rms = board_pose(BOARD, project(inv(base_T_cam) @ base_T_tcp @ tcp_T_board, noise, rng), K, np.zeros(5))
            cams.append(T)
            px.append(rms)
        res = hand_eye("eye_to_hand", poses, cams, px)
        errs.append((transform_error(res.transform, base_T_cam), res.residual_mm))
    (mm0, deg0), res0 = errs[0]
    assert mm0 < 0.1 and deg0 < 0.01
    (mm1, deg1), _ = errs[1]
    assert mm1 < 10.0 and deg1 < 1.0  # half a pixel of noise at a metre: millimetres
    assert errs[2][1] > errs[1][1] > res0  # the residual reports the noise


def test_poor_pose_sets_are_refused_with_the_reason():
    poses = robot_poses(12, axes="z")  # rotations about one axis only
    cams, _ = views(poses)
    with pytest.raises(PoorPoseSet, match="one axis"):
        hand_eye("eye_in_hand", poses, cams)
    few = robot_poses(3)
    with pytest.raises(PoorPoseSet, match="needs >= 6"):
        hand_eye("eye_in_hand", few, views(few)[0])
    flat = robot_poses(8, axes="")
    with pytest.raises(PoorPoseSet, match="tilt the tool"):
        hand_eye("eye_in_hand", flat, views(flat)[0])


def test_intrinsics_from_charuco_views():
    poses = robot_poses(10, seed=5)
    rng = np.random.default_rng(0)
    dets = [project(inv(p @ TCP_T_CAM) @ BASE_T_BOARD, 0.2, rng) for p in poses]
    got = intrinsics_from_views(BOARD, dets)
    assert abs(got.K[0, 0] - K[0, 0]) / K[0, 0] < 0.02 and got.rms_px < 0.5 and got.views == 10
    with pytest.raises(PoorPoseSet, match=">= 4"):
        intrinsics_from_views(BOARD, dets[:2])


def test_board_detection_on_its_own_image_and_a_blank_frame():
    from rlinf_user.calibration.board import BoardNotFound

    img = BOARD.image(px_per_square=60, margin_px=30)
    det = detect(BOARD, img)
    assert len(det) == (BOARD.squares_x - 1) * (BOARD.squares_y - 1)
    with pytest.raises(BoardNotFound, match="not in view"):
        detect(BOARD, np.full((480, 640, 3), 128, np.uint8))
    with pytest.raises(ValueError, match="unknown ArUco dictionary"):
        BoardSpec(dictionary="DICT_9X9_1")


def test_reprojection_refinement_beats_the_closed_form_under_pixel_noise():
    from rlinf_user.calibration.solve import refine_hand_eye

    poses = robot_poses(12, seed=11)
    rng = np.random.default_rng(3)
    dets = [project(inv(p @ TCP_T_CAM) @ BASE_T_BOARD, 0.5, rng) for p in poses]
    cams, px = zip(*[board_pose(BOARD, d, K, np.zeros(5)) for d in dets], strict=True)
    closed = hand_eye("eye_in_hand", poses, list(cams), list(px))
    refined = refine_hand_eye(closed, poses, dets, BOARD, K, np.zeros(5))
    e_closed, e_refined = transform_error(closed.transform, TCP_T_CAM), transform_error(refined.transform, TCP_T_CAM)
    assert e_refined[0] < e_closed[0] and e_refined[0] < 2.0 and e_refined[1] < 0.3, (e_closed, e_refined)
    assert refined.method.endswith("+reprojection") and 0.3 < refined.board_rms_px < 1.0  # ~ the injected 0.5 px
