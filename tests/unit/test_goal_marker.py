"""The reach goal drawn into a calibrated camera's frame (env.kwargs.goal_marker)."""

import numpy as np
import pytest

from rlinf_user.calibration import store
from rlinf_user.env.tasks import make_task

SPEC = {"state_names": ["q0", "tcp_x", "tcp_y", "tcp_z", "tcp_qx", "tcp_qy", "tcp_qz", "tcp_qw"]}
W, H, F = 160, 120, 150.0


def _camera_looking_down(height=1.0):
    """base_T_camera: 1 m above the origin, looking down (OpenCV: z forward, y down)."""
    T = np.eye(4)
    T[:3, :3] = np.diag([1.0, -1.0, -1.0])
    T[:3, 3] = [0.0, 0.0, height]
    return T


def _save(tmp_path, mode="eye_to_hand", T=None, name="top"):
    intr = {"width": W, "height": H, "fx": F, "fy": F, "cx": (W - 1) / 2, "cy": (H - 1) / 2, "dist": [0.0] * 5}
    key = "base_T_camera" if mode == "eye_to_hand" else "tcp_T_camera"
    T = _camera_looking_down() if T is None else T
    return store.save(tmp_path / "franka" / f"{name}.yaml", "hand_eye",
                      {"mode": mode, key: T.tolist(), "intrinsics": intr})  # fmt: skip


def _task(tmp_path, **marker):
    opts = {"camera": "top", "root": str(tmp_path), **marker}
    return make_task("reach", SPEC, {"goal_marker": opts, "goal_in_state": False,
                                     "goal_low": [0.1, -0.1, 0.0], "goal_high": [0.1, -0.1, 0.0]})  # fmt: skip


def _red_centroid(img):
    red = (img[..., 0] > 150) & (img[..., 1] < 80) & (img[..., 2] < 80)
    ys, xs = np.nonzero(red)
    return red.sum(), xs.mean(), ys.mean()


def test_goal_is_drawn_where_the_calibration_projects_it_and_leaves_the_state(tmp_path):
    _save(tmp_path)
    task = _task(tmp_path, radius_m=0.05)
    state = np.zeros(8, np.float32)
    task.reset(np.random.default_rng(0), state)
    assert task.extra_dim == 0 and task.observe(state).shape == (8,)  # the goal is not in the state
    frame = np.zeros((H, W, 3), np.uint8)
    out = task.draw({"top": frame, "wrist": frame}, state)
    assert not frame.any() and not out["wrist"].any()  # the served frames are not written to
    n, u, v = _red_centroid(out["top"])
    # goal (0.1, -0.1, 0) seen from 1 m above: u = cx + F x 0.1, v = cy + F x 0.1 (y down is -y)
    assert u == pytest.approx((W - 1) / 2 + F * 0.1, abs=0.5)
    assert v == pytest.approx((H - 1) / 2 + F * 0.1, abs=0.5)
    assert n == pytest.approx(np.pi * (F * 0.05) ** 2, rel=0.2)  # a 5 cm disc at 1 m: 7.5 px radius


def test_a_smaller_frame_of_the_same_aspect_scales_the_intrinsics(tmp_path):
    _save(tmp_path)
    task = _task(tmp_path)
    task.reset(np.random.default_rng(0), np.zeros(8))
    _, u, v = _red_centroid(task.draw({"top": np.zeros((H // 2, W // 2, 3), np.uint8)}, np.zeros(8))["top"])
    assert u == pytest.approx(((W - 1) / 2 + F * 0.1) / 2, abs=0.75)
    assert v == pytest.approx(((H - 1) / 2 + F * 0.1) / 2, abs=0.75)
    with pytest.raises(ValueError, match="another aspect ratio"):
        task.draw({"top": np.zeros((100, 100, 3), np.uint8)}, np.zeros(8))


def test_eye_in_hand_marker_moves_with_the_tcp(tmp_path):
    _save(tmp_path, mode="eye_in_hand", T=_camera_looking_down(height=0.0))  # the camera at the TCP, looking down
    task = _task(tmp_path)
    task.reset(np.random.default_rng(0), np.zeros(8))
    frames = {"top": np.zeros((H, W, 3), np.uint8)}
    state = np.array([0, 0.1, -0.1, 0.5, 0, 0, 0, 1], np.float32)  # TCP 0.5 m straight above the goal
    _, u, v = _red_centroid(task.draw(frames, state)["top"])
    assert (u, v) == (pytest.approx((W - 1) / 2, abs=0.5), pytest.approx((H - 1) / 2, abs=0.5))
    state[1] = 0.0  # the TCP 10 cm to the goal's -x: the goal appears right of the centre
    _, u2, _ = _red_centroid(task.draw(frames, state)["top"])
    assert u2 == pytest.approx((W - 1) / 2 + F * 0.1 / 0.5, abs=0.5)


def test_bad_marker_configs_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="goal_marker.camera"):
        make_task("reach", SPEC, {"goal_in_state": False})
    with pytest.raises(FileNotFoundError, match="rlinf-user calibrate"):
        _task(tmp_path)
    _save(tmp_path)
    with pytest.raises(ValueError, match="unknown key"):
        _task(tmp_path, size=3)
    with pytest.raises(ValueError, match="colour"):
        _task(tmp_path, colour=[300, 0, 0])
    store.save(tmp_path / "franka" / "ws.yaml", "workspace", {"low": [0, 0, 0], "high": [1, 1, 1]})
    with pytest.raises(store.CalibrationMismatch, match="workspace"):
        _task(tmp_path, calibration="ws")
    task = _task(tmp_path)
    with pytest.raises(ValueError, match="not one of env.cameras"):
        task.draw({"front": np.zeros((H, W, 3), np.uint8)}, np.zeros(8))
