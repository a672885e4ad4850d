"""``rlinf-user calibrate intrinsics|hand-eye|workspace|check --robot NAME``: camera and
robot calibration through the edge daemon (the arm moves under its safety limits).

Results are written to ``<calibration.root>/<robot>/<name>.yaml`` (see
:mod:`rlinf_user.calibration.store`); a result that fails its checks is reported and not
written, so a good earlier file stays in place.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_user.cli.calibrate_common import connect_arm, results_table
from rlinf_user.config.compose import ConfigError, compose_config

log = logging.getLogger(__name__)

ACTIONS = ("intrinsics", "hand-eye", "workspace", "check")


def _targets(c, home: np.ndarray) -> list[np.ndarray]:
    from rlinf_user.calibration.session import pose_set

    center = home.copy()
    center[:3, 3] += np.asarray(c.center_offset, float)
    pivot = c.pivot_m if c.mode == "eye_in_hand" else 0.0  # eye-to-hand: turn the board in place
    return pose_set(center, int(c.views), np.radians(c.tilt_deg), np.radians(c.spin_deg), pivot, c.shift_m)


def _intrinsics(c, info: dict[str, Any], board, detections):
    from rlinf_user.calibration.solve import Intrinsics, intrinsics_from_views

    given = info.get("intrinsics")
    if c.intrinsics == "driver" and given:
        return Intrinsics.from_dict({**given, "source": given.get("source", "driver")})
    if c.intrinsics not in ("driver", "charuco"):
        raise ConfigError(f"calibration.intrinsics={c.intrinsics!r}: driver or charuco")
    return intrinsics_from_views(board, detections)


def run_calibrate(args, console) -> int:
    args.action, args.overrides = args.overrides[0], args.overrides[1:]
    if args.action not in ACTIONS:
        raise ConfigError(f"calibrate {args.action!r}: one of {', '.join(ACTIONS)}")
    if not args.robot:
        raise ConfigError("calibrate needs --robot NAME (the arm behind the edge daemon, e.g. --robot franka)")
    cfg = compose_config(args.overrides, robot=args.robot)
    c = cfg.calibration
    if c.mode not in ("eye_in_hand", "eye_to_hand"):
        raise ConfigError(f"calibration.mode={c.mode!r}: eye_in_hand or eye_to_hand")
    if args.action != "workspace" and not c.camera:
        raise ConfigError(f"calibrate {args.action} needs calibration.camera=<the edge daemon's camera name>")
    if args.action == "workspace":
        from rlinf_user.cli.calibrate_workspace import run_workspace

        return run_workspace(cfg, args.robot, console)
    if args.action == "check":
        from rlinf_user.cli.calibrate_check import run_check

        return run_check(cfg, args.robot, console)
    return _run_views(cfg, args.robot, args.action, console)


def _run_views(cfg, robot: str, action: str, console) -> int:
    from rlinf_user.calibration import store
    from rlinf_user.calibration.board import BoardSpec, board_poses
    from rlinf_user.calibration.session import collect, require_views, wait_for_frames
    from rlinf_user.calibration.solve import hand_eye, refine_hand_eye

    c = cfg.calibration
    try:
        board = BoardSpec.from_dict(dict(c.board))
    except ValueError as err:
        raise ConfigError(f"calibration.board: {err}") from None
    name = c.name or (c.camera if action == "hand-eye" else f"{c.camera}_intrinsics")
    path = store.calibration_path(c.root, robot, name)
    arm = connect_arm(cfg, c.camera)
    try:
        console.print(f"homing the arm, then {c.views} poses for [bold]{c.camera}[/] ({c.mode})")
        home = arm.home()
        wait_for_frames(arm)
        info = arm.camera_info()
        targets = _targets(c, home)
        got = collect(arm, board, targets, None, None, on_view=lambda k, s: console.print(f"  pose {k + 1:>2}/{len(targets)}: {s}"))
        arm.home()
    finally:
        arm.close()
    views = got["views"]
    require_views(len(views), len(targets), int(c.min_views) if action == "hand-eye" else 4)
    if action == "intrinsics":
        from rlinf_user.calibration.solve import intrinsics_from_views

        intr = intrinsics_from_views(board, got["detections"])
        data = {"camera": c.camera, "intrinsics": intr.to_dict(), "driver_intrinsics": info.get("intrinsics"),
                "board": board.to_dict()}  # fmt: skip
        ok = intr.rms_px is not None and intr.rms_px < 1.0
        results_table(console, f"intrinsics of {c.camera}", {
            "views with the board": f"{len(views)} of {len(targets)}", "fx, fy": f"{intr.K[0, 0]:.1f}, {intr.K[1, 1]:.1f}",
            "cx, cy": f"{intr.K[0, 2]:.1f}, {intr.K[1, 2]:.1f}", "reprojection RMS": f"{intr.rms_px:.3f} px",
        })  # fmt: skip
        return _write(console, ok, path, "intrinsics", data, info.get("serial"), "reprojection RMS >= 1 px")
    intr = _intrinsics(c, info, board, got["detections"])
    cam_T_board, rms = board_poses(board, [v["detection"] for v in views], intr.K, intr.dist)
    poses, dets = [v["base_T_tcp"] for v in views], [v["detection"] for v in views]
    result = refine_hand_eye(hand_eye(c.mode, poses, cam_T_board, rms, int(c.min_views)), poses, dets, board, intr.K, intr.dist)
    data = {"camera": c.camera, **result.to_dict(), "intrinsics": intr.to_dict(), "board": board.to_dict(),
            "views_missed": len(got["missed"])}  # fmt: skip
    T = result.transform
    results_table(console, f"hand-eye ({c.mode}) of {c.camera}", {
        "views with the board": f"{len(views)} of {len(targets)}",
        "camera position" + (" in the TCP frame" if c.mode == "eye_in_hand" else " in the base frame"):
            " ".join(f"{v * 1e3:+.1f}" for v in T[:3, 3]) + " mm",
        "solver": result.method, "intrinsics": intr.source,
        "board consistency across views": f"{result.residual_mm:.2f} mm RMS (max {result.max_residual_mm:.2f}), "
                                          f"{result.residual_deg:.3f} deg RMS",
        "reprojection (all views, one model)": f"{result.board_rms_px:.3f} px",
    })  # fmt: skip
    ok = result.residual_mm <= c.max_residual_mm and result.residual_deg <= c.max_residual_deg
    why = f"residual above calibration.max_residual_mm={c.max_residual_mm} / max_residual_deg={c.max_residual_deg}"
    code = _write(console, ok, path, "hand_eye", data, info.get("serial"), why)
    if code == 0:  # the raw views beside it: re-solve, audit or study noise without the robot
        save_views(path.with_name(f"{path.stem}-views.npz"), views, intr)
    return code


def save_views(path: Path, views: list[dict], intr) -> None:
    import os

    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez_compressed(
        tmp, base_T_tcp=np.stack([v["base_T_tcp"] for v in views]), K=intr.K, dist=np.asarray(intr.dist),
        corners=np.concatenate([v["detection"].corners for v in views]),
        ids=np.concatenate([v["detection"].ids for v in views]),
        view=np.concatenate([np.full(len(v["detection"].ids), k) for k, v in enumerate(views)]),
        image_size=np.array(views[0]["detection"].image_size),
    )  # fmt: skip
    os.replace(tmp, path)


def _write(console, ok: bool, path: Path, kind: str, data: dict, serial, why: str) -> int:
    from rlinf_user.calibration import store

    if not ok:
        console.print(f"[bold red]not saved:[/] {why}; {path} is unchanged")
        return 1
    store.save(path, kind, data, camera_serial=serial)
    console.print(f"saved [bold]{path}[/]")
    return 0
