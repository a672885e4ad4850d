"""A client whose CURVE handshake is cut short (as the daemon's ingress guard does to pending
connections under a flood of half-open ones) retries and gets its answer; only a refusal, or
cut handshakes that keep it from any answer, are an AuthError."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
import zmq

from rlinf_user.edge.client import EdgeClient
from rlinf_user.edge.protocol import Message, decode, encode
from rlinf_user.edge.security import AuthError, keygen


def _cutter(port: int, until: threading.Event) -> threading.Thread:
    """A TCP listener that accepts each connection and closes it at once: every handshake cut."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    listener.settimeout(0.05)

    def run():
        try:
            while not until.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
        finally:
            listener.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _client_of_a_cutter(tmp_path, timeout_s: float):
    """A CURVE client of a port whose every connection is cut; ``stop()`` ends the cutting."""
    keys = keygen(tmp_path / "keys")
    port = _free_port()
    stop_cutting = threading.Event()
    cutter = _cutter(port, stop_cutting)
    client = EdgeClient("127.0.0.1", port, server_public_key=str(keys["edge_public"]),
                        client_secret_key=str(keys["client_secret"]), timeout_s=timeout_s)  # fmt: skip

    def stop():
        stop_cutting.set()
        cutter.join()

    try:
        yield client, keys, port, stop
    finally:
        stop()
        client.close(say_bye=False)


def test_a_handshake_cut_short_is_retried_and_the_request_answered(tmp_path):
    with _client_of_a_cutter(tmp_path, timeout_s=5.0) as (client, keys, port, stop_cutting):
        rid = client.send("ping")
        deadline = time.monotonic() + 5.0
        while client.cut_handshakes == 0 and time.monotonic() < deadline:
            client._check_monitor()  # must not raise: a cut handshake is not a refusal
            time.sleep(0.02)
        assert client.cut_handshakes >= 1
        stop_cutting()
        server = zmq.Context.instance().socket(zmq.ROUTER)
        server.linger = 0
        server.curve_server = True
        server.curve_secretkey = zmq.auth.load_certificate(str(keys["edge_secret"]))[1]
        server.bind(f"tcp://127.0.0.1:{port}")
        try:
            assert server.poll(5000), "the client never reconnected"
            ident, *frames = server.recv_multipart()
            msg = decode(frames)
            server.send_multipart([ident, *encode(Message("pong", msg.rid))])
            assert client.wait(rid, timeout_s=5.0).kind == "pong"
            assert client.cut_handshakes == 0  # an answer clears the count
        finally:
            server.close(0)


def test_cut_handshakes_that_keep_every_answer_away_are_an_auth_error(tmp_path):
    # 3 s: time for libzmq's first connection and its cut on a busy machine (1 s timed out
    # before any cut, a TimeoutError, with a training run beside the test)
    with _client_of_a_cutter(tmp_path, timeout_s=3.0) as (client, *_):
        with pytest.raises(AuthError, match="cut short"):
            client.request("ping", timeout_s=3.0)
