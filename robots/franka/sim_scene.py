"""Scenes for franky-sim beyond the bare arm: a calibration set-up with ChArUco boards and
cameras at known poses, so ``rlinf-user calibrate`` runs end to end without hardware and
its answers can be checked against the truth.

``calibration_scene`` adds (robot base = world frame, metres):

* ``table_board``: a ChArUco board lying on the floor in front of the arm, seen by
* ``wrist``: a camera on the hand (eye-in-hand), looking along the gripper;
* ``hand_board``: a smaller board fixed to the hand's side (visual only: no mass, no
  contacts), seen by
* ``front``: a camera on a stand facing the arm (eye-to-hand).

:func:`truth` gives the transforms a calibration should recover, in OpenCV's camera
convention (z forward, y down; MuJoCo's cameras look along -z with y up).
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from rlinf_user.calibration.board import BoardSpec

TCP_IN_HAND = np.array([0.0, 0.0, 0.1034])  # franky's default EE offset along the hand's z
MJ_TO_CV = np.diag([1.0, -1.0, -1.0])  # a MuJoCo camera frame to OpenCV's


@dataclasses.dataclass(frozen=True)
class CalibrationScene:
    table_board: BoardSpec = BoardSpec(7, 5, 0.04, 0.03, "DICT_4X4_50")
    table_board_center: tuple[float, float, float] = (0.40, 0.0, 0.001)
    hand_board: BoardSpec = BoardSpec(5, 4, 0.03, 0.022, "DICT_4X4_50")
    # the wrist camera in the hand frame: 8 cm behind the axis (the side away from the hand
    # board), looking at a point 45 cm along the hand's z (below the TCP at home)
    wrist_pos: tuple[float, float, float] = (-0.08, 0.0, 0.0)
    wrist_target: tuple[float, float, float] = (0.0, 0.0, 0.45)
    wrist_fovy: float = 60.0
    # the front camera on its stand, looking at a point of the workspace
    front_pos: tuple[float, float, float] = (1.05, 0.15, 0.55)
    front_target: tuple[float, float, float] = (0.45, 0.0, 0.40)
    front_fovy: float = 45.0
    # the hand board: its centre in the hand frame, facing the hand's +x (the front camera
    # at the home pose)
    hand_board_center: tuple[float, float, float] = (0.07, 0.0, 0.06)


def _look_at(pos, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """A MuJoCo camera rotation (columns: x right, y up, z backwards) looking at target."""
    fwd = np.asarray(target, float) - np.asarray(pos, float)
    fwd /= np.linalg.norm(fwd)
    right = np.cross(fwd, np.asarray(up, float))
    right /= np.linalg.norm(right)
    up = np.cross(right, fwd)
    return np.stack([right, up, -fwd], axis=1)


def _rot_x(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _wrist_rotation(scene: CalibrationScene) -> np.ndarray:
    # in the hand frame; image "up" towards the hand's -x (away from the fingers' side)
    return _look_at(scene.wrist_pos, scene.wrist_target, up=(-1.0, 0.0, 0.0))


def _mat_str(R: np.ndarray) -> str:
    # MJCF xyaxes: the frame's x and y axes in the parent frame
    return " ".join(f"{v:.9f}" for v in np.concatenate([R[:, 0], R[:, 1]]))


def _texture(spec: BoardSpec, folder: Path, name: str) -> Path:
    """The board's picture as a PNG, written once per board layout (a shared cache file,
    not a temporary folder per simulator start)."""
    import hashlib
    import os

    import cv2

    key = hashlib.sha1(repr(spec).encode()).hexdigest()[:16]
    path = folder / f"{name}-{key}.png"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        ok, data = cv2.imencode(".png", spec.image(px_per_square=120))
        if not ok:
            raise RuntimeError(f"could not encode the {name} board picture")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data.tobytes())
        os.replace(tmp, path)  # another simulator starting at once writes the same bytes
    return path


def calibration_scene(sim, scene: CalibrationScene = CalibrationScene()) -> None:
    """Add the boards and cameras to a franky_sim ``MujocoSimulator`` before it starts."""
    import os

    # the user's cache (RLINF_USER_CACHE, as the pretrained weights use)
    folder = Path(os.environ.get("RLINF_USER_CACHE", Path.home() / ".cache" / "rlinf-user")).expanduser() / "calibration-scene"
    asset = sim.scene.find("asset")
    for name, spec in (("table_board", scene.table_board), ("hand_board", scene.hand_board)):
        ET.SubElement(asset, "texture", name=name, type="2d", file=str(_texture(spec, folder, name)))
        ET.SubElement(asset, "material", name=name, texture=name, texrepeat="1 1", texuniform="false", rgba="1 1 1 1")
    wx, wy = scene.table_board.size_m
    cx, cy, cz = scene.table_board_center
    # the board's frame (x along squares_x, y along squares_y) at its corner; the plane's
    # texture runs over [-wx/2, wx/2] x [-wy/2, wy/2]
    ET.SubElement(sim.worldbody, "geom", name="table_board", type="plane", material="table_board",
                  size=f"{wx / 2} {wy / 2} 0.01", pos=f"{cx} {cy} {cz}", contype="0", conaffinity="0")  # fmt: skip
    ET.SubElement(sim.worldbody, "camera", name="front", pos=" ".join(map(str, scene.front_pos)),
                  xyaxes=_mat_str(_look_at(scene.front_pos, scene.front_target)), fovy=str(scene.front_fovy))  # fmt: skip
    hand = next(b for b in sim.worldbody.iter("body") if b.get("name", "").endswith("hand"))
    ET.SubElement(hand, "camera", name="wrist", pos=" ".join(map(str, scene.wrist_pos)),
                  xyaxes=_mat_str(_wrist_rotation(scene)), fovy=str(scene.wrist_fovy))  # fmt: skip
    hx, hy = scene.hand_board.size_m
    # a thin box whose +z face carries the board, turned to face the hand's +x
    ET.SubElement(hand, "geom", name="hand_board", type="box", material="hand_board", mass="0",
                  size=f"{hx / 2} {hy / 2} 0.002", pos=" ".join(map(str, scene.hand_board_center)),
                  xyaxes="0 0 -1 0 1 0", contype="0", conaffinity="0")  # fmt: skip


def truth(scene: CalibrationScene = CalibrationScene()) -> dict[str, np.ndarray]:
    """What calibration should find: ``tcp_T_wrist`` (the wrist camera in the TCP frame)
    and ``base_T_front`` (the front camera in the robot base frame), OpenCV convention."""
    tcp_T_wrist = np.eye(4)
    tcp_T_wrist[:3, :3] = _wrist_rotation(scene) @ MJ_TO_CV
    tcp_T_wrist[:3, 3] = np.asarray(scene.wrist_pos) - TCP_IN_HAND
    base_T_front = np.eye(4)
    base_T_front[:3, :3] = _look_at(scene.front_pos, scene.front_target) @ MJ_TO_CV
    base_T_front[:3, 3] = scene.front_pos
    return {"tcp_T_wrist": tcp_T_wrist, "base_T_front": base_T_front}



def truth_hand_eye(camera: str, width: int, height: int, scene: CalibrationScene = CalibrationScene()) -> dict:
    """A hand-eye calibration document (as ``rlinf-user calibrate hand-eye`` writes it) holding
    the scene's true pose and pinhole model of ``camera`` at ``width`` x ``height``: for runs
    that need a calibrated camera but measure something else (the calibration itself is
    measured against :func:`truth` by ``benchmarks/bench_calibration.py``)."""
    fovy = {"front": scene.front_fovy, "wrist": scene.wrist_fovy}.get(camera)
    if fovy is None:
        raise ValueError(f"the calibration scene has cameras front and wrist, not {camera!r}")
    f = float(0.5 * height / np.tan(np.deg2rad(fovy) / 2))  # MuJoCo: square pixels, centred principal point
    intr = {"width": int(width), "height": int(height), "fx": f, "fy": f, "cx": (width - 1) / 2,
            "cy": (height - 1) / 2, "dist": [0.0] * 5, "rms_px": None, "views": 0, "source": "scene truth"}  # fmt: skip
    t = truth(scene)
    if camera == "front":
        return {"mode": "eye_to_hand", "base_T_camera": t["base_T_front"].tolist(), "intrinsics": intr}
    return {"mode": "eye_in_hand", "tcp_T_camera": t["tcp_T_wrist"].tolist(), "intrinsics": intr}
