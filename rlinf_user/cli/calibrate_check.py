"""``rlinf-user calibrate check``: one live frame of a calibrated camera with what the
calibration says should be there drawn on it: the TCP (its axes, 5 cm), the workspace box
the edge enforces (or a workspace calibration) and the configured crop boxes. If the
drawn TCP sits on the gripper and the box on the table, the calibration is right."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlinf_user.cli.calibrate_common import connect_arm, results_table
from rlinf_user.config.compose import ConfigError

AXIS_M = 0.05
COLOURS = {"x": (255, 0, 0), "y": (0, 255, 0), "z": (0, 0, 255), "box": (255, 200, 0), "crop": (255, 0, 255)}


def box_edges(low, high) -> list[tuple[np.ndarray, np.ndarray]]:
    lo, hi = np.asarray(low, float), np.asarray(high, float)
    corners = {(i, j, k): np.array([(lo, hi)[i][0], (lo, hi)[j][1], (lo, hi)[k][2]])
               for i in (0, 1) for j in (0, 1) for k in (0, 1)}  # fmt: skip
    edges = []
    for (i, j, k), p in corners.items():
        for d in range(3):
            idx = [i, j, k]
            if idx[d] == 0:
                idx[d] = 1
                edges.append((p, corners[tuple(idx)]))
    return edges


def draw(image: np.ndarray, base_T_cam: np.ndarray, K, dist, base_T_tcp, box, crops) -> tuple[np.ndarray, dict]:
    import cv2

    from rlinf_user.calibration.solve import inv, project

    out = np.ascontiguousarray(image.copy())
    cam_T_base = inv(base_T_cam)
    h, w = out.shape[:2]
    report = {}
    if box is not None:
        for a, b in box_edges(*box):
            (pa, pb), front = project(np.stack([a, b]), cam_T_base, K, dist)
            if front.all():
                cv2.line(out, tuple(int(v) for v in pa), tuple(int(v) for v in pb), COLOURS["box"], 2, cv2.LINE_AA)
    origin = base_T_tcp[:3, 3]
    axes = [origin + base_T_tcp[:3, i] * AXIS_M for i in range(3)]
    px, front = project(np.stack([origin, *axes]), cam_T_base, K, dist)
    if front[0]:
        for i, name in enumerate("xyz"):
            if front[i + 1]:
                cv2.line(out, tuple(int(v) for v in px[0]), tuple(int(v) for v in px[i + 1]), COLOURS[name], 2, cv2.LINE_AA)
        cv2.circle(out, tuple(int(v) for v in px[0]), 4, (255, 255, 255), -1, cv2.LINE_AA)
    report["tcp_px"] = [round(float(v), 1) for v in px[0]] if front[0] else None
    report["tcp_in_view"] = bool(front[0] and 0 <= px[0][0] < w and 0 <= px[0][1] < h)
    for x, y, cw, ch in crops:
        if x < 0 or y < 0 or x + cw > w or y + ch > h:
            raise ConfigError(f"crop box {[x, y, cw, ch]} (x, y, w, h) lies outside the {w}x{h} frame")
        cv2.rectangle(out, (int(x), int(y)), (int(x + cw - 1), int(y + ch - 1)), COLOURS["crop"], 2)
    return out, report


def run_check(cfg, robot: str, console) -> int:
    import cv2

    from rlinf_user.calibration import store
    from rlinf_user.calibration.session import wait_for_frames
    from rlinf_user.calibration.solve import Intrinsics

    c = cfg.calibration
    path = store.calibration_path(c.root, robot, c.name or c.camera)
    arm = connect_arm(cfg, c.camera)
    try:
        serial = arm.camera_info().get("serial")
        cal = store.load(path, "hand_eye", camera_serial=serial)
        box = arm.workspace
        if c.workspace:
            ws = store.load(store.resolve(c.workspace, c.root, robot), "workspace")
            box = (ws["low"], ws["high"])
        wait_for_frames(arm)
        view = arm.still_view()
    finally:
        arm.close()
    intr = Intrinsics.from_dict(cal["intrinsics"])
    if view.image.shape[:2] != (intr.height, intr.width):
        raise ConfigError(f"{path} was made at {intr.width}x{intr.height}, but camera {c.camera!r} now serves "
                          f"{view.image.shape[1]}x{view.image.shape[0]}: recalibrate after changing its crop/resize")  # fmt: skip
    T = np.asarray(cal["tcp_T_camera" if cal["mode"] == "eye_in_hand" else "base_T_camera"], float)
    base_T_cam = view.base_T_tcp @ T if cal["mode"] == "eye_in_hand" else T
    # the boxes training cuts (env.crops) unless the check is given others
    boxes = dict(c.crops or {}) or dict(cfg.env.get("crops") or {})
    crops = [list(map(int, v)) for k, v in boxes.items() if k == c.camera]
    picture, report = draw(view.image, base_T_cam, intr.K, intr.dist, view.base_T_tcp, box, crops)
    out = Path(c.out) if c.out else path.parent / f"check-{c.camera}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(out), cv2.cvtColor(picture, cv2.COLOR_RGB2BGR))
    results_table(console, f"check of {c.camera}", {
        "calibration": f"{path} ({cal['mode']}, {cal.get('date')})",
        "TCP drawn at": f"{report['tcp_px']} px" + ("" if report["tcp_in_view"] else " (outside the frame)"),
        "workspace box": "none" if box is None else f"{np.round(box[0], 3).tolist()} .. {np.round(box[1], 3).tolist()}",
        "crop boxes": str(crops or "none"), "picture": str(out),
    })  # fmt: skip
    return 0
