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
)


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
