"""Commanded vs measured motion of the Franka path, and the workspace box under saturated pushes.

``rlinf-user edge --robot franka franky_sim=true`` (franky, the real client library, driving
franky-sim's MuJoCo FR3 over the libfranka protocol) in its own process, the real
:class:`EdgeClient` sending per-step deltas as a policy, a SpaceMouse or a replayed
demonstration would. Per control rate and ``safety.target_mode``:

* **tracking**: a 10 cm square in x-y (3 laps), a 10 cm vertical line up and down, and a
  +/-0.3 rad yaw sweep, all at 0.1 m/s (0.3 rad/s), then a 1 s hold (zero actions).
  Reported: the path error (distance of each measured TCP position from the commanded
  polyline: RMS, max), the share of each commanded step the arm covers (measured speed
  along a leg over the commanded speed, in the middle half of each leg), the square's
  measured size, the z drift per lap, the error left after the 1 s hold, and the yaw reached
  (the arm lags the command, so the peak is reached during the reversal).
* **box**: saturated pushes (|a| = 1) toward each of the 6 faces and 8 corners of the
  workspace box from its centre, with and without a simultaneous saturated rotation, and
  rotation-only actions at each face; reported: how far the measured TCP went outside the
  box (max over all ticks, from the daemon's state stream), and the daemon's safety counters.

    python benchmarks/bench_tracking.py              # both modes, 10 and 20 Hz (~4 min)
    python benchmarks/bench_tracking.py --quick      # one lap, 20 Hz commanded only
    python benchmarks/bench_tracking.py --robot-ip 172.16.0.2 --no-box   # your own arm
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq
from scipy.spatial.transform import Rotation

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe, franky_sim_footer  # noqa: E402

from rlinf_user.edge.client import EdgeClient  # noqa: E402
from rlinf_user.edge.protocol import decode  # noqa: E402
from rlinf_user.procs import free_ports  # noqa: E402

MAX_T, MAX_R = 0.02, 0.1  # the daemon's max_translation (m) and max_rotation (rad) per step
SPEED, YAW_SPEED = 0.1, 0.3  # m/s, rad/s
BOX = ((0.30, -0.25, 0.15), (0.60, 0.25, 0.55))  # the workspace box of the box pushes
ROBOT_IP: str | None = None  # --robot-ip: a real arm instead of franky-sim


def free_port_pair() -> int:
    return free_ports(3)


class Edge:
    def __init__(self, hz: float, mode: str, box, log: Path, ip: str = "127.0.0.41", extra=()):
        self.port = free_port_pair()
        lo, hi = box
        sim = [] if ROBOT_IP else ["franky_sim=true"]
        args = ["--robot", "franka", *sim, f"robot.ip={ROBOT_IP or ip}", f"control_hz={hz}",
                f"port={self.port}", f"safety.target_mode={mode}", "peer_timeout_s=5",
                f"safety.workspace_low=[{','.join(map(str, lo))}]",
                f"safety.workspace_high=[{','.join(map(str, hi))}]", *extra]  # fmt: skip
        self.log = open(log, "w")
        env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), COLUMNS="200")
        self.proc = subprocess.Popen([sys.executable, "-m", "rlinf_user.cli.main", "edge", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)  # fmt: skip
        deadline = time.monotonic() + 120
        while "edge daemon serving" not in Path(log).read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(Path(log).read_text()[-3000:])
            time.sleep(0.1)
        self.client = EdgeClient("127.0.0.1", self.port, timeout_s=10.0)
        self.client.hello()
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"tcp://127.0.0.1:{self.port + 1}")

    def act(self, a) -> np.ndarray:
        return np.asarray(self.client.act(np.asarray(a, np.float32)).arrays["state"], float)

    def stream(self, seconds: float) -> list[np.ndarray]:
        """The daemon's state stream (every tick, held or not) for ``seconds``."""
        while self.sub.poll(0):
            self.sub.recv_multipart()
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            if self.sub.poll(20):
                out.append(np.asarray(decode(self.sub.recv_multipart()).arrays["state"], float))
        return out

    def close(self) -> None:
        self.client.close()
        self.sub.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def move_to(edge: Edge, goal, hz: float) -> np.ndarray:
    """Drive the TCP to ``goal`` with small steps (not measured), then settle."""
    s = edge.act(np.zeros(7))
    for _ in range(int(10 * hz)):
        d = np.asarray(goal) - s[:3]
        if np.linalg.norm(d) < 0.002:
            break
        s = edge.act(np.r_[np.clip(d / MAX_T, -0.5, 0.5), np.zeros(4)])
    edge.stream(1.0)
    return edge.act(np.zeros(7))


