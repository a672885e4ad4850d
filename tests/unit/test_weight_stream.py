"""The learner's weight server and a worker's client over real sockets: versions served
consistently, pinned buffers never overwritten, strangers and malformed frames refused."""

import socket
import struct

import pytest
import torch

from rlinf_user.runtime.weights.stream import WeightServer, WeightStreamClient


@pytest.fixture
def server():
    s = WeightServer(bind_host="127.0.0.1", advertise_host="127.0.0.1")
    yield s
    s.close()


def test_client_gets_only_tensors_newer_than_it_holds(server):
    w, b, frozen = torch.randn(64, 32), torch.randn(32), torch.randn(8, 8)
    server.stage(0, {"w": w, "b": b, "frozen": frozen})
    client = WeightStreamClient()
    version, got = client.fetch(server.endpoint(), -1)
    assert version == 0 and set(got) == {"w", "b", "frozen"} and torch.equal(got["w"], w)
    server.stage(1, {"w": w * 2})
    version, got = client.fetch(server.endpoint(), 0)
    assert version == 1 and set(got) == {"w"} and torch.equal(got["w"], w * 2)
    assert client.fetch(server.endpoint(), 1) == (1, {})  # nothing newer
    with pytest.raises(ValueError, match="not newer"):
        server.stage(1, {"w": w})
    client.close()


def test_a_pinned_buffer_is_not_overwritten_by_later_versions(server):
    server.stage(0, {"w": torch.ones(1000)})
    reading = server._current["w"]
    reading.pins += 1  # a worker is still receiving v0
    server.stage(1, {"w": torch.full((1000,), 2.0)})
    server.stage(2, {"w": torch.full((1000,), 3.0)})
    assert (reading.data == 1).all() and len(server._pool["w"]) == 3
    reading.pins -= 1
    server.stage(3, {"w": torch.full((1000,), 4.0)})  # now reusable: no new buffer
    assert len(server._pool["w"]) == 3
    _, got = WeightStreamClient().fetch(server.endpoint(), -1)
    assert (got["w"] == 4).all()


def test_a_worker_asking_mid_staging_gets_each_block_once_staged(server):
    """Staging goes block by block and the server sends what is staged: a request that
    arrives before the copies are done still gets the whole version, byte for byte."""
    import threading

    from rlinf_user.runtime.weights import stream as weight_stream

    big = torch.randn(3 * weight_stream.BLOCK // 4 + 123)  # fp32: 3 blocks and a bit
    half = torch.randn(7, 5).to(torch.bfloat16)
    tensors = {"big": big, "half": half}
    server.begin(0, tensors)  # announced, nothing staged yet
    result = {}
    t = threading.Thread(target=lambda: result.update(got=WeightStreamClient().fetch(server.endpoint(), -1)))
    t.start()
    t.join(0.3)
    assert t.is_alive()  # waiting for the first block
    server.fill(tensors)
    t.join(10)
    version, got = result["got"]
    assert version == 0 and torch.equal(got["big"], big)
    assert torch.equal(got["half"].view(torch.bfloat16), half)


def hung_up(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:  # closed with our bytes unread
        return True
    finally:
        sock.close()


def test_wrong_token_and_malformed_frames_are_refused(server):
    server.stage(0, {"w": torch.ones(4)})
    bad = dict(server.endpoint(), token="0" * 32)
    with pytest.raises(ConnectionError, match="wrong token"):
        WeightStreamClient().fetch(bad, -1)
    raw = socket.create_connection((server.host, server.port), timeout=5)
    raw.sendall(struct.pack("<I", 2**31) + b"x")  # an absurd length: the server hangs up
    assert hung_up(raw)
    raw = socket.create_connection((server.host, server.port), timeout=5)
    raw.sendall(struct.pack("<I", 3) + b"{{{")
    assert hung_up(raw)
    version, got = WeightStreamClient().fetch(server.endpoint(), -1)  # still serving everyone else
    assert version == 0 and torch.equal(got["w"], torch.ones(4))


def test_a_server_gone_mid_run_raises_a_connection_error(server):
    server.stage(0, {"w": torch.ones(4)})
    client = WeightStreamClient(timeout_s=5)
    client.fetch(server.endpoint(), -1)
    server.close()
    with pytest.raises((ConnectionError, OSError)):
        client.fetch(server.endpoint(), 0)


def test_a_worker_that_stops_reading_is_dropped_and_its_pins_released(server, monkeypatch):
    import time

    from rlinf_user.runtime.weights import stream as weight_stream

    monkeypatch.setattr(weight_stream, "SEND_TIMEOUT_S", 0.5)
    server.stage(0, {"w": torch.zeros(16 * 2**20)})  # 64 MB: far more than the socket buffers hold
    raw = socket.create_connection((server.host, server.port), timeout=5)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    for frame in ({"token": server.token}, {"newer_than": -1}):
        weight_stream._send_frame(raw, frame)
    slot = server._current["w"]
    deadline = time.monotonic() + 10
    while slot.pins == 0 and time.monotonic() < deadline:  # the request arrived
        time.sleep(0.01)
    assert slot.pins == 1
    while slot.pins and time.monotonic() < deadline:  # ... and never read: dropped after the timeout
        time.sleep(0.05)
    assert slot.pins == 0
    raw.close()
    version, got = WeightStreamClient().fetch(server.endpoint(), -1)  # others are still served
    assert version == 0 and got["w"].shape == (16 * 2**20,)
