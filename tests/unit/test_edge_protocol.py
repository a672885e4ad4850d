"""The edge wire format: round trips, and every malformed shape refused with its code."""

from __future__ import annotations

import pickle

import msgpack
import numpy as np
import pytest

from rlinf_user.edge.protocol import (
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    VersionError,
    decode,
    encode,
    validate_request,
)


def _nested(depth: int):
    value: list = [1]
    for _ in range(depth):
        value = [value]
    return value


def _header(**kw):
    h = {"v": PROTOCOL_VERSION, "k": "act", "id": 7, "b": {}, "a": []}
    h.update(kw)
    return msgpack.packb(h)


def test_round_trip_keeps_arrays_byte_exact_and_body():
    img = np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8)
    msg = Message("obs", 42, {"stamp": 1.5, "info": {"a": [1, 2]}},
                  {"state": np.arange(17, dtype=np.float32), "image/wrist": img})  # fmt: skip
    frames = [bytes(f) for f in encode(msg)]
    out = decode(frames)
    assert (out.kind, out.rid, out.body) == ("obs", 42, msg.body)
    np.testing.assert_array_equal(out.arrays["image/wrist"], img)
    assert out.arrays["state"].dtype == np.float32 and out.arrays["state"][16] == 16


@pytest.mark.parametrize(
    "frames, code",
    [
        ([], "empty"),
        ([b"\xc1\xff garbage"], "header"),
        ([msgpack.packb([1, 2, 3])], "header"),
        ([pickle.dumps(np.zeros(3))], "header"),  # a pickle is never unpickled
        ([_header(k="launch_missiles")], "kind"),
        ([_header(id=-1)], "id"),
        ([_header(id="x")], "id"),
        ([_header(b=[1])], "body"),
        ([_header(a=[["action", "float32", [7]]])], "frames"),  # announced, not sent
        ([_header(a=[["action", "float32", [7]]]), b"\x00" * 27], "shape"),
        ([_header(a=[["action", "object", [7]]]), b"\x00" * 28], "dtype"),
        ([_header(a=[["action", "float32", [-7]]]), b""], "shape"),
        ([_header(a=[["a", "uint8", [1, 1, 1, 1, 1]]]), b"\x00"], "shape"),
        ([msgpack.packb({"v": 1, "k": "act", "id": 1, "b": {}, "a": []}) + b"x" * 70000], "header"),
        ([msgpack.packb({"v": 1, "k": "act", "id": 1, "b": {"x": msgpack.ExtType(1, b"")}, "a": []})], "header"),
        ([msgpack.packb({"v": 1, "k": "act", "id": 1, "b": {"t": msgpack.Timestamp(5)}, "a": []})], "header"),
        ([_header(v=True)], "version"),  # True == 1 in Python: refused all the same
        ([_header(v=1.0)], "version"),
        ([_header(k=["act"])], "kind"),  # unhashable: a clean refusal, not a TypeError
        ([_header(b={"x": _nested(20)})], "header"),  # nesting bound
        ([_header()] + [b""] * 17, "frames"),
        # one name twice: refused, not last-wins (which action would have moved the arm?)
        ([_header(a=[["action", "float32", [7]], ["action", "float32", [7]]]), b"\x00" * 28, b"\x01" * 28], "arrays"),
    ],
)
def test_malformed_messages_are_refused_with_a_code(frames, code):
    with pytest.raises(ProtocolError) as err:
        decode(frames)
    assert err.value.code == code, str(err.value)


def test_wrong_version_names_both_versions():
    with pytest.raises(VersionError, match=r"version 99 is not supported .* speaks 1"):
        decode([_header(v=99)])


def test_oversized_message_is_refused_before_parsing():
    big = np.zeros(2_000_000, dtype=np.uint8)
    frames = encode(Message("act", 1, {}, {"action": big}))
    with pytest.raises(ProtocolError) as err:
        decode(frames, max_bytes=1_000_000)
    assert err.value.code == "size"


def test_encode_refuses_object_arrays_and_unknown_kinds():
    with pytest.raises(ProtocolError):
        encode(Message("act", 1, {}, {"x": np.array([object()])}))
    with pytest.raises(ProtocolError):
        encode(Message("nope"))


@pytest.mark.parametrize(
    "body, ok",
    [
        ({"seed": 3, "options": {"home": False}}, True),
        ({"seed": None, "options": None}, True),
        ({}, True),
        ({"seed": -1}, False),
        ({"seed": True}, False),
        ({"seed": "3"}, False),
        ({"options": [1, 2]}, False),  # reached the backend as an AttributeError before
        ({"options": {"home": 1}}, False),
        ({"options": {"teleport": True}}, False),
    ],
)
def test_reset_bodies_are_checked_at_the_protocol_layer(body, ok):
    msg = decode(encode(Message("reset", 1, body)))
    if ok:
        validate_request(msg)
    else:
        with pytest.raises(ProtocolError) as err:
            validate_request(msg)
        assert err.value.code == "body"