def hold(edge: Edge, seconds: float) -> list[np.ndarray]:
    """Zero actions (``stay here``) for ``seconds``: the states seen."""
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(edge.act(np.zeros(7)))
    return out


def _seg_dist(p, a, b) -> float:
    ab = b - a
    t = np.clip(np.dot(p - a, ab) / max(np.dot(ab, ab), 1e-12), 0.0, 1.0)
    return float(np.linalg.norm(p - (a + t * ab)))


def run_path(edge: Edge, legs: list[np.ndarray], hz: float, laps: int) -> dict:
    """Legs are displacement vectors (m) drawn at SPEED; returns tracking metrics."""
    step = SPEED / hz
    start = edge.act(np.zeros(7))[:3]
    commanded, measured, covered, lap_z = [start.copy()], [start.copy()], [], []
    target = start.copy()
    for _ in range(laps):
        for leg in legs:
            n = int(round(np.linalg.norm(leg) / step))
            d = leg / n
            first = len(measured)
            for _ in range(n):
                target = target + d
                s = edge.act(np.r_[d / MAX_T, np.zeros(4)])
                commanded.append(target.copy())
                measured.append(s[:3])
            # steady state: the middle half of the leg, past the start and before the turn
            a, b = first + n // 4, first + 3 * n // 4
            direction = leg / np.linalg.norm(leg)
            covered.append(float(np.dot(measured[b] - measured[a], direction) / ((b - a) * step)))
        lap_z.append(measured[-1][2] - start[2])
    held = hold(edge, 1.0)
    c, m = np.asarray(commanded), np.asarray(measured)
    corners = [start + sum(legs[:i], np.zeros(3)) for i in range(len(legs) + 1)]
    path_err = np.array([min(_seg_dist(p, a, b) for a, b in zip(corners, corners[1:])) for p in m])
    last_lap = m[-sum(int(round(np.linalg.norm(leg) / step)) for leg in legs):]
    return {
        "path_error_mm": {"rms": float(np.sqrt(np.mean(path_err**2)) * 1e3), "max": float(path_err.max() * 1e3)},
        "step_covered_pct": {"mean": float(np.mean(covered) * 100), "min": float(np.min(covered) * 100)},
        "time_aligned_error_mm_rms": float(np.sqrt(np.mean(np.sum((m - c) ** 2, axis=1))) * 1e3),
        "last_lap_extent_mm": (np.ptp(last_lap, axis=0) * 1e3).round(1).tolist(),
        "z_drift_per_lap_mm": (np.asarray(lap_z) * 1e3).round(2).tolist(),
        "hold_error_after_1s_mm": float(np.linalg.norm(held[-1][:3] - c[-1]) * 1e3) if held else None,
        "steps": len(c) - 1,
    }


def run_yaw(edge: Edge, hz: float, amplitude: float = 0.3) -> dict:
    step = YAW_SPEED / hz
    q0 = Rotation.from_quat(edge.act(np.zeros(7))[3:7])
    plan = [amplitude, -amplitude, 0.0]
    cmd, yaw_c, yaw_m = 0.0, [], []
    for goal in plan:
        n = int(round(abs(goal - cmd) / step))
        d = (goal - cmd) / n
        for _ in range(n):
            cmd += d
            s = edge.act(np.r_[np.zeros(5), d / MAX_R, 0.0])
            yaw_c.append(cmd)
            yaw_m.append((Rotation.from_quat(s[3:7]) * q0.inv()).as_rotvec()[2])
    held = hold(edge, 1.0)
    yc, ym = np.asarray(yaw_c), np.asarray(yaw_m)
    left = (Rotation.from_quat(held[-1][3:7]) * q0.inv()).as_rotvec()[2] if held else None
    return {
        "commanded_deg": [float(np.degrees(amplitude)), float(np.degrees(-amplitude))],
        "reached_deg": [float(np.degrees(ym.max())), float(np.degrees(ym.min()))],
        "reached_pct": float((ym.max() - ym.min()) / (2 * amplitude) * 100),
        "time_aligned_error_deg_rms": float(np.degrees(np.sqrt(np.mean((ym - yc) ** 2)))),
        "hold_error_after_1s_deg": None if left is None else float(np.degrees(abs(left))),
    }


