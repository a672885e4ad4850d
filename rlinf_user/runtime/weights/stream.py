"""Direct TCP transport for policy weights: the learner serves, workers pull.

Ray's object store moves a version between nodes in small chunks through its raylets
(plus a copy into and out of each store); for a large model that costs most of the
link's bandwidth, and tens of milliseconds even for a small one. Here the learner process
runs a :class:`WeightServer`: ``publish`` copies the changed tensors into staging buffers
the server owns (reused from version to version, so their memory is warm), and a worker's
:class:`WeightStreamClient` asks for "everything newer than the version I hold" over one
persistent connection and receives each tensor straight into a buffer of its own with
``recv_into`` (no intermediate copy, the GIL released while the bytes move). Staging goes
in blocks of a few MB and the server sends each block as soon as it is staged, so staging
and sending overlap and a block is usually still in cache when the kernel copies it out.

A version is consistent: the server pins, at the moment a request arrives, the staged
buffer of every requested tensor; a later publish stages into other buffers and never
touches a pinned one. Every connection proves it knows the run's token (random, handed out
only through the Ray cluster's weight store) before anything is served.

Wire format (little-endian): a frame is ``u32 length`` + JSON. Client: ``{"token": ...}``
once, then ``{"newer_than": v}`` per request. Server: ``{"version": V, "tensors":
[[name, dtype, shape], ...]}`` followed by each tensor's raw bytes in that order, or
``{"error": "..."}``.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

_LEN = struct.Struct("<I")
MAX_FRAME = 64 * 2**20  # a header naming every tensor of a very large model fits easily
SEND_TIMEOUT_S = 120.0  # a worker that stops reading mid-version is dropped (and its pins released)


def _send_frame(sock: socket.socket, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


BLOCK = 4 * 2**20  # per send/recv call: large calls are slower through the kernel's copies


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        n = sock.recv_into(view[:BLOCK])
        if n == 0:
            raise ConnectionError("weight stream: connection closed mid-transfer")
        view = view[n:]


def _send_all(sock: socket.socket, view: memoryview) -> None:
    for i in range(0, view.nbytes, BLOCK):
        sock.sendall(view[i : i + BLOCK])


def _recv_frame(sock: socket.socket) -> dict[str, Any]:
    head = bytearray(_LEN.size)
    _recv_exact(sock, memoryview(head))
    (length,) = _LEN.unpack(head)
    if length > MAX_FRAME:
        raise ConnectionError(f"weight stream: frame of {length} bytes refused (limit {MAX_FRAME})")
    body = bytearray(length)
    _recv_exact(sock, memoryview(body))
    try:
        obj = json.loads(body)
    except ValueError as err:
        raise ConnectionError(f"weight stream: malformed frame ({err})") from None
    if not isinstance(obj, dict):
        raise ConnectionError("weight stream: a frame must be a JSON object")
    return obj


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor as a dtype numpy knows (bf16 travels as its int16 bits)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _as_bytes(arr: np.ndarray) -> memoryview:
    return memoryview(arr.reshape(-1).view(np.uint8))


@dataclass(eq=False)
class _Slot:
    data: np.ndarray
    version: int = -1
    filled: int = 0  # bytes of ``data`` staged for ``version`` so far
    pins: int = 0


class WeightServer:
    """Serves the learner's staged tensors (one thread per connected worker)."""

    def __init__(self, bind_host: str = "0.0.0.0", port: int = 0, advertise_host: str | None = None):
        self._sock = socket.create_server((bind_host, port), backlog=128)
        self.token = secrets.token_hex(16)
        self.port = self._sock.getsockname()[1]
        self.host = advertise_host or _node_address()
        self._cv = threading.Condition()
        self._current: dict[str, _Slot] = {}
        self._pool: dict[str, list[_Slot]] = {}
        self.version = -1
        self._closed = False
        self._conns: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="weight-server", daemon=True).start()

    def endpoint(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "token": self.token}

    # -- learner side ---------------------------------------------------------------------
    def stage(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        """Make ``version`` current (``tensors``: the ones it changes), then copy them
        into the staging buffers one by one; a worker already asking gets each tensor as
        soon as it is copied. Called on the learner's thread, holding its lock."""
        self.begin(version, tensors)
        self.fill(tensors)

    def begin(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        with self._cv:
            if version <= self.version:
                raise ValueError(f"weight version {version} is not newer than {self.version}")
            for name, t in tensors.items():
                self._current[name] = self._free_slot(name, _bits(t))
                self._current[name].version = version
                self._current[name].filled = 0
            self.version = version

    def fill(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, t in tensors.items():
            slot = self._current[name]
            src = _bits(t.detach())
            if src.device.type != "cpu" or not src.is_contiguous():  # one copy (device-to-host)
                torch.from_numpy(slot.data).copy_(src.reshape(slot.data.shape))
                self._staged(slot, slot.data.nbytes)
                continue
            dst = torch.from_numpy(slot.data.reshape(-1).view(np.uint8))
            src = src.reshape(-1).view(torch.uint8)
            for i in range(0, dst.numel(), BLOCK):
                dst[i : i + BLOCK].copy_(src[i : i + BLOCK])
                self._staged(slot, min(i + BLOCK, dst.numel()))

    def _staged(self, slot: _Slot, upto: int) -> None:
        with self._cv:
            slot.filled = upto
            self._cv.notify_all()

    def _free_slot(self, name: str, t: torch.Tensor) -> _Slot:
        dtype = torch.empty((), dtype=t.dtype).numpy().dtype
        shape = tuple(t.shape)
        pool = self._pool.setdefault(name, [])
        current = self._current.get(name)
        for slot in pool:
            if slot is not current and slot.pins == 0 and slot.data.shape == shape and slot.data.dtype == dtype:
                return slot
        slot = _Slot(np.empty(shape, dtype=dtype))
        pool.append(slot)
        pool[:] = [s for s in pool if s.data.shape == shape and s.data.dtype == dtype]  # a reshaped tensor
        return slot

    # -- serving --------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn, peer), name="weight-serve", daemon=True).start()

    def _serve(self, conn: socket.socket, peer) -> None:
        self._conns.add(conn)
        try:
            hello = _recv_frame(conn)
            if not hmac.compare_digest(str(hello.get("token", "")), self.token):
                log.warning("weight stream: %s did not present the run's token; closed", peer)
                _send_frame(conn, {"error": "wrong token"})
                return
            while not self._closed:
                req = _recv_frame(conn)
                newer_than = req.get("newer_than")
                if not isinstance(newer_than, int):
                    _send_frame(conn, {"error": "a request needs an integer 'newer_than'"})
                    return
                conn.settimeout(SEND_TIMEOUT_S)
                self._answer(conn, newer_than)
                conn.settimeout(None)  # idle between versions as long as it likes
        except (ConnectionError, OSError):
            pass  # the worker went away; its pins were released below
        finally:
            self._conns.discard(conn)
            conn.close()

    def _answer(self, conn: socket.socket, newer_than: int) -> None:
        with self._cv:
            items = [(n, s) for n, s in self._current.items() if s.version > newer_than]
            version = self.version
            for _, s in items:
                s.pins += 1
        try:
            _send_frame(
                conn, {"version": version, "tensors": [[n, s.data.dtype.str, list(s.data.shape)] for n, s in items]}
            )
            for i, (_, slot) in enumerate(items):
                self._send_slot(conn, slot)
                with self._cv:
                    slot.pins -= 1
                items[i] = (None, None)
        finally:
            with self._cv:
                for _, s in items:
                    if s is not None:
                        s.pins -= 1

    def _send_slot(self, conn: socket.socket, slot: _Slot) -> None:
        """Send a pinned slot's bytes, each block once it is staged."""
        view = _as_bytes(slot.data)
        sent = 0
        while sent < view.nbytes:
            with self._cv:
                self._cv.wait_for(lambda sent=sent: slot.filled > sent or self._closed)
                upto = slot.filled
            if self._closed:
                raise ConnectionError("weight server closed")
            _send_all(conn, view[sent:upto])
            sent = upto

    def close(self) -> None:
        self._closed = True
        with self._cv:
            self._cv.notify_all()
        try:
            self._sock.close()
        finally:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class WeightStreamClient:
    """Worker side: pulls from a :class:`WeightServer` into buffers of its own.

    ``fetch`` (run it on a background thread) returns ``(version, {name: tensor})``;
    the tensors are this client's receive buffers, valid until the next ``fetch``."""

    def __init__(self, timeout_s: float = 60.0, link=None):
        """``link`` (:class:`rlinf_user.netem.LinkSpec`): reach the server through an
        emulated link (tests, rehearsing a slow network)."""
        self.timeout_s = timeout_s
        self.link_spec = link
        self._link = None
        self._sock: socket.socket | None = None
        self._ep: tuple | None = None
        self.buffers: dict[str, torch.Tensor] = {}

    def _connect(self, ep: dict[str, Any]) -> socket.socket:
        key = (ep["host"], int(ep["port"]), ep["token"])
        if self._sock is not None and self._ep == key:
            return self._sock
        self.close()
        host, port = ep["host"], int(ep["port"])
        if self.link_spec is not None:
            from rlinf_user.netem import EmulatedLink

            self._link = EmulatedLink(host, port, self.link_spec)
            host, port = self._link.host, self._link.port
        sock = socket.create_connection((host, port), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send_frame(sock, {"token": ep["token"]})
        self._sock, self._ep = sock, key
        return sock

    def fetch(self, ep: dict[str, Any], newer_than: int) -> tuple[int, dict[str, torch.Tensor]]:
        try:
            sock = self._connect(ep)
            _send_frame(sock, {"newer_than": int(newer_than)})
            head = _recv_frame(sock)
            if "error" in head:
                raise ConnectionError(f"weight server refused: {head['error']}")
            got: dict[str, torch.Tensor] = {}
            for name, dtype, shape in head["tensors"]:
                buf = self._buffer(name, np.dtype(dtype), tuple(shape))
                _recv_exact(sock, _as_bytes(buf.numpy()))
                got[name] = buf
            return int(head["version"]), got
        except BaseException:
            self.close()  # a half-read stream cannot be resumed
            raise

    def _buffer(self, name: str, dtype: np.dtype, shape: tuple) -> torch.Tensor:
        buf = self.buffers.get(name)
        if buf is None or tuple(buf.shape) != shape or buf.numpy().dtype != dtype:
            buf = torch.from_numpy(np.empty(shape, dtype=dtype))
            self.buffers[name] = buf
        return buf

    def give_back(self, name: str, tensor: torch.Tensor) -> None:
        """After a swap: ``tensor`` (the module's previous storage) is the next buffer."""
        self.buffers[name] = tensor

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        if self._link is not None:
            self._link.close()
        self._sock, self._ep, self._link = None, None, None


def _node_address() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - fall back to the hostname
        pass
    return socket.gethostbyname(socket.gethostname())
