"""``rlinf-user doctor --robot franka``: the robot PC checks, run as a user runs them.

The robot is franky-sim (MuJoCo behind the libfranka protocol) on its own loopback address;
the failure cases use loopback addresses where nothing listens, a server that never answers
the libfranka handshake, and one that answers it with an incompatible server version.
Loopback addresses used here: 127.0.0.21 .. 127.0.0.24.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlinf_user import doctor_realtime
from rlinf_user import doctor_robot as doctor
from rlinf_user.robots.franka.driver import libfranka_version

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "rlinf_user.cli.main", "doctor", "--robot", "franka"]
# A wide console keeps every table row on one line.
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "1000", "NO_COLOR": "1"}
SIM_IP, DEAD_IP, OLD_SERVER_IP, SILENT_IP = "127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24"

needs_franky = pytest.mark.skipif(
    importlib.util.find_spec("franky") is None, reason="needs franky (rlinf-user[franka])"
)


def run_doctor(*overrides: str, timeout: float = 60.0):
    """(exit code, output, {row name: (status, found, fix)} of the robot table, seconds)."""
    t0 = time.monotonic()
    r = subprocess.run([*CLI, *overrides], capture_output=True, text=True, timeout=timeout, env=ENV)
    elapsed = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert "robot PC: franka" in out, out
    rows: dict[str, list[str]] = {}
    last = None
    for line in out[out.index("robot PC: franka"):].splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) != 4:
            continue
        if cells[0]:
            last = cells[0]
            rows[last] = cells[1:]
        elif last is not None:  # a wrapped row continues
            rows[last] = [f"{a} {b}".strip() for a, b in zip(rows[last], cells[1:])]
    return r.returncode, out, {k: tuple(v) for k, v in rows.items()}, elapsed


# ----------------------------------------------------------------------- against franky-sim


@pytest.fixture(scope="module")
def franky_sim():
    pytest.importorskip("franky_sim")
    from rlinf_user.robots.franka.sim_server import start_franky_sim

    with start_franky_sim(hostname=SIM_IP) as sim:
        yield sim


@needs_franky
def test_robot_row_ok_against_franky_sim(franky_sim):
    code, out, rows, _ = run_doctor(f"robot.ip={SIM_IP}", "robot.realtime=false")
    status, found, _ = rows["robot"]
    assert status == "ok", out
    assert f"connected to {SIM_IP}" in found and "mode Idle" in found and "no errors" in found
    assert f"franky {md.version('franky-control')}" in found
    assert f"libfranka {libfranka_version()}" in found
    assert rows["franky"][0] == "ok" and f"libfranka {libfranka_version()}" in rows["franky"][1]
    assert rows["libfranka / robot server"][0] == "ok"
    assert rows["Franka Hand"][0] == "ok" and "server version" in rows["Franka Hand"][1]
    # robot.realtime=false on any kernel is at worst a warning: nothing fails here
    assert rows["real-time kernel"][0] in ("ok", "warn")
    assert code == 0, out


# ----------------------------------------------------------------------- failures


def test_unreachable_robot_fails_fast_naming_the_address():
    code, out, rows, elapsed = run_doctor(f"robot.ip={DEAD_IP}")
    status, found, fix = rows["robot"]
    assert status == "fail" and DEAD_IP in found and "FCI" in fix, out
    assert code != 0
    assert elapsed < 15.0


def test_camera_with_absent_serial_lists_what_is_present():
    pytest.importorskip("pyrealsense2")
    cams = "cameras=[{name: wrist, kind: realsense, serial: '000000000001'}]"
    code, out, rows, _ = run_doctor(f"robot.ip={DEAD_IP}", cams)
    status, found, _ = rows["camera wrist (realsense)"]
    assert status == "fail", out
    assert "000000000001" in found and "present:" in found  # "present: none" without devices
    assert code != 0


def test_missing_robot_ip_is_a_row_not_a_traceback():
    code, out, rows, _ = run_doctor()
    status, found, fix = rows["robot"]
    assert status == "fail" and "robot.ip" in found and "robot.ip=" in fix, out
    assert code != 0
    # the checks that need no robot still ran
    assert {"franky", "real-time kernel", "SCHED_FIFO", "CPU governor", "edge keys"} <= set(rows)


def _serve_old_robot(server: socket.socket, server_version: int) -> None:
    """Answer libfranka's Connect with kIncompatibleLibraryVersion, like an older robot."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            data = b""
            while len(data) < 16:  # header (command, id, size) + (library version, UDP port)
                chunk = conn.recv(64)
                if not chunk:
                    break
                data += chunk
            if len(data) < 16:
                continue
            _, command_id, _ = struct.unpack("<III", data[:12])
            reply = struct.pack("<BH5x", 1, server_version)  # status, server version
            conn.sendall(struct.pack("<III", 0, command_id, 12 + len(reply)) + reply)
            time.sleep(0.2)


@needs_franky
def test_incompatible_server_version_names_both_versions_and_the_wheel():
    server = socket.create_server((OLD_SERVER_IP, 1337))
    threading.Thread(target=_serve_old_robot, args=(server, 5), daemon=True).start()
    try:
        code, out, rows, _ = run_doctor(f"robot.ip={OLD_SERVER_IP}")
    finally:
        server.close()
    assert rows["robot"][0] == "fail", out
    status, found, fix = rows["libfranka / robot server"]
    assert status == "fail"
    assert "robot server version 5" in found and f"libfranka {libfranka_version()}" in found
    assert "by-robot-server-version/5/" in fix
    assert code != 0


