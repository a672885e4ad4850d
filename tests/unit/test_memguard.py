"""The ingress guard's attribution, in-process over real TCP sockets: a connection whose
received bytes the process holds on to is cut at any rate; a connection that only talks
while the process grows on its own is not."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from rlinf_user.edge.memguard import IngressGuard

MB = 2**20


class Server:
    """Accepts connections on a real port; ``hoard`` keeps every byte received (as libzmq
    keeps the frames of an unfinished message), else bytes are read and dropped."""

    def __init__(self, hoard: bool):
        self.hoard, self.held, self.closed_by_peer = hoard, [], threading.Event()
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen()
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.lsock.accept()
        with conn:
            while True:
                try:
                    data = conn.recv(1 << 20)
                except OSError:
                    data = b""
                if not data:
                    self.closed_by_peer.set()
                    return
                if self.hoard:
                    self.held.append(data)


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


@pytest.fixture
def guard_for():
    guards = []

    def make(port: int) -> IngressGuard:
        g = IngressGuard(32 * MB, port)
        g.start()
        guards.append(g)
        time.sleep(0.3)  # a few samples of the quiet process
        return g

    yield make
    for g in guards:
        g.stop()


@pytest.mark.parametrize("mb_per_s", [400, 25])
def test_a_connection_whose_bytes_the_process_holds_is_cut_at_any_rate(guard_for, mb_per_s):
    srv = Server(hoard=True)
    guard = guard_for(srv.port)
    sent = _send(srv.port, 200, mb_per_s)
    assert sent < 200 and guard.cut == 1
    assert srv.closed_by_peer.wait(5)
    assert sum(map(len, srv.held)) < 200 * MB


def test_a_talking_client_is_not_cut_when_the_process_grows_on_its_own(guard_for):
    srv = Server(hoard=False)
    guard = guard_for(srv.port)
    start = guard.baseline
    own: list[bytes] = []
    sender = threading.Thread(target=_send, args=(srv.port, 30, 10))  # 30 MB read and dropped
    sender.start()
    for _ in range(24):  # 96 MB of the process's own, over the same 3 s
        own.append(b"\x02" * (4 * MB))
        time.sleep(0.125)
    sender.join()
    time.sleep(0.1)
    assert guard.cut == 0
    assert guard.baseline - start > 32 * MB  # the growth was seen, and taken as the process's own
    assert len(own) == 24
