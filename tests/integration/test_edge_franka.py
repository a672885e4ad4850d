"""The real Franka path without hardware: franky (the real client library) drives
franky-sim (MuJoCo behind the libfranka network protocol) inside ``rlinf-user edge``.

The daemon runs as a separate process exactly as on a robot PC; the training side is the
real :class:`RemoteRobotEnv` / :class:`EdgeClient`. What the arm does is read back from
the daemon's own state stream (TCP pose and velocity measured by libfranka).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import zmq

pytest.importorskip("franky")
pytest.importorskip("franky_sim")

from edge_helpers import EdgeProcess, edge_telemetry, free_ports, lane_loopback, running  # noqa: E402

from rlinf_user.edge import box_check  # noqa: E402
from rlinf_user.edge.client import EdgeClient, EdgeRefused  # noqa: E402
from rlinf_user.edge.protocol import decode  # noqa: E402
from rlinf_user.edge.remote_env import RemoteRobotEnv  # noqa: E402

HZ = 20.0
LOW, HIGH = (0.30, -0.25, 0.20), (0.65, 0.25, 0.55)


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    port = free_ports(3)
    proc = EdgeProcess(
        ["--robot", "franka", "franky_sim=true", f"robot.ip={lane_loopback(31)}", f"control_hz={HZ}",
         "robot.relative_dynamics_factor=0.5", "peer_timeout_s=1.0",
         f"safety.workspace_low=[{','.join(map(str, LOW))}]",
         f"safety.workspace_high=[{','.join(map(str, HIGH))}]"],
        port, tmp_path_factory.mktemp("edge") / "edge.log",
    )  # fmt: skip
    yield proc
    proc.close()


class StateStream:
    """The daemon's latest-value state stream (port + 1), as a monitoring UI would read it."""

    def __init__(self, port: int):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(f"tcp://127.0.0.1:{port + 1}")

    def collect(self, seconds: float) -> list[tuple[float, np.ndarray, dict]]:
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            if self.sock.poll(50):
                m = decode(self.sock.recv_multipart())
                out.append((m.body["stamp"], np.array(m.arrays["state"]), m.body))
        return out

    def close(self) -> None:
        self.sock.close()


def env(edge, task="reach", **kw):
    c = EdgeClient("127.0.0.1", edge.port, timeout_s=3.0)
    return RemoteRobotEnv(c, task, kw, [], 60, seed=0)


def test_reset_homes_and_a_reach_is_tracked_through_the_daemon(edge):
    e = env(edge, goal_low=[0.42, 0.08, 0.40], goal_high=[0.42, 0.08, 0.40])
    try:
        assert e.edge_spec["versions"]["franky"] and e.edge_spec["kind"] == "robot"
        obs, _ = e.reset(seed=0)
        home = obs["state"][:3].copy()
        assert np.linalg.norm(home - [0.307, 0.0, 0.487]) < 0.03, home
        # a proportional controller through the env contract: about 20 steps at 10 Hz here;
        # up to 90 allowed, since franky-sim's physics falls behind the clock on a loaded
        # machine (39 steps once, beside the other lane) while the daemon ticks on time
        for step in range(90):  # noqa: B007
            a = np.zeros(7, np.float32)
            a[:3] = np.clip(obs["state"][-3:] / e.action_spec.max_translation, -1, 1)
            obs, r, te, tr, info = e.step(a)
            if te:
                break
        assert info["success"] and te, f"not reached after {step + 1} steps: {obs['state'][-3:]}"
    finally:
        e.close()


def test_gripper_closes_and_opens_on_the_action_sign(edge):
    e = env(edge, translate_only=False)
    try:
        e.reset(seed=0)
        a = np.zeros(7, np.float32)
        widths = {}
        # each way within 4 s (1.5 s unloaded; franky-sim's physics falls behind the clock on
        # a loaded machine: 0.37 still open after 1.5 s once, beside the other lane)
        for sign, done in ((1.0, lambda g: g > 0.8), (-1.0, lambda g: g < 0.2)):
            a[6] = sign
            for _ in range(int(4 * HZ)):
                obs, *_ = e.step(a)
                if done(obs["state"][13]):
                    break
            widths[sign] = float(obs["state"][13])
        assert widths[1.0] > 0.8 and widths[-1.0] < 0.2, widths
    finally:
        e.close()


