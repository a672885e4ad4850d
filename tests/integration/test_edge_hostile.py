"""The edge daemon under a hostile client: floods, session replay, oversized messages, kill -9.

The daemon runs as ``rlinf-user edge --sim gym_hil`` in its own process (no keys: loopback,
so any local process may connect, which is the hostile case). The attacker is another
process speaking the wire format by hand over a raw DEALER socket; the legitimate
controller is the real :class:`EdgeClient`.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
import zmq

pytest.importorskip("gym_hil")

from edge_helpers import EdgeProcess, free_ports, running  # noqa: E402

from rlinf_user.edge.client import EdgeClient, EdgeRefused, EdgeTimeout  # noqa: E402
from rlinf_user.edge.protocol import Message, encode  # noqa: E402

HZ = 20.0

FLOODER = textwrap.dedent(
    """
    import sys, time, zmq
    from rlinf_user.edge.protocol import Message, encode
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    s = zmq.Context().socket(zmq.DEALER)
    s.linger = 0
    s.sndhwm = 0  # unbounded: push as fast as the daemon can be made to read
    s.connect(f"tcp://127.0.0.1:{port}")
    frames = encode(Message("telemetry", 1))
    print("flooding", flush=True)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        s.send_multipart(frames)
        n += 1
        while s.poll(0):
            s.recv_multipart()  # read what comes back, as a real client would
    print(n, flush=True)
    """
)


def _flood(port: int, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", FLOODER, str(port), str(seconds)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "flooding"
    return proc


@pytest.fixture()
def edge(tmp_path):
    port = free_ports(2)
    proc = EdgeProcess(["--sim", "gym_hil", f"control_hz={HZ}", "peer_timeout_s=1.0"],
                       port, tmp_path / "edge.log")  # fmt: skip
    yield proc
    proc.close()


def _client(port: int, **kw) -> EdgeClient:
    return EdgeClient("127.0.0.1", port, timeout_s=kw.pop("timeout_s", 2.0), **kw)


def test_telemetry_flood_never_stalls_the_control_loop_or_the_controller(edge):
    c = _client(edge.port)
    c.hello()
    c.reset(seed=0)
    before = c.telemetry()
    flooder = _flood(edge.port, 6.0)
    lat, t0 = [], time.monotonic()
    while flooder.poll() is None:  # the controller acts at the control rate throughout
        s = time.monotonic()
        c.act(np.zeros(7, np.float32))  # raises on a timeout (2 s): none may be lost
        lat.append(time.monotonic() - s)
    sent = int(flooder.stdout.read().split()[-1])
    elapsed = time.monotonic() - t0
    assert c.request("ping").kind == "pong"
    t = c.telemetry()
    assert sent > 10_000, f"the flood was too weak to test anything ({sent} requests)"
    assert t["daemon"]["rate_limited"] > sent // 2  # most of the flood was dropped unanswered
    # Liveness, not timing (bench_edge.py --flood measures the timing): the loop ticked and
    # answered the controller all along (before the fix it stopped for good within seconds).
    ticks = t["ticks"] - before["ticks"]
    assert ticks >= 0.5 * HZ * elapsed, (ticks, elapsed)
    assert len(lat) >= 0.5 * HZ * elapsed and max(lat) < 1.0, (len(lat), max(lat))
    # the watchdog still works under a flood: the controller goes quiet, the robot holds
    flooder = _flood(edge.port, 3.0)
    holds = c.telemetry()["watchdog_holds"]
    c.act(np.zeros(7, np.float32))  # the last action, then silence
    time.sleep(6 / HZ)
    t = c.telemetry()
    assert t["watchdog_holds"] == holds + 1 and t["last_hold"]["idle_periods"] >= 2
    flooder.wait()
    c.close()


def _family(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def test_sigterm_holds_the_robot_within_two_seconds_and_ends_the_daemon_during_a_flood(edge):
    c = _client(edge.port)
    c.hello()
    c.reset(seed=0)
    children = _family(edge.proc.pid)
    assert children, "the control loop runs in a child process"
    flooder = _flood(edge.port, 8.0)
    time.sleep(2.0)
    t0, wall0 = time.monotonic(), time.time()
    edge.proc.send_signal(signal.SIGTERM)
    edge.proc.wait(15)
    took = time.monotonic() - t0
    flooder.kill()
    c.close(say_bye=False)
    # the robot is held within 2 s of the signal, by the control loop's own clock stamp
    # (10-25 ms, also with the machine loaded); the whole process tree is gone within 10 s:
    # under 1 s on an idle machine, the rest is teardown, which three busy processes on
    # 2 cores once stretched to 6.6 s
    held = [ln for ln in edge.log().splitlines() if "shutting down: the robot is held" in ln]
    assert held, edge.log()[-2000:]
    stamp = datetime.datetime.strptime(held[-1][:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert stamp - wall0 <= 2.0, f"the robot was held {stamp - wall0:.2f} s after SIGTERM"
    assert took <= 10.0, f"SIGTERM took {took:.2f} s"
    gone, alive = psutil.wait_procs(children, timeout=0.5)
    assert not running(alive), f"children outlived the daemon: {alive}"


def test_control_loop_holds_and_exits_when_the_daemon_is_killed(edge):
    c = _client(edge.port)
    c.hello()
    c.reset(seed=0)
    loop = [p for p in _family(edge.proc.pid) if "spawn_main" in " ".join(p.cmdline())]
    assert len(loop) == 1
    flooder = _flood(edge.port, 5.0)
    time.sleep(1.0)
    os.kill(edge.proc.pid, signal.SIGKILL)
    edge.proc.wait(5)
    t0 = time.monotonic()
    gone, alive = psutil.wait_procs(loop, timeout=3.0)
    took = time.monotonic() - t0
    flooder.kill()
    c.close(say_bye=False)
    assert not running(alive), "the control loop outlived a SIGKILLed daemon"
    assert took < 2.5, took  # held at once; a hanging teardown is cut off after 1.5 s
    assert "holding the robot" in edge.log() or "terminated" in edge.log()


def test_busy_never_leaks_the_session_and_a_replayed_session_cannot_take_control(edge):
    a, b = _client(edge.port), _client(edge.port)
    a.hello()
    a.reset(seed=0)
    with pytest.raises(EdgeRefused) as err:
        b.hello()
    assert err.value.code == "busy" and a.session not in str(err.value)
    b.session = a.session  # the replay: without keys a live controller is never displaced
    with pytest.raises(EdgeRefused) as err:
        b.hello()
    assert err.value.code == "busy"
    with pytest.raises(EdgeRefused) as err:
        b.act(np.zeros(7, np.float32))
    assert err.value.code == "not_controller"
    a.act(np.zeros(7, np.float32))  # the controller keeps control
    a.close()  # bye: the robot is free
    b.hello()
    b.close()


def test_oversized_messages_never_make_the_daemon_hold_them(edge):
    daemon = psutil.Process(edge.proc.pid)
    base = _hwm_mb(daemon)
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.connect(f"tcp://127.0.0.1:{edge.port}")
    chunk = np.zeros(60 * 2**20, np.uint8)  # one buffer sent 16 times: 960 MB on the wire
    header = encode(Message("act", 1, {}, {f"a{i}": chunk for i in range(16)}))[0]
    s.send_multipart([header] + [chunk] * 16, copy=False)
    time.sleep(3.0)
    c = _client(edge.port)
    c.hello()  # still serving
    c.close()
    assert _hwm_mb(daemon) - base < 100, (base, _hwm_mb(daemon))
    s.close()


@pytest.mark.parametrize("mb_per_s", [None, 40], ids=["flat-out", "paced-40MBps"])
def test_a_never_ending_message_of_small_frames_is_cut_off(edge, mb_per_s):
    """Frames under the per-frame cap, never a last frame: libzmq would buffer them all. A
    paced flood stays under any per-interval byte threshold; it must be cut all the same."""
    daemon = psutil.Process(edge.proc.pid)
    base = _hwm_mb(daemon)
    raw = _zmtp_dealer(edge.port)  # libzmq's own sender would hold frames until the last one
    frame = struct.pack(">BQ", 0x03, 2**20) + bytes(2**20)  # MORE|LONG, 1 MB: under the 16 MB cap
    sent, total = 0, 1000 if mb_per_s is None else 400
    t0 = time.monotonic()
    try:
        for _ in range(total):  # one message that never ends
            raw.sendall(frame)
            sent += 1
            if mb_per_s:
                time.sleep(max(0.0, t0 + sent / mb_per_s - time.monotonic()))
    except OSError:
        pass  # the daemon dropped the connection
    raw.close()
    time.sleep(0.5)
    c = _client(edge.port)
    c.hello()  # still serving
    t = c.telemetry()
    c.close()
    assert sent < total, "the connection was never dropped"
    assert t["daemon"]["ingress_cut"] >= 1
    assert "not by a client's message" not in edge.log()  # the flood was never taken for own growth
    # the 64 MB budget plus what arrives before the guard's next check (5 ms apart, longer
    # when both cores are busy)
    assert _hwm_mb(daemon) - base < 256, (base, _hwm_mb(daemon))


def _zmtp_dealer(port: int) -> socket.socket:
    """A raw TCP peer speaking ZMTP 3.0 (NULL mechanism) by hand, as an attacker can."""
    raw = socket.create_connection(("127.0.0.1", port))
    raw.sendall(b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00" + bytes(31))
    props = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = b"\x05READY" + props
    raw.sendall(struct.pack(">BB", 0x04, len(ready)) + ready)
    got = b""
    while len(got) < 64 + 2:  # the daemon's greeting and the start of its READY
        got += raw.recv(4096)
    return raw


def _hwm_mb(proc: psutil.Process) -> float:
    for line in open(f"/proc/{proc.pid}/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def test_a_timed_out_client_reconnects_while_the_controller_is_dead(edge):
    c = _client(edge.port, timeout_s=0.5)
    c.hello()
    c.reset(seed=0)
    c._stop.set()  # the heartbeat thread stops: the daemon sees a silent controller
    time.sleep(1.5)
    other = _client(edge.port)
    other.hello()  # peer_timeout_s passed: the robot is free
    with pytest.raises((EdgeRefused, EdgeTimeout)):
        c.act(np.zeros(7, np.float32))
    other.close()
