"""The edge wire format: a msgpack header frame followed by raw array frames.

A message is a ZMQ multipart message::

    frame 0   msgpack map  {"v": PROTOCOL_VERSION, "k": kind, "id": request id,
                            "b": body (msgpack-able map), "a": [[name, dtype, shape], ...]}
    frame 1.. one raw C-contiguous buffer per entry of "a", in order

Nothing is ever unpickled: the header is msgpack holding only maps, lists, strings,
bytes, ints, floats, booleans and nil (every ext type, msgpack's Timestamp included, is
refused; nesting is at most ``MAX_DEPTH`` deep), ``v`` must be the integer version (not
``true`` or ``1.0``), arrays are rebuilt with ``numpy.frombuffer`` from a whitelisted
dtype and a shape whose byte size must match the frame exactly. Request bodies are checked
per kind (:func:`validate_request`) before anything acts on them. Every limit breach raises :class:`ProtocolError` naming it, so a
malformed message is answered with an error and never reaches the robot.

Kinds (cloud -> edge): ``hello``, ``reset``, ``act``, ``chunk``, ``hold``, ``stop``, ``ping``,
``telemetry``, ``bye``. A ``chunk`` carries ``actions`` (H, 7) that the control loop runs one
per tick (``start_tick``: the tick of the observation it was computed from; ``blend``:
ticks over which it is blended into the chunk it replaces; ``observe``: stream every
tick's observation to the sender while the schedule lasts). (edge -> cloud): ``welcome``, ``obs``, ``ack``, ``pong``,
``telemetry``, ``error``. The stream socket carries ``state`` and ``frame`` messages.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

REQUESTS = ("hello", "reset", "act", "chunk", "hold", "stop", "ping", "telemetry", "bye")
REPLIES = ("welcome", "obs", "ack", "pong", "telemetry", "error")
STREAMS = ("state", "frame")
KINDS = frozenset(REQUESTS + REPLIES + STREAMS)

DTYPES = frozenset({"uint8", "int32", "int64", "float32", "float64", "bool"})
MAX_HEADER_BYTES = 64 * 1024
MAX_ARRAYS = 16
MAX_NDIM = 4
MAX_DEPTH = 16
MAX_FRAMES = 1 + MAX_ARRAYS
DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # a whole message; a 640x480 RGB frame is 0.9 MB
MAX_CHUNK = 256  # actions in one chunk (25.6 s at 10 Hz)


class ProtocolError(ValueError):
    """A message that breaks the wire format; ``code`` is a stable short name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class VersionError(ProtocolError):
    def __init__(self, got: Any):
        super().__init__(
            "version",
            f"protocol version {got!r} is not supported (this side speaks {PROTOCOL_VERSION}); "
            "install the same rlinf-user version on the robot PC and the training machine",
        )


@dataclasses.dataclass
class Message:
    kind: str
    rid: int = 0
    body: dict[str, Any] = dataclasses.field(default_factory=dict)
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def encode(msg: Message) -> list[Any]:
    """Message -> list of frames (bytes header + zero-copy array buffers)."""
    if msg.kind not in KINDS:
        raise ProtocolError("kind", f"unknown message kind {msg.kind!r}")
    if len(msg.arrays) > MAX_ARRAYS:
        raise ProtocolError("arrays", f"{len(msg.arrays)} arrays > limit {MAX_ARRAYS}")
    specs, buffers = [], []
    for name, value in msg.arrays.items():
        arr = np.ascontiguousarray(value)
        if arr.dtype.name not in DTYPES:
            raise ProtocolError("dtype", f"array {name!r}: dtype {arr.dtype} not allowed")
        specs.append([name, arr.dtype.name, list(arr.shape)])
        buffers.append(memoryview(arr).cast("B") if arr.size else b"")
    header = msgpack.packb(
        {"v": PROTOCOL_VERSION, "k": msg.kind, "id": int(msg.rid), "b": msg.body, "a": specs},
        use_bin_type=True,
    )
    if len(header) > MAX_HEADER_BYTES:
        raise ProtocolError("header", f"header of {len(header)} bytes > {MAX_HEADER_BYTES}")
    return [header, *buffers]


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ProtocolError("header", f"msgpack extension type {code} is not allowed")