def test_out_of_box_actions_are_clipped_to_the_workspace(edge):
    e = env(edge)
    try:
        e.reset(seed=0)
        before = e.telemetry()["safety"]["workspace"]
        down = np.array([0, 0, -1, 0, 0, 0, 0], np.float32)  # drive into the floor of the box
        lowest = 1.0
        for _ in range(int(2.5 * HZ)):
            obs, *_ = e.step(down)
            lowest = min(lowest, float(obs["state"][2]))
        assert lowest > LOW[2] - 0.01, f"TCP went to z={lowest}, box floor {LOW[2]}"
        assert abs(lowest - LOW[2]) < 0.02  # and it did get there
        assert e.telemetry()["safety"]["workspace"] > before
    finally:
        e.close()


def test_nan_action_never_reaches_the_arm(edge):
    c = EdgeClient("127.0.0.1", edge.port, timeout_s=3.0)
    try:
        c.hello()
        c.reset(seed=0)
        applied = c.telemetry()["applied"]
        with pytest.raises(EdgeRefused) as err:
            c.act(np.array([np.nan, 0, 0, 0, 0, 0, 0], np.float32))
        assert err.value.code == "unsafe"
        assert c.telemetry()["applied"] == applied
    finally:
        c.close()


MOVING_CLIENT = textwrap.dedent(
    """
    import sys, numpy as np
    from rlinf_user.edge.client import EdgeClient
    c = EdgeClient("127.0.0.1", int(sys.argv[1]))
    c.hello(); c.reset(seed=0)
    for i in range(400):
        c.act(np.array([0, 0.5 if (i // 20) % 2 == 0 else -0.5, 0, 0, 0, 0, 0]))
        if i == 5:
            print("moving", flush=True)
    """
)