@needs_franky
def test_silent_robot_times_out_with_the_configured_timeout():
    server = socket.create_server((SILENT_IP, 1337))  # accepts, never answers
    try:
        code, out, rows, elapsed = run_doctor(f"robot.ip={SILENT_IP}", "robot.connect_timeout_s=1.5")
    finally:
        server.close()
    status, found, _ = rows["robot"]
    assert status == "fail" and "handshake" in found and "1.5 s" in found, out
    assert code != 0 and elapsed < 15.0


# ----------------------------------------------------------------------- single checks, in-process


def test_rt_kernel_status_follows_robot_realtime(monkeypatch):
    monkeypatch.setattr(doctor_realtime, "_kernel_is_realtime", lambda: (False, "6.8.0-generic"))
    assert doctor_realtime.check_rt_kernel(True).status == "fail"
    degraded = doctor_realtime.check_rt_kernel(False)
    assert degraded.status == "warn" and "robot.realtime=false" in degraded.detail
    assert "PREEMPT_RT" in degraded.fix
    monkeypatch.setattr(doctor_realtime, "_kernel_is_realtime", lambda: (True, "6.8.1-rt"))
    assert doctor_realtime.check_rt_kernel(True).status == "ok"


def test_sched_fifo_refusal_fails_only_when_realtime_is_needed(monkeypatch):
    monkeypatch.setattr(doctor_realtime, "sched_fifo_allowed", lambda prio: (False, "Operation not permitted"))
    assert doctor_realtime.check_sched_fifo(True).status == "fail"
    assert doctor_realtime.check_sched_fifo(False).status == "warn"
    assert "rtprio" in doctor_realtime.check_sched_fifo(True).fix
    allowed, _ = doctor_realtime.sched_fifo_allowed(1)  # the real probe runs and answers
    assert isinstance(allowed, bool)


def test_cpu_governor(tmp_path):
    assert doctor_realtime.check_cpu_governor(str(tmp_path)).status == "ok"  # no cpufreq at all
    for i, gov in enumerate(["performance", "powersave"]):
        d = tmp_path / f"cpu{i}" / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(gov + "\n")
    check = doctor_realtime.check_cpu_governor(str(tmp_path))
    assert check.status == "warn" and "powersave on 1 CPU" in check.detail
    (tmp_path / "cpu1" / "cpufreq" / "scaling_governor").write_text("performance\n")
    assert doctor_realtime.check_cpu_governor(str(tmp_path)).status == "ok"


def test_edge_keys(tmp_path):
    from rlinf_user.edge.security import keygen

    assert doctor.check_edge_keys(None, None, "127.0.0.1").status == "warn"
    assert doctor.check_edge_keys(None, None, "10.0.0.5").status == "fail"
    keys = keygen(tmp_path / "keys")
    ok = doctor.check_edge_keys(str(keys["edge_secret"]), str(keys["authorized"]), "10.0.0.5")
    assert ok.status == "ok" and "1 authorized client key" in ok.detail
    empty = tmp_path / "empty"
    empty.mkdir()
    assert doctor.check_edge_keys(str(keys["edge_secret"]), str(empty), "10.0.0.5").status == "fail"
    public_only = doctor.check_edge_keys(str(keys["edge_public"]), str(keys["authorized"]), "x")
    assert public_only.status == "fail" and "no secret key" in public_only.detail
    missing = doctor.check_edge_keys(str(tmp_path / "nope"), str(keys["authorized"]), "x")
    assert missing.status == "fail" and "does not exist" in missing.detail
    assert doctor.check_edge_keys(str(keys["edge_secret"]), None, "x").status == "fail"


@pytest.fixture
def fake_zed(fake_pyzed):
    return fake_pyzed


def test_zed_camera_by_serial(fake_zed):
    fake_zed._plug(1111, None)
    fake_zed._plug(2222, None)
    assert doctor.check_camera({"name": "side", "kind": "zed", "serial": 2222}).status == "ok"
    absent = doctor.check_camera({"name": "side", "kind": "zed", "serial": "3333"})
    assert absent.status == "fail" and "present: 1111, 2222" in absent.detail
    ambiguous = doctor.check_camera({"name": "side", "kind": "zed"})
    assert ambiguous.status == "fail" and "set the camera's serial" in ambiguous.fix


def test_zed_sdk_missing_is_a_warning(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyzed", None)  # import pyzed fails
    monkeypatch.setitem(sys.modules, "pyzed.sl", None)
    check = doctor.check_camera({"name": "side", "kind": "zed", "serial": "1"})
    assert check.status == "warn" and "Stereolabs" in check.fix
    assert "pip install pyzed" not in check.fix


def test_realsense_without_sdk_is_a_warning(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyrealsense2", None)
    check = doctor.check_camera({"name": "wrist", "kind": "realsense", "serial": "1"})
    assert check.status == "warn" and "rlinf-user[realsense]" in check.fix


def test_sim_camera_needs_no_device():
    assert doctor.check_camera({"name": "scene", "kind": "sim"}).status == "ok"
