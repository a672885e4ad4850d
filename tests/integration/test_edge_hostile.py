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

def _flood(port: int, seconds: float) -> subprocess.Popen:
    """A telemetry flood from another process (rlinf_user.edge.hostile), under way on return."""
    proc = subprocess.Popen([sys.executable, "-m", "rlinf_user.edge.hostile", "flood", str(port), str(seconds),
                             "-", "telemetry"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "flooding"
    return proc


@pytest.fixture()
def edge(tmp_path):
    port = free_ports(3)
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
    window0 = time.monotonic()  # the daemon's counters below cover no more than [window0, window]
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
    window = time.monotonic() - window0
    assert sent > 10_000, f"the flood was too weak to test anything ({sent} requests)"
    # the daemon read at most its budget of the shared socket (500/s, a burst of 1,000) between
    # the two telemetry snapshots (queued flood messages are still read after the flooder exits,
    # so the bound spans both snapshots, not only the flood): the rest of the flood waited in
    # libzmq and the kernel; of what it read, most went unanswered
    d = t["daemon"]
    assert d["public_read"] - before["daemon"]["public_read"] <= 500 * window + 1000 < sent // 2, (d, sent)
    assert d["rate_limited"] > 0.5 * (d["public_read"] - before["daemon"]["public_read"]), d
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


def test_half_open_connections_never_lock_out_an_authorised_client(tmp_path):
    """1,500 connections that never finish the CURVE handshake against a daemon started with
    the usual soft limit of 1,024 open files: a fresh authorised client still gets in, the
    controller keeps stepping, the ingress guard keeps working, the log stays short and the
    memory comes back."""
    from rlinf_user.edge.security import keygen

    keys = keygen(tmp_path / "keys")
    port = free_ports(3)
    edge = EdgeProcess(["--sim", "gym_hil", f"control_hz={HZ}", f"secret_key={keys['edge_secret']}",
                        f"authorized_keys={keys['authorized']}"], port, tmp_path / "edge.log", nofile=1024)  # fmt: skip
    daemon = psutil.Process(edge.proc.pid)

    def client(timeout_s: float = 5.0) -> EdgeClient:
        return EdgeClient("127.0.0.1", port, server_public_key=str(keys["edge_public"]),
                          client_secret_key=str(keys["client_secret"]), timeout_s=timeout_s)  # fmt: skip

    c = client()
    try:
        c.hello()
        c.reset(seed=0)
        rss0 = daemon.memory_info().rss
        lines0 = len(edge.log().splitlines())
        attacker = subprocess.Popen([sys.executable, "-m", "rlinf_user.edge.hostile", "half_open", str(port), "1500",
                                     "8"], stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert attacker.stdout.readline().strip() == "opened"
        connects, steps = [], 0
        next_probe = time.monotonic() + 0.5
        while attacker.poll() is None:
            c.act(np.zeros(7, np.float32))  # raises on a timeout: the controller is never cut off
            steps += 1
            if time.monotonic() > next_probe:
                fresh = client()
                t0 = time.monotonic()
                fresh.request("ping")
                connects.append(time.monotonic() - t0)
                fresh.close(say_bye=False)
                next_probe = time.monotonic() + 1.0
        opened = int(attacker.stdout.read().split()[-1])
        time.sleep(2.0)
        t = c.telemetry()
        rss1 = daemon.memory_info().rss
    finally:
        c.close()
        edge.close()
    assert opened >= 1100, opened
    # the lock-out was total before (0 of 4 fresh clients answered); bench_edge_hostile.py
    # measures the time a fresh client takes, here a loaded CI machine gets some slack
    assert len(connects) >= 4 and max(connects) < 2.5, connects
    assert steps >= 0.5 * HZ * 6, steps  # the attack lasts about 7 s after "opened"
    ingress = t["ingress"]
    assert ingress["failures"] == 0 and ingress["cut_pending"] > 0 and ingress["checks"] > 100, ingress
    log = edge.log_path.read_text()
    assert len(log.splitlines()) - lines0 < 60, log[-3000:]  # cuts summarised, no tracebacks
    assert "Traceback" not in log
    assert (rss1 - rss0) / 2**20 < 20, (rss0 / 2**20, rss1 / 2**20)