def test_killed_client_the_arm_holds_within_two_periods(edge):
    stream = StateStream(edge.port)
    proc = subprocess.Popen([sys.executable, "-c", MOVING_CLIENT, str(edge.port)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "moving"
        time.sleep(0.4)  # the arm sweeps in y at full speed
        proc.kill()
        killed = time.monotonic()
        states = stream.collect(3.0)
    finally:
        proc.kill()
        stream.close()
    held = [(t, s, b) for t, s, b in states if b.get("holding")]
    assert held, "the watchdog never held the arm"
    first_hold = held[0][0]
    # the hold comes at the 2nd tick without a command (the loop's own record) ...
    hold = edge_telemetry(edge.port)["last_hold"]
    assert hold["idle_periods"] == 2 and hold["after_s"] <= 3 / HZ, hold
    # ... and shows on the state stream within a few periods, even on busy cores
    assert first_hold - killed <= 5 / HZ, first_hold - killed
    # the arm was sweeping at the commanded 0.2 m/s (a = 0.5 at 20 Hz); once stopped it stays
    # (the window starts late: franky-sim's physics can fall behind real time on busy cores)
    # the position is the judge (a lagging sim's velocity readings are noisy on busy cores)
    settle = [s for t, s, b in held if t > first_hold + 1.5]
    speeds = [float(np.linalg.norm(s[7:10])) for s in settle]
    drift = np.linalg.norm(settle[-1][:3] - settle[0][:3])
    assert drift < 0.005, f"arm drifted {drift * 1e3:.1f} mm while held"
    assert np.median(speeds[-5:]) < 0.03, f"arm still moving {np.median(speeds[-5:]):.3f} m/s after the hold"
    time.sleep(1.2)  # the daemon frees the robot after its peer timeout


def test_explicit_stop_halts_and_refuses_until_reset(edge):
    c = EdgeClient("127.0.0.1", edge.port, timeout_s=3.0)
    try:
        c.hello()
        c.reset(seed=0)
        for _ in range(5):
            c.act(np.array([0, 1.0, 0, 0, 0, 0, 0]))
        assert c.request("stop").body["stopped"]
        with pytest.raises(EdgeRefused, match="stopped"):
            c.act(np.zeros(7))
        m = c.reset(seed=0)
        assert m.body["reset"]
    finally:
        c.close()



def _client(port: int) -> EdgeClient:
    c = EdgeClient("127.0.0.1", port, timeout_s=5.0)
    c.hello()
    c.reset(seed=0)
    return c


def _act(c: EdgeClient, a) -> np.ndarray:
    return np.asarray(c.act(np.asarray(a, np.float32)).arrays["state"], float)


def _go(c: EdgeClient, goal, steps: int = 80) -> np.ndarray:
    s = _act(c, np.zeros(7))
    for _ in range(steps):
        d = np.asarray(goal) - s[:3]
        if np.linalg.norm(d) < 0.002:
            break
        s = _act(c, np.r_[np.clip(d / 0.02, -0.5, 0.5), np.zeros(4)])
    for _ in range(int(0.3 * HZ)):  # settle with zero actions
        s = _act(c, np.zeros(7))
    return s


def test_a_commanded_square_is_drawn_at_its_size(edge):
    """Per-step deltas integrate on the last target: a 10 cm square at 0.1 m/s comes out
    10 cm wide (measured-pose targets drew it about 2 x 3 cm at 20 Hz)."""
    c = _client(edge.port)
    try:
        start = _go(c, (0.42, -0.05, 0.35))[:3]
        step = 0.1 / HZ
        path, speeds = [start], []
        for leg in ((1, 0, 0), (0, 1, 0), (-1, 0, 0), (0, -1, 0)):
            n = int(round(0.1 / step))
            leg_states = [_act(c, np.r_[np.asarray(leg) * step / 0.02, np.zeros(4)])[:3] for _ in range(n)]
            a, b = leg_states[n // 4], leg_states[3 * n // 4]
            speeds.append(float(np.dot(b - a, leg)) / ((3 * n // 4 - n // 4) * step))
            path += leg_states
        for _ in range(int(HZ)):  # hold with zero actions: the arm settles on the commanded end
            end = _act(c, np.zeros(7))[:3]
    finally:
        c.close()
    p = np.asarray(path)
    extent = np.ptp(p, axis=0)
    # 10 cm, not the 2-3 cm of measured-pose targets; franky-sim falling behind real time on
    # busy cores has overshot a corner by 1.5 mm
    assert 0.09 < extent[0] < 0.115 and 0.09 < extent[1] < 0.115, extent
    # share of each commanded step covered in each leg's middle half: about 1 when targets
    # integrate (measured-pose targets covered a quarter). franky-sim falling behind real time
    # beside the other lane moves a leg's share between 0.84 and 1.13 (the square's size stays
    # right; the tracking itself is measured alone by benchmarks/bench_tracking.py);
    # measured-pose targets covered 0.25, so 0.7 still tells them apart
    assert np.mean(speeds) > 0.7 and min(speeds) > 0.5, speeds
    # closes the square, no sag left (measured-pose targets: 14 mm off, z sinking 3.4 mm a
    # lap, and a square a quarter of this size, which the extent check above catches). When
    # franky-sim falls behind real time on busy cores, the edge's lead bound (max_lead) pulls
    # the target back toward the lagging pose and that leg loses distance: a fresh-clone CI run
    # beside the other lane ended 11.0 mm off; alone it closes within a few mm
    assert np.linalg.norm(end - start) < 0.015, end - start
    assert abs(p[:, 2] - start[2]).max() < 0.008  # z was never commanded


def _hostile(port: int, low, high, sequences) -> tuple[list[dict], dict]:
    """Run the hostile sequences (rlinf_user.edge.box_check) through the daemon: the worst
    distance outside the box per sequence, and the daemon's safety counters."""
    c = _client(port)
    try:
        rows = box_check.run_all(c, sequences, low, high, HZ, max_translation=0.02)
        counters = c.telemetry()["safety"]
    finally:
        c.close()
    return rows, counters


@pytest.mark.wallclock
def test_no_sequence_of_actions_or_chunks_takes_the_tcp_out_of_the_box(edge):
    """Saturated pushes to every face (and a corner), then saturated rotation about each
    axis both ways at the face; all axes saturated one way then the other; chunks that end
    at a face and rotate there. Before the rotational lead shrank near the faces, rotation
    at a face dragged the TCP up to 10.9 mm outside the box (bench_box.py)."""
    seqs = box_check.hostile_sequences(HZ, corners=box_check.CORNERS[:1], push_s=2.5, rotate_s=0.75,
                                       saturate_s=2.0)  # fmt: skip
    seqs = [s for s in seqs if not s.name.startswith("chunk")] + [s for s in seqs if s.name.startswith("chunk")][:2]
    rows, counters = _hostile(edge.port, LOW, HIGH, seqs)
    worst = max(rows, key=lambda r: r["max_outside_mm"])
    assert worst["max_outside_mm"] <= 2.0, worst
    assert counters["box_exit"] == 0, counters
    # every face stays reachable: braking lets the arm creep up to the 10 mm margin and stop
    gaps = [r["face_gap_mm"] for r in rows if r["face_gap_mm"] is not None]
    assert len(gaps) == 6 and max(gaps) < 20.0, gaps


@pytest.mark.wallclock
def test_hostile_sequences_in_measured_target_mode_keep_the_box_too(tmp_path):
    low, high = (0.30, -0.25, 0.20), (0.65, 0.25, 0.55)
    edge = EdgeProcess(
        ["--robot", "franka", "franky_sim=true", "robot.ip=127.0.0.34", f"control_hz={HZ}",
         "safety.target_mode=measured", f"safety.workspace_low=[{','.join(map(str, low))}]",
         f"safety.workspace_high=[{','.join(map(str, high))}]"],
        free_ports(3), tmp_path / "edge.log",
    )  # fmt: skip
    try:
        seqs = box_check.hostile_sequences(HZ, faces=box_check.FACES[::2], corners=box_check.CORNERS[:1],
                                           rotations=box_check.ROTATIONS[1::2], push_s=1.5, rotate_s=0.75,
                                           saturate_s=2.0, chunks=False)  # fmt: skip
        rows, counters = _hostile(edge.port, low, high, seqs)
    finally:
        edge.close()
    worst = max(rows, key=lambda r: r["max_outside_mm"])
    assert worst["max_outside_mm"] <= 2.0, worst
    assert counters["box_exit"] == 0, counters


def _serves(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def test_kill_9_of_the_daemon_leaves_no_franky_sim_and_a_restart_works(tmp_path):
    import glob
    import os
    import signal
    import tempfile

    import psutil

    host, args = "127.0.0.32", ["--robot", "franka", "franky_sim=true", "robot.ip=127.0.0.32"]
    edge = EdgeProcess(args, free_ports(3), tmp_path / "first.log")
    family = psutil.Process(edge.proc.pid).children(recursive=True)
    assert any("franky_sim" in " ".join(p.cmdline()) for p in family)
    ipc = glob.glob(os.path.join(tempfile.gettempdir(), f"rlinf-edge-{edge.proc.pid}-*"))
    assert ipc, "the daemon names its IPC folder after itself"
    os.kill(edge.proc.pid, signal.SIGKILL)
    edge.proc.wait(5)
    _, alive = psutil.wait_procs(family, timeout=3.0)
    assert not running(alive), [p.cmdline() for p in running(alive)]
    assert not _serves(host, 1337), "franky-sim still serves the robot port"
    again = EdgeProcess(args, free_ports(3), tmp_path / "second.log")  # the same command
    try:
        assert not any(os.path.exists(d) for d in ipc), "the dead daemon's IPC folder was left"
        c = EdgeClient("127.0.0.1", again.port, timeout_s=5.0)
        c.hello()
        c.reset(seed=0)
        c.close()
    finally:
        again.close()


def test_a_held_robot_port_is_one_clear_line_naming_the_holder(tmp_path):
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.33", 1337))
    holder.listen(1)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "rlinf_user.cli.main", "edge", "--robot", "franka", "franky_sim=true",
             "robot.ip=127.0.0.33", f"port={free_ports(3)}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        holder.close()
    assert out.returncode == 1
    assert "Traceback" not in out.stderr + out.stdout
    assert f"pid {os.getpid()}" in out.stderr and "already served" in out.stderr, out.stderr
