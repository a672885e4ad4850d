"""Hand-eye calibration accuracy on franky-sim's calibration scene, and how it degrades
with pixel noise.

Starts ``rlinf-user edge --robot franka franky_sim=true franky_sim_scene=calibration`` with
the wrist and front cameras, runs ``rlinf-user calibrate hand-eye`` eye-in-hand (wrist
camera, table board) and eye-to-hand (front camera, hand board) through it, compares each
result with the scene's truth, then re-solves from the saved views with Gaussian noise of
0.25-2 px added to every detected corner (``--draws`` draws per level). Also writes the
``calibrate check`` pictures of both cameras.

    python benchmarks/bench_calibration.py [--views 12] [--draws 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
CAMERAS = ("[{name: wrist, kind: sim, width: 640, height: 480, fps: 5, scene_camera: wrist}, "
           "{name: front, kind: sim, width: 640, height: 480, fps: 5, scene_camera: front}]")  # fmt: skip
HAND_BOARD = {"squares_x": 5, "squares_y": 4, "square_m": 0.03, "marker_m": 0.022, "dictionary": "DICT_4X4_50"}
TABLE_BOARD = {"squares_x": 7, "squares_y": 5, "square_m": 0.04, "marker_m": 0.03, "dictionary": "DICT_4X4_50"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "rlinf_user.cli.main", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{r.stderr[-3000:]}")


def main() -> None:
    from rlinf_user.calibration.board import BoardSpec
    from rlinf_user.calibration.solve import transform_error
    from rlinf_user.calibration.views import load_views, resolve_with_noise
    from rlinf_user.robots.franka.sim_scene import truth

    ap = argparse.ArgumentParser()
    ap.add_argument("--views", type=int, default=12)
    ap.add_argument("--draws", type=int, default=30)
    ap.add_argument("--tilt-deg", type=float, default=None, help="calibration.tilt_deg (default: the config's)")
    ap.add_argument("--spin-deg", type=float, default=None)
    ap.add_argument("--out", default="calibration.json")
    ap.add_argument("--noise", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-calib-"))
    port = free_port()
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    edge = subprocess.Popen(
        [sys.executable, "-m", "rlinf_user.cli.main", "edge", "--robot", "franka", "franky_sim=true",
         "franky_sim_scene=calibration", "robot.ip=127.0.0.81", "control_hz=10", "frame_max_age_s=2",
         f"cameras={CAMERAS}", f"port={port}"],
        stdout=open(work / "edge.log", "w"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "edge daemon serving" not in (work / "edge.log").read_text():
            if edge.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((work / "edge.log").read_text()[-3000:])
            time.sleep(0.2)
        base = ["--robot", "franka", "env.edge.host=127.0.0.1", f"env.edge.port={port}", f"calibration.root={work}",
                f"calibration.views={args.views}"]  # fmt: skip
        base += [f"calibration.tilt_deg={args.tilt_deg}"] if args.tilt_deg is not None else []
        base += [f"calibration.spin_deg={args.spin_deg}"] if args.spin_deg is not None else []
        rows = []
        cases = [("eye_in_hand", "wrist", TABLE_BOARD, "tcp_T_wrist", "tcp_T_camera"),
                 ("eye_to_hand", "front", HAND_BOARD, "base_T_front", "base_T_camera")]  # fmt: skip
        for mode, camera, board, true_key, key in cases:
            board_arg = "calibration.board={" + ", ".join(f"{k}: {v}" for k, v in board.items()) + "}"
            t0 = time.perf_counter()
            cli("calibrate", "hand-eye", *base, f"calibration.camera={camera}", f"calibration.mode={mode}", board_arg)
            seconds = time.perf_counter() - t0
            cli("calibrate", "check", *base, f"calibration.camera={camera}",
                f"calibration.out={work / f'check-{camera}.png'}")  # fmt: skip
            import yaml

            result = yaml.safe_load((work / "franka" / f"{camera}.yaml").read_text())
            mm, deg = transform_error(np.array(result[key]), truth()[true_key])
            poses, dets, K, dist = load_views(work / "franka" / f"{camera}-views.npz")
            spec = BoardSpec.from_dict(board)
            noise_rows = []
            for sigma in args.noise:
                rng = np.random.default_rng(0)
                errs = [transform_error(resolve_with_noise(spec, mode, poses, dets, K, dist, sigma, rng).transform,
                                        truth()[true_key]) for _ in range(args.draws)]  # fmt: skip
                e_mm, e_deg = np.array([e[0] for e in errs]), np.array([e[1] for e in errs])
                noise_rows.append({
                    "noise_px": sigma, "draws": args.draws, "median_mm": round(float(np.median(e_mm)), 3),
                    "p95_mm": round(float(np.percentile(e_mm, 95)), 3), "median_deg": round(float(np.median(e_deg)), 4),
                    "p95_deg": round(float(np.percentile(e_deg, 95)), 4),
                })  # fmt: skip
            rows.append({
                "mode": mode, "camera": camera, "views": result["views"], "views_missed": result["views_missed"],
                "solver": result["method"], "seconds": round(seconds, 1), "error_mm": round(mm, 3),
                "error_deg": round(deg, 4), "residual_mm": result["residual_mm"], "residual_deg": result["residual_deg"],
                "board_rms_px": result["board_rms_px"], "with_pixel_noise": noise_rows,
            })  # fmt: skip
            print(json.dumps(rows[-1]))
            shutil.copy(work / f"check-{camera}.png", RESULTS / f"calibration_check_{camera}.png")
    finally:
        edge.terminate()
        edge.wait(20)
    out = {
        "task": "hand-eye calibration through the edge daemon on franky-sim's calibration scene (640x480 MuJoCo "
                "cameras, ChArUco boards); error against the scene's truth; noise: Gaussian on every corner",
        "pose_set": {"views": args.views, "tilt_deg": args.tilt_deg, "spin_deg": args.spin_deg},
        "machine": describe(), "date": time.strftime("%Y-%m-%d"), "results": rows,
    }  # fmt: skip
    (RESULTS / args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / args.out}")


if __name__ == "__main__":
    main()
