"""The emulated link over real sockets: delay, jitter, bandwidth and backpressure as
configured, bytes intact and in order, bad settings named."""

import socket
import statistics
import threading
import time

import pytest

from rlinf_user.netem import EmulatedLink, LinkSpec


def serve(srv: socket.socket, handle) -> None:
    """Accept on ``srv`` until it closes; each connection is handled in a thread of its own."""

    def accept():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def _pump(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


@pytest.fixture
def echo():
    srv = socket.create_server(("127.0.0.1", 0))
    serve(srv, _pump)
    yield srv.getsockname()[1]
    srv.close()


def recv_n(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "link closed early"
        buf += chunk
    return bytes(buf)


def round_trips(port, n=20):
    out = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(n):
            t0 = time.monotonic()
            s.sendall(bytes([i]) * 8)
            assert recv_n(s, 8) == bytes([i]) * 8
            out.append(time.monotonic() - t0)
    return out


def test_delay_applies_to_each_direction(echo):
    with EmulatedLink("127.0.0.1", echo, LinkSpec(delay_ms=30)) as link:
        rtt = round_trips(link.port)
    assert 0.060 <= statistics.median(rtt) < 0.090  # 2 x 30 ms, plus a little


def test_jitter_spreads_round_trips_but_keeps_bytes_in_order(echo):
    with EmulatedLink("127.0.0.1", echo, LinkSpec(delay_ms=20, jitter_ms=8), seed=1) as link:
        rtt = round_trips(link.port, n=40)
        payload = bytes(range(256)) * 400  # 100 kB in many pieces, each with its own jitter
        with socket.create_connection(("127.0.0.1", link.port)) as s:
            s.sendall(payload)
            assert recv_n(s, len(payload)) == payload
    assert statistics.pstdev(rtt) > 0.004 and min(rtt) >= 0.0  # spread, never before it was sent


def test_bandwidth_limits_a_bulk_transfer(echo):
    n = 2_500_000  # 20 Mbit
    with EmulatedLink("127.0.0.1", echo, LinkSpec(mbit=40)) as link:
        with socket.create_connection(("127.0.0.1", link.port)) as s:
            t0 = time.monotonic()
            threading.Thread(target=s.sendall, args=(b"x" * n,), daemon=True).start()
            recv_n(s, n)
            took = time.monotonic() - t0
        assert link.stats["bytes"] == 2 * n
    assert 0.45 <= took < 0.9  # 20 Mbit at 40 Mbit/s = 0.5 s (echoed back through the same model)


def test_a_full_queue_pushes_back_on_the_sender():
    srv = socket.create_server(("127.0.0.1", 0))  # a target that never reads
    with EmulatedLink("127.0.0.1", srv.getsockname()[1], LinkSpec(mbit=1, queue_bytes=64 * 1024)) as link:
        s = socket.create_connection(("127.0.0.1", link.port))
        s.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                sent += s.send(b"y" * 65536)
            except BlockingIOError:
                time.sleep(0.01)
        # kernel buffers on both hops plus the 64 kB queue: without the bound it would take it all
        assert sent < 16 * 2**20
        s.close()
    srv.close()


def test_bad_link_settings_are_named():
    with pytest.raises(ValueError, match="delay_ms"):
        LinkSpec(delay_ms=-1)
    with pytest.raises(ValueError, match="mbit"):
        LinkSpec(mbit=0)
    with pytest.raises(ValueError, match="unknown key"):
        LinkSpec.from_config({"delay": 50})
    assert LinkSpec.from_config({"delay_ms": 50, "mbit": 20}) == LinkSpec(delay_ms=50, mbit=20)
    assert LinkSpec.from_config(None) is None


def _tagged_server(srv: socket.socket, tag: bytes) -> None:
    def answer(conn):
        with conn:
            conn.sendall(tag + conn.recv(64))

    serve(srv, answer)


def test_neighbour_ports_travel_the_link_to_the_targets_neighbours():
    for _ in range(50):  # a target port whose neighbour at +2 is free too
        public = socket.create_server(("127.0.0.1", 0))
        try:
            control = socket.create_server(("127.0.0.1", public.getsockname()[1] + 2))
            break
        except OSError:
            public.close()
    target = public.getsockname()[1]
    _tagged_server(public, b"public:")
    _tagged_server(control, b"control:")
    try:
        with EmulatedLink("127.0.0.1", target, LinkSpec(delay_ms=30), offsets=(2,)) as link:
            for k, tag in ((0, b"public:"), (2, b"control:")):
                with socket.create_connection(("127.0.0.1", link.port + k)) as s:
                    t0 = time.monotonic()
                    s.sendall(b"x")
                    assert recv_n(s, len(tag) + 1) == tag + b"x"
                    assert time.monotonic() - t0 >= 0.055  # both ways delayed, on both ports
            assert link.stats["connections"] == 2
    finally:
        public.close()
        control.close()