def peek_header(frame: bytes | memoryview) -> dict[str, Any]:
    """Unpack and sanity-check a header frame (no arrays)."""
    if len(frame) > MAX_HEADER_BYTES:
        raise ProtocolError("header", f"header of {len(frame)} bytes > {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(bytes(frame), raw=False, strict_map_key=True, ext_hook=_refuse_ext)
    except ProtocolError:
        raise
    except Exception as err:  # noqa: BLE001 - msgpack raises several unrelated types
        raise ProtocolError("header", f"header is not valid msgpack: {err}") from err
    if not isinstance(header, dict):
        raise ProtocolError("header", "header must be a msgpack map")
    _check_plain(header, 0)
    return header


_SCALARS = (str, bytes, int, float, bool, type(None))


def _check_plain(value: Any, depth: int) -> None:
    """Only plain msgpack values (no Timestamp or other ext objects), bounded nesting."""
    if depth > MAX_DEPTH:
        raise ProtocolError("header", f"header nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(k, depth + 1)
            _check_plain(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_plain(v, depth + 1)
    elif not isinstance(value, _SCALARS):
        raise ProtocolError("header", f"msgpack value of type {type(value).__name__} is not allowed")


def decode(frames: Sequence[Any], max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Frames -> Message, validating version, kind, sizes, dtypes and shapes."""
    if not frames:
        raise ProtocolError("empty", "empty message")
    if len(frames) > MAX_FRAMES:
        raise ProtocolError("frames", f"{len(frames)} frames > limit {MAX_FRAMES}")
    total = sum(len(f) for f in frames)
    if total > max_bytes:
        raise ProtocolError("size", f"message of {total} bytes exceeds the limit {max_bytes}")
    header = peek_header(frames[0])
    version = header.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise VersionError(version)
    kind, rid, body, specs = header.get("k"), header.get("id", 0), header.get("b", {}), header.get("a", [])
    if not isinstance(kind, str) or kind not in KINDS:
        raise ProtocolError("kind", f"unknown message kind {kind!r}")
    if not isinstance(rid, int) or isinstance(rid, bool) or rid < 0:
        raise ProtocolError("id", f"request id must be a non-negative int, got {rid!r}")
    if not isinstance(body, dict):
        raise ProtocolError("body", "body must be a map")
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise ProtocolError("arrays", "array table must be a list of at most "
                            f"{MAX_ARRAYS} entries")  # fmt: skip
    if len(specs) != len(frames) - 1:
        raise ProtocolError(
            "frames", f"header announces {len(specs)} arrays but {len(frames) - 1} frames follow"
        )
    arrays: dict[str, np.ndarray] = {}
    for spec, frame in zip(specs, frames[1:]):
        name, array = _array(spec, frame)
        if name in arrays:  # never last-wins: which one would the robot have acted on?
            raise ProtocolError("arrays", f"array {name!r} appears twice in one message")
        arrays[name] = array
    return Message(kind, rid, body, arrays)


def _array(spec: Any, frame: Any) -> tuple[str, np.ndarray]:
    if not (isinstance(spec, list) and len(spec) == 3):
        raise ProtocolError("arrays", f"bad array spec {spec!r}")
    name, dtype, shape = spec
    if not isinstance(name, str) or dtype not in DTYPES:
        raise ProtocolError("dtype", f"array {name!r}: dtype {dtype!r} not allowed")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
    ):
        raise ProtocolError("shape", f"array {name!r}: bad shape {shape!r}")
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes != len(frame):
        raise ProtocolError(
            "shape", f"array {name!r}: {dtype}{shape} needs {nbytes} bytes, frame has {len(frame)}"
        )
    return name, np.frombuffer(frame, dtype=dtype).reshape(shape)


def request_id(frames: Sequence[Any]) -> int:
    """Best-effort request id of a rejected message, so the client can match the error."""
    try:
        rid = peek_header(frames[0]).get("id", 0)
        return rid if isinstance(rid, int) and not isinstance(rid, bool) and rid >= 0 else 0
    except Exception:  # noqa: BLE001 - whatever the frames hold, the answer is an int
        return 0


RESET_OPTIONS = {"home": bool}


def validate_request(msg: Message) -> None:
    """Per-kind checks of a request's body, so a malformed one never reaches the robot."""
    body = msg.body
    if msg.kind == "reset":
        seed = body.get("seed")
        if seed is not None and (type(seed) is not int or not 0 <= seed < 2**63):
            raise ProtocolError("body", f"reset seed must be nil or an int in [0, 2^63), got {seed!r}")
        options = body.get("options")
        if options is None:
            return
        if not isinstance(options, dict):
            raise ProtocolError("body", f"reset options must be a map, got {type(options).__name__}")
        for key, value in options.items():
            want = RESET_OPTIONS.get(key)
            if want is None:
                raise ProtocolError("body", f"unknown reset option {key!r} (known: {sorted(RESET_OPTIONS)})")
            if type(value) is not want:
                raise ProtocolError("body", f"reset option {key!r} must be {want.__name__}, got {value!r}")
    elif msg.kind == "chunk":
        validate_chunk(msg)
    elif msg.kind == "hello":
        session = body.get("session", "")
        if not isinstance(session, str) or len(session) > 128:
            raise ProtocolError("body", "hello session must be a string of at most 128 characters")


def validate_chunk(msg: Message) -> None:
    """A chunk is refused whole (nothing queued, nothing moves) unless every action is a
    finite 7-vector and its timing fields are sane."""
    actions = msg.arrays.get("actions")
    if actions is None:
        raise ProtocolError("body", "chunk needs an 'actions' array of shape (H, 7)")
    if actions.ndim != 2 or actions.shape[1] != 7 or not 1 <= actions.shape[0] <= MAX_CHUNK:
        raise ProtocolError("body", f"chunk actions must be (H, 7) with 1 <= H <= {MAX_CHUNK}, got {actions.shape}")
    if actions.dtype.kind != "f":
        raise ProtocolError("body", f"chunk actions must be floats, got {actions.dtype}")
    bad = np.flatnonzero(~np.isfinite(actions).all(axis=1))
    if bad.size:
        raise ProtocolError("unsafe", f"chunk action {int(bad[0])} is not finite: the whole chunk refused, nothing moves")
    start = msg.body.get("start_tick")
    if start is not None and (type(start) is not int or start < 0):
        raise ProtocolError("body", f"chunk start_tick must be nil or an int >= 0, got {start!r}")
    blend = msg.body.get("blend", 0)
    if type(blend) is not int or not 0 <= blend <= MAX_CHUNK:
        raise ProtocolError("body", f"chunk blend must be an int in [0, {MAX_CHUNK}], got {blend!r}")
    if type(msg.body.get("observe", False)) is not bool:
        raise ProtocolError("body", f"chunk observe must be a bool, got {msg.body.get('observe')!r}")


def finite_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """Make a body msgpack-safe: numpy scalars -> Python, arrays -> lists."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, np.generic):
            value = value.item()
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, Mapping):
            value = finite_body(value)
        out[str(key)] = value
    return out


def error(rid: int, code: str, message: str) -> Message:
    return Message("error", rid, {"code": code, "message": message})
