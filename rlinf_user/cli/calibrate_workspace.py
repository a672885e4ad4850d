"""``rlinf-user calibrate workspace``: the person drives the arm with the teleop device
(through the edge daemon, under its current limits) to the corners of the space the robot
may use, confirming each with the success control (SpaceMouse button / Enter); the
bounding box of those corners is written as ``<root>/<robot>/workspace.yaml``, which the
edge daemon reads with ``safety.workspace_from=workspace``."""

from __future__ import annotations

import time

import numpy as np

from rlinf_user.calibration.solve import PoorPoseSet
from rlinf_user.cli.calibrate_common import connect_arm, results_table

MIN_EXTENT_M = 0.05


def workspace_box(corners: list[np.ndarray], margin_m: float = 0.0) -> tuple[list[float], list[float]]:
    """The recorded corners' bounding box grown by ``margin_m``; refuses a box thinner
    than 5 cm on any axis (corners recorded at one height, say)."""
    if len(corners) < 2:
        raise PoorPoseSet(f"{len(corners)} corner(s) recorded; a workspace needs at least 2 (opposite corners)")
    pts = np.asarray(corners, float)
    low, high = pts.min(0) - margin_m, pts.max(0) + margin_m
    thin = [f"{'xyz'[i]} {100 * (high[i] - low[i]):.1f} cm" for i in range(3) if high[i] - low[i] < MIN_EXTENT_M]
    if thin:
        raise PoorPoseSet(f"the corners span only {', '.join(thin)} (< {100 * MIN_EXTENT_M:.0f} cm): "
                          "record corners at the box's top and bottom, left and right, near and far")  # fmt: skip
    return [round(float(v), 4) for v in low], [round(float(v), 4) for v in high]


def run_workspace(cfg, robot: str, console) -> int:
    from rlinf_user.calibration import store
    from rlinf_user.robots.teleop.factory import open_teleop

    c = cfg.calibration
    path = store.calibration_path(c.root, robot, c.name or "workspace")
    device = open_teleop(cfg.teleop)
    arm = connect_arm(cfg, None)
    corners: list[np.ndarray] = []
    try:
        arm.home()
        device.start()  # after homing: nothing the person does while the arm homes is applied
        console.print(f"drive the arm to {c.corners} corners of the workspace with the {cfg.teleop.device}; "
                      "confirm each with the success control (Enter / its button), stop to finish early")  # fmt: skip
        period = 1.0 / float(arm.spec.get("control_hz", 10.0))
        while len(corners) < int(c.corners):
            t0 = time.monotonic()
            cmd = device.read()
            a = cmd.action()
            a[6] = -1.0  # the gripper stays open
            tcp = arm._tcp(arm.client.act(a).arrays["state"])
            if "success" in cmd.events:
                corners.append(tcp[:3, 3].copy())
                console.print(f"  corner {len(corners)}: {np.round(tcp[:3, 3], 3).tolist()} m")
            if "stop" in cmd.events:
                break
            time.sleep(max(0.0, period - (time.monotonic() - t0)))
        arm.hold()
    finally:
        device.close()
        arm.close()
    low, high = workspace_box(corners, float(c.margin_m))
    store.save(path, "workspace", {"low": low, "high": high, "corners": [np.round(p, 4).tolist() for p in corners],
                                   "margin_m": float(c.margin_m)})  # fmt: skip
    results_table(console, "workspace", {"low (m)": str(low), "high (m)": str(high), "corners": str(len(corners)),
                                  "saved": str(path), "use it": f"rlinf-user edge --robot {robot} "
                                  f"safety.workspace_from={path}"})  # fmt: skip
    return 0