def tracking_case(hz: float, mode: str, laps: int, tmp: Path) -> dict:
    wide = ((0.20, -0.40, 0.10), (0.80, 0.40, 0.70))  # faces far away: tracking only
    edge = Edge(hz, mode, wide, tmp / f"track_{hz:g}_{mode}.log")
    try:
        edge.client.reset(seed=0)
        move_to(edge, (0.40, -0.05, 0.35), hz)
        square = run_path(edge, [np.array(v) for v in ((0.1, 0, 0), (0, 0.1, 0), (-0.1, 0, 0), (0, -0.1, 0))],
                          hz, laps)  # fmt: skip
        line = run_path(edge, [np.array((0, 0, 0.1)), np.array((0, 0, -0.1))], hz, 1)
        yaw = run_yaw(edge, hz)
        tel = edge.client.telemetry()
    finally:
        edge.close()
    return {"hz": hz, "target_mode": mode, "square": square, "vertical_line": line, "yaw": yaw,
            "safety": tel.get("safety")}  # fmt: skip


BOX_VARIANTS = {
    "default": [],  # workspace_margin 10 mm, braking within 5 cm of a face
    "no-margin-no-braking": ["safety.workspace_margin=0", "safety.brake_distance=0"],
}


def box_case(hz: float, mode: str, tmp: Path, push_s: float, variant: str = "default") -> dict:
    lo, hi = (np.asarray(b) for b in BOX)
    centre = (lo + hi) / 2
    edge = Edge(hz, mode, BOX, tmp / f"box_{hz:g}_{mode}_{len(variant)}.log", extra=BOX_VARIANTS[variant])
    worst, per = -np.inf, []
    try:
        edge.client.reset(seed=0)
        dirs = [np.eye(3)[i] * s for i in range(3) for s in (1, -1)]
        dirs += [np.array(c, float) for c in itertools.product((1, -1), repeat=3)]
        rot = np.array([1.0, 0.0, 1.0]) / np.sqrt(2)  # a saturated rotation about a tilted axis
        for d, with_rot in itertools.product(dirs, (False, True)):
            move_to(edge, centre, hz)
            a = np.r_[d, rot if with_rot else np.zeros(3), 0.0]
            out = []
            for _ in range(int(push_s * hz)):
                out.append(edge.act(a)[:3])
            if with_rot:  # then rotate back and forth at the face (rotation only)
                for k in range(int(hz)):
                    out.append(edge.act(np.r_[np.zeros(3), (1 if k % 10 < 5 else -1) * np.array([0, 0, 1.0]), 0])[:3])
            out += [s[:3] for s in edge.stream(0.5)]
            p = np.asarray(out)
            signed = float(np.max(np.maximum(lo - p, p - hi)) * 1e3)  # < 0: inside by that much
            worst = max(worst, signed)
            per.append({"direction": d.tolist(), "rotation": with_rot, "closest_to_face_mm": round(-signed, 2)})
        tel = edge.client.telemetry()
    finally:
        edge.close()
    return {"hz": hz, "target_mode": mode, "variant": variant, "box": [lo.tolist(), hi.tolist()],
            "max_outside_mm": round(max(worst, 0.0), 2), "closest_to_face_mm": round(-worst, 2),
            "daemon_worst_exit_mm": tel.get("box_worst_exit_mm"), "safety": tel.get("safety"), "pushes": per}  # fmt: skip


def _closest(r: dict) -> str:
    v = r.get("closest_to_face_mm")
    return "not recorded" if v is None else f"{v:.1f}"


