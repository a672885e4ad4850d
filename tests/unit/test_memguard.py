"""The ingress guard's attribution over real TCP sockets, in a fresh process of its own (as
the daemon's network process is; a long-lived test process reuses freed heap and would not
grow): a connection whose received bytes the process holds on to is cut at any rate; a
connection that only talks while the process grows on its own is not."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading
import time

import pytest

MB = 2**20


def _serve(hoard: bool, own_mb_per_s: float, conns: int, out) -> None:
    """``conns`` connections on a fresh port, guarded with a 32 MB budget. ``hoard`` keeps
    every byte received (as libzmq keeps the frames of an unfinished message), else bytes are
    read and dropped; ``own_mb_per_s`` grows the process on its own meanwhile (4 MB at a time)."""
    from rlinf_user.edge.memguard import IngressGuard

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    guard = IngressGuard(32 * MB, lsock.getsockname()[1])
    guard.start()
    start = guard.baseline
    time.sleep(0.3)  # a few samples of the quiet process
    out.put(lsock.getsockname()[1])
    held, own, done = [], [], threading.Event()

    def grow() -> None:
        while own_mb_per_s and not done.wait(4 / own_mb_per_s):
            own.append(b"\x02" * (4 * MB))

    def read(conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(1 << 20)
                except OSError:
                    data = b""
                if not data:
                    return
                if hoard:
                    held.append(data)

    threading.Thread(target=grow, daemon=True).start()
    readers = [threading.Thread(target=read, args=(lsock.accept()[0],)) for _ in range(conns)]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    done.set()
    time.sleep(0.1)
    guard.stop()
    out.put({"cut": guard.cut, "baseline_rise_mb": (guard.baseline - start) / MB, "own_mb": 4 * len(own)})


def _send(port: int, total_mb: int, mb_per_s: float) -> int:
    """Sends up to ``total_mb`` at a steady rate; returns the MB sent before a drop."""
    c = socket.create_connection(("127.0.0.1", port))
    chunk, sent, t0 = b"\x01" * MB, 0, time.monotonic()
    try:
        while sent < total_mb:
            c.sendall(chunk)
            sent += 1
            time.sleep(max(0.0, t0 + sent / mb_per_s - time.monotonic()))
    except OSError:
        pass
    finally:
        c.close()
    return sent


def _session(hoard: bool, own_mb_per_s: float, total_mb: int, mb_per_s: float, conns: int = 1):
    """Each of ``conns`` senders sends ``total_mb`` at ``mb_per_s``; MB sent by each, and
    what the guarded process reported."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(hoard, own_mb_per_s, conns, out), daemon=True)
    proc.start()
    try:
        port = out.get(timeout=120)
        sent = [0] * conns

        def send(i: int) -> None:
            sent[i] = _send(port, total_mb, mb_per_s)

        senders = [threading.Thread(target=send, args=(i,)) for i in range(conns)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        return sent, out.get(timeout=60)
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()


@pytest.mark.parametrize("mb_per_s", [400, 25])
def test_a_connection_whose_bytes_the_process_holds_is_cut_at_any_rate(mb_per_s):
    sent, got = _session(hoard=True, own_mb_per_s=0, total_mb=200, mb_per_s=mb_per_s)
    assert sent[0] < 200 and got["cut"] == 1, (sent, got)


def test_a_flood_split_over_three_connections_is_cut_on_each():
    """No one connection holds 3/4 of the growth; together they hold all of it."""
    sent, got = _session(hoard=True, own_mb_per_s=0, total_mb=100, mb_per_s=10, conns=3)
    assert max(sent) < 100 and got["cut"] == 3, (sent, got)


def test_a_talking_client_is_not_cut_when_the_process_grows_on_its_own():
    # 30 MB read and dropped over 3 s while the process itself grows by 32 MB a second
    sent, got = _session(hoard=False, own_mb_per_s=32, total_mb=30, mb_per_s=10)
    assert sent == [30] and got["cut"] == 0, (sent, got)
    assert got["own_mb"] >= 64 and got["baseline_rise_mb"] > 32, got  # seen, and taken as the process's own


def _serve_pending(max_pending: int, out, cmd) -> None:
    """Accept every connection and keep it (as libzmq keeps a connection in its handshake);
    guard with ``max_pending``; report what the guard cut and which connections survived."""
    from rlinf_user.edge.memguard import IngressGuard

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(512)
    guard = IngressGuard(256 * MB, [lsock.getsockname()[1]], sample_s=0.05, max_pending=max_pending,
                         handshake_bytes=100)  # fmt: skip
    guard.start()
    out.put(lsock.getsockname()[1])
    conns = []
    lsock.settimeout(0.2)
    while cmd.empty():
        try:
            conns.append(lsock.accept()[0])
        except TimeoutError:
            pass
    time.sleep(0.3)
    alive = 0
    for c in conns:
        try:
            alive += c.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""  # a talker's bytes are there
        except BlockingIOError:
            alive += 1  # open, nothing to read
        except OSError:
            pass
    guard.stop()
    out.put({**guard.status(), "alive": alive})


def test_connections_that_never_finish_a_handshake_are_bounded_oldest_first():
    ctx = mp.get_context("spawn")
    out, cmd = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_serve_pending, args=(8, out, cmd), daemon=True)
    proc.start()
    try:
        port = out.get(timeout=120)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]  # never say anything
        time.sleep(0.05)
        talker = socket.create_connection(("127.0.0.1", port))
        talker.sendall(b"\x01" * 200)  # past the handshake's bytes
        time.sleep(0.5)
        # the server shut the oldest idle ones down: their reads end
        ended = 0
        for s in idle:
            s.settimeout(0.05)
            try:
                ended += s.recv(1) == b""
            except (TimeoutError, OSError):
                pass
        talker.settimeout(0.05)
        with pytest.raises(TimeoutError):
            talker.recv(1)  # still open: not cut
        cmd.put("stop")
        got = out.get(timeout=30)
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    assert ended >= 40 - 8, (ended, got)
    assert got["cut_pending"] >= 32 and got["alive"] <= 8 + 1, got
    assert got["failures"] == 0, got


def test_the_guard_keeps_working_without_a_free_descriptor():
    """Out of descriptors (EMFILE), the guard still reads memory and the connection table."""
    import resource

    from rlinf_user.edge.memguard import IngressGuard, tcp_connections

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    port = lsock.getsockname()[1]
    c = socket.create_connection(("127.0.0.1", port))
    a, _ = lsock.accept()
    c.sendall(b"x" * 10)
    guard = IngressGuard(256 * MB, [port])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(64, len(os.listdir("/proc/self/fd")) + 8), hard))
        with pytest.raises(OSError):
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY))
        rss = guard._statm.rss()
        conns = tcp_connections([port], 4096)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for s in (c, a, lsock):
            s.close()
        guard._statm.close()
    assert rss > 0
    assert list(conns.values()) == [10], conns
