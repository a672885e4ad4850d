"""``rlinf-user calibrate`` end to end without hardware: franky-sim's MuJoCo scene holds
ChArUco boards and two cameras at known poses; the edge daemon serves the arm (its safety
filter applies) and renders the cameras; the calibrate command moves the arm through the
real franky client, detects the boards and solves. Its answers are checked against the
scene's truth, and bad input is refused without touching a good result."""


import numpy as np
import pytest
import yaml
from edge_helpers import EdgeProcess, free_ports

from rlinf_user.calibration.solve import transform_error
from rlinf_user.cli.main import main
from rlinf_user.robots.franka.sim_scene import truth

pytestmark = [pytest.mark.wallclock, pytest.mark.timeout(600)]
# Cameras render at 2 frames/s: a view needs one fresh frame after the arm is still, and
# software rendering at 640x480 would otherwise load the CPU that timing tests beside it need.

CAMERAS = ("[{name: wrist, kind: sim, width: 640, height: 480, fps: 2, scene_camera: wrist}, "
           "{name: front, kind: sim, width: 640, height: 480, fps: 2, scene_camera: front}]")  # fmt: skip
HAND_BOARD = "calibration.board={squares_x: 5, squares_y: 4, square_m: 0.03, marker_m: 0.022, dictionary: DICT_4X4_50}"


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    pytest.importorskip("franky_sim")
    tmp = tmp_path_factory.mktemp("calib")
    port = free_ports(3)
    proc = EdgeProcess(["--robot", "franka", "franky_sim=true", "franky_sim_scene=calibration", "robot.ip=127.0.0.71",
                        "control_hz=10", "frame_max_age_s=2", f"cameras={CAMERAS}"], port, tmp / "edge.log")  # fmt: skip
    yield port, tmp
    proc.close()


def calibrate(port, root, *overrides):
    return main(["calibrate", *overrides[:1], "--robot", "franka", "env.edge.host=127.0.0.1", f"env.edge.port={port}",
                 f"calibration.root={root}", *overrides[1:]])  # fmt: skip


def test_hand_eye_both_ways_recovers_the_scene_and_check_draws_it(edge, capsys):
    port, tmp = edge
    root = tmp / "cal"
    assert calibrate(port, root, "hand-eye", "calibration.camera=wrist", "calibration.views=8") == 0
    wrist = yaml.safe_load((root / "franka" / "wrist.yaml").read_text())
    mm, deg = transform_error(np.array(wrist["tcp_T_camera"]), truth()["tcp_T_wrist"])
    assert mm < 2.0 and deg < 0.5, (mm, deg)  # noise-free rendering: within 2 mm / 0.5 deg
    assert wrist["camera_serial"] == "sim:wrist" and wrist["intrinsics"]["source"] == "mujoco" and wrist["date"]
    assert wrist["residual_mm"] < 2.0 and wrist["views"] >= 6

    assert calibrate(port, root, "hand-eye", "calibration.camera=front", "calibration.mode=eye_to_hand",
                     "calibration.views=8", HAND_BOARD) == 0  # fmt: skip
    front = yaml.safe_load((root / "franka" / "front.yaml").read_text())
    mm, deg = transform_error(np.array(front["base_T_camera"]), truth()["base_T_front"])
    assert mm < 2.0 and deg < 0.5, (mm, deg)

    # the check picture: the TCP drawn where the calibration puts it, in view, and the crop
    # box training cuts (env.crops) drawn
    out = tmp / "check.png"
    assert calibrate(port, root, "check", "calibration.camera=wrist", f"calibration.out={out}",
                     "+env.crops={wrist: [100, 40, 440, 400]}") == 0  # fmt: skip
    assert out.stat().st_size > 10_000
    import cv2

    pic = cv2.imread(str(out))[:, :, ::-1]
    assert pic.shape == (480, 640, 3) and (np.abs(pic.astype(int) - [255, 0, 255]).sum(-1) < 30).sum() > 500  # crop box
    err = capsys.readouterr().err
    assert "outside the frame" not in err

    # a crop box outside the frame is refused by name
    assert calibrate(port, root, "check", "calibration.camera=wrist", "calibration.crops={wrist: [600, 0, 100, 100]}") == 2
    assert "lies outside the 640x480 frame" in " ".join(capsys.readouterr().err.split())