def write_markdown(result: dict, path: Path) -> None:
    lines = ["# Commanded vs measured motion (franky-sim)", "",
             "Generated by `python benchmarks/bench_tracking.py`. `rlinf-user edge --robot franka "
             "franky_sim=true`, default impedance gains, per-step deltas at 0.1 m/s (0.3 rad/s). "
             "Path error: distance of each measured TCP position from the commanded polyline. "
             "Step covered: measured speed along a leg over the commanded speed, middle half "
             "of each leg (100% means no step is lost). Hold: zero actions for 1 s after the "
             "path.", "",
             "| Hz | target_mode | square path RMS / max mm | step covered mean (min) % | last lap size mm | "
             "z drift per lap mm | hold error 1 s mm | line RMS mm | line covered % | yaw reached deg (of +/-17.2) | "
             "yaw hold error deg |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["tracking"]:
        sq, ln, yw = r["square"], r["vertical_line"], r["yaw"]
        lines.append(
            f"| {r['hz']:g} | {r['target_mode']} | {sq['path_error_mm']['rms']:.1f} / {sq['path_error_mm']['max']:.1f} | "
            f"{sq['step_covered_pct']['mean']:.0f} ({sq['step_covered_pct']['min']:.0f}) | "
            f"{sq['last_lap_extent_mm'][0]:.0f} x {sq['last_lap_extent_mm'][1]:.0f} | "
            f"{', '.join(f'{z:+.1f}' for z in sq['z_drift_per_lap_mm'])} | {sq['hold_error_after_1s_mm']:.1f} | "
            f"{ln['path_error_mm']['rms']:.1f} | {ln['step_covered_pct']['mean']:.0f} | "
            f"{yw['reached_deg'][0]:+.1f} / {yw['reached_deg'][1]:+.1f} | {yw['hold_error_after_1s_deg']:.1f} |"
        )  # fmt: skip
    if result.get("box"):
        lines += ["", "## Workspace box under saturated pushes", "",
                  "Pushes with |a| = 1 from the box centre toward the 6 faces and 8 corners, each with "
                  "and without a saturated rotation, then rotation-only at the face; the measured TCP "
                  "read every tick from the state stream.", "",
                  "| Hz | target_mode | safety | pushes | max measured outside the box mm | closest to a face mm "
                  "(< 0: outside) | box_exit events | workspace clips | lead pulls |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in result["box"]:
            c = r["safety"] or {}
            lines.append(f"| {r['hz']:g} | {r['target_mode']} | {r['variant']} | {len(r['pushes'])} | "
                         f"{r['max_outside_mm']:.1f} | {_closest(r)} | {c.get('box_exit')} | "
                         f"{c.get('workspace')} | {c.get('lead')} |")  # fmt: skip
        lines += ["", f"Box {result['box'][0]['box'][0]} .. {result['box'][0]['box'][1]} (m, base frame)."]
    lines += ["", franky_sim_footer(result["machine"]), ""]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="10,20")
    ap.add_argument("--modes", default="commanded,measured")
    ap.add_argument("--laps", type=int, default=3)
    ap.add_argument("--no-box", action="store_true")
    ap.add_argument("--no-tracking", action="store_true")
    ap.add_argument("--merge", action="store_true", help="keep the other cases of an earlier edge_tracking.json")
    ap.add_argument("--push-s", type=float, default=1.5)
    ap.add_argument("--box-variants", default=",".join(BOX_VARIANTS), help="comma list of " + ", ".join(BOX_VARIANTS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--robot-ip", default=None, help="a real Franka's FCI address instead of franky-sim (run it "
                    "on the robot PC with the arm clear: it draws the paths and pushes into the box faces)")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    global ROBOT_IP
    ROBOT_IP = args.robot_ip
    if args.quick:
        args.rates, args.modes, args.laps, args.push_s = "20", "commanded", 1, 1.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    result = {"benchmark": "edge commanded vs measured motion (franky-sim)", "machine": describe(),
              "tracking": [], "box": []}  # fmt: skip
    for hz, mode in itertools.product(map(float, args.rates.split(",")), args.modes.split(",")):
        if not args.no_tracking:
            print(f"[tracking] {hz:g} Hz {mode}", flush=True)
            result["tracking"].append(tracking_case(hz, mode, args.laps, tmp))
            print(json.dumps(result["tracking"][-1]["square"]), flush=True)
        for variant in [] if args.no_box else args.box_variants.split(","):
            print(f"[box] {hz:g} Hz {mode} {variant}", flush=True)
            result["box"].append(box_case(hz, mode, tmp, args.push_s, variant))
            print("max outside mm:", result["box"][-1]["max_outside_mm"], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge and (out / "edge_tracking.json").exists():  # re-run cases replace their namesakes
        old = json.loads((out / "edge_tracking.json").read_text())
        key = lambda r: (r["hz"], r["target_mode"], r.get("variant"))  # noqa: E731
        for part in ("tracking", "box"):
            new_keys = {key(r) for r in result[part]}
            kept = [r for r in old.get(part, []) if key(r) not in new_keys]
            result[part] = sorted(kept + result[part], key=lambda r: (r["hz"], r["target_mode"] != "commanded",
                                                                      r.get("variant") != "default"))  # fmt: skip
    (out / "edge_tracking.json").write_text(json.dumps(result, indent=2))
    write_markdown(result, out / "EDGE_TRACKING.md")
    print(f"wrote {out / 'edge_tracking.json'} and EDGE_TRACKING.md")


if __name__ == "__main__":
    main()