def test_reach_goal_is_drawn_through_the_calibration_the_flow_made(edge):
    """A pixel reach's goal (env.kwargs.goal_marker) drawn into the served front frame with
    the calibration the hand-eye test above made lands where the scene's true camera sees it."""
    import cv2

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_env
    from rlinf_user.robots.franka.sim_scene import truth_hand_eye

    port, tmp = edge
    root = tmp / "cal"
    if not (root / "franka" / "front.yaml").exists():
        pytest.skip("needs the front camera's calibration from the hand-eye test")
    cfg = compose_config(["env.edge.host=127.0.0.1", f"env.edge.port={port}", "env.cameras=[front]",
                          f"+env.kwargs.goal_marker={{camera: front, root: {root}}}", "+env.kwargs.goal_in_state=false",
                          "env.kwargs.goal_low=[0.45,-0.1,0.3]", "env.kwargs.goal_high=[0.45,0.1,0.45]"],
                         robot="franka")  # fmt: skip
    env = make_env(cfg.env, seed=3)
    try:
        seen = []
        for _ in range(2):
            obs, _ = env.reset()
            assert obs["state"].shape == (env.edge_spec["state_dim"],)  # the goal is not in the state
            img = obs["images"]["front"]
            red = (img[..., 0] > 200) & (img[..., 1] < 60) & (img[..., 2] < 60)
            assert 30 < red.sum() < 2000, red.sum()
            ys, xs = np.nonzero(red)
            true = truth_hand_eye("front", 640, 480)
            T = np.linalg.inv(np.array(true["base_T_camera"]))
            p = T[:3, :3] @ env.task.goal + T[:3, 3]
            i = true["intrinsics"]
            K = np.array([[i["fx"], 0, i["cx"]], [0, i["fy"], i["cy"]], [0, 0, 1.0]])
            px, _ = cv2.projectPoints(p.reshape(1, 3), np.zeros(3), np.zeros(3), K, np.zeros(5))
            assert np.hypot(xs.mean() - px[0, 0, 0], ys.mean() - px[0, 0, 1]) < 2.0
            seen.append(px.reshape(2))
        assert np.hypot(*(seen[0] - seen[1])) > 3.0  # a new goal each episode, drawn where it now is
    finally:
        env.close()


def test_bad_input_is_refused_and_a_good_file_survives(edge, capsys):
    port, tmp = edge
    root = tmp / "bad"
    good = root / "franka" / "front.yaml"
    good.parent.mkdir(parents=True)
    good.write_text(yaml.safe_dump({"kind": "hand_eye", "camera_serial": "sim:front", "mode": "eye_to_hand"}))
    before = good.read_text()
    # the front camera does not see the table board: no board in view, nothing written
    assert calibrate(port, root, "hand-eye", "calibration.camera=front", "calibration.mode=eye_to_hand",
                     "calibration.views=3", "calibration.min_views=3") == 1  # fmt: skip
    assert "board was found in 0 of 3 views" in " ".join(capsys.readouterr().err.split())
    assert good.read_text() == before and not list(good.parent.glob(".*tmp"))
    # a calibration made for another camera serial
    other = root / "franka" / "wrist.yaml"
    other.write_text(yaml.safe_dump({"kind": "hand_eye", "camera_serial": "123456", "mode": "eye_in_hand"}))
    assert calibrate(port, root, "check", "calibration.camera=wrist") == 1
    assert "made for camera serial 123456" in " ".join(capsys.readouterr().err.split())
    # a camera the daemon does not have, and no camera at all
    assert calibrate(port, root, "hand-eye", "calibration.camera=side") == 2
    assert "no camera 'side'" in capsys.readouterr().err
    assert calibrate(port, root, "hand-eye") == 2
    assert "calibration.camera=" in capsys.readouterr().err


def test_workspace_from_a_teleop_session_feeds_the_edge_safety_box(edge, tmp_path, capsys):
    from test_teleop_record import keys

    from rlinf_user.edge.config import compose_edge_config

    port, _ = edge
    session = keys([
        (0.3, "ENTER", 1), (0.35, "ENTER", 0),  # corner 1: where homing left the arm
        (0.5, "W", 1), (1.5, "W", 0), (1.6, "A", 1), (2.6, "A", 0), (2.7, "Q", 1), (3.7, "Q", 0),
        (4.2, "ENTER", 1), (4.25, "ENTER", 0),  # corner 2: +x, +y, -z of it
        (4.5, "ESC", 1), (4.55, "ESC", 0),
    ])  # fmt: skip
    (tmp_path / "keys.bin").write_bytes(session)
    root = tmp_path / "cal"
    assert calibrate(port, root, "workspace", "teleop=keyboard", f"teleop.replay={tmp_path / 'keys.bin'}",
                     "teleop.controls=null", "calibration.margin_m=0.01") == 0  # fmt: skip
    ws = yaml.safe_load((root / "franka" / "workspace.yaml").read_text())
    lo, hi = np.array(ws["low"]), np.array(ws["high"])
    assert len(ws["corners"]) == 2 and np.all(hi - lo > 0.07), ws  # the moves spanned every axis
    c1, c2 = np.array(ws["corners"])
    assert c2[0] > c1[0] + 0.05 and c2[1] > c1[1] + 0.05 and c2[2] < c1[2] - 0.05
    cfg = compose_edge_config(["robot.ip=172.16.0.2", f"safety.workspace_from={root / 'franka' / 'workspace.yaml'}"], robot="franka")
    assert list(cfg.safety.workspace_low) == ws["low"] and list(cfg.safety.workspace_high) == ws["high"]
    # corners at one height are refused, nothing is written
    flat = keys([(0.3, "ENTER", 1), (0.35, "ENTER", 0), (0.5, "W", 1), (1.5, "W", 0), (1.6, "ENTER", 1),
                 (1.65, "ENTER", 0), (1.9, "ESC", 1), (1.95, "ESC", 0)])  # fmt: skip
    (tmp_path / "flat.bin").write_bytes(flat)
    assert calibrate(port, tmp_path / "cal2", "workspace", "teleop=keyboard", f"teleop.replay={tmp_path / 'flat.bin'}",
                     "teleop.controls=null") == 1  # fmt: skip
    assert "record corners at the box's top and bottom" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "cal2" / "franka" / "workspace.yaml").exists()
