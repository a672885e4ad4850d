"""The training side of the edge protocol: a DEALER socket to the daemon.

``hello`` goes to the daemon's public port; its ``welcome`` names the controller's own
socket (``control_offset`` from that port), and the client moves there (presenting its
session in a second ``hello``), so its commands never queue behind other clients' requests.

``EdgeClient.request`` sends a request with a fresh id and waits for the reply carrying
that id (late replies to earlier, abandoned requests are dropped). While waiting it
answers nothing and counts the daemon's heartbeats; a heartbeat thread pings the daemon
when the client has been quiet, so the daemon knows its controller is alive. Failed
security handshakes are reported from the socket monitor with the reason.
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from rlinf_user.edge.protocol import PROTOCOL_VERSION, Message, ProtocolError, decode, encode
from rlinf_user.edge.security import HANDSHAKE_FAILURES, HANDSHAKE_REFUSALS, AuthError, client_options

log = logging.getLogger(__name__)

STREAM_KEEP = 4096  # streamed observations kept unread (minutes of control); the oldest go


class EdgeTimeout(TimeoutError):
    """No reply from the edge daemon in time (network drop, daemon gone)."""


class EdgeRefused(RuntimeError):
    """The daemon answered with an error message; ``code`` says which kind."""

    def __init__(self, code: str, message: str):
        super().__init__(f"edge refused ({code}): {message}")
        self.code = code


class EdgeClient:
    def __init__(self, host: str, port: int = 5555, *, server_public_key: str | None = None,
                 client_secret_key: str | None = None, timeout_s: float = 5.0,
                 heartbeat_s: float = 0.5, client_name: str = "rlinf-user"):  # fmt: skip
        self.host, self.port = host, port
        self.timeout_s, self.heartbeat_s = timeout_s, heartbeat_s
        self.client_name = client_name
        self.session = secrets.token_hex(16)  # a bearer secret: never log it
        self._opts = client_options(server_public_key, client_secret_key)
        self.ctx = zmq.Context()
        self._lock = threading.RLock()
        self._rid = 0
        self._last_sent = 0.0
        self.last_heard = 0.0
        self.auth_failure: str | None = None
        self.cut_handshakes = 0  # handshakes dropped mid-way since the last reply (libzmq retries them)
        self.spec: dict[str, Any] | None = None
        self.on_control = False  # talking on the controller's own socket
        self._stop = threading.Event()
        # observed chunks: their per-tick obs (and errors) wait here, in arrival order
        self.stream_rids: set[int] = set()
        self.streamed: collections.deque[Message] = collections.deque(maxlen=STREAM_KEEP)
        self._open()
        self._beat = threading.Thread(target=self._heartbeat_loop, daemon=True, name="edge-heartbeat")
        self._beat.start()

    # -- sockets -------------------------------------------------------------------
    def _open(self, port: int | None = None) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        for opt, value in self._opts.items():
            sock.setsockopt(opt, value)
        self.monitor = sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        )  # fmt: skip
        sock.connect(f"tcp://{self.host}:{port or self.port}")
        self.sock = sock

    def reconnect(self, port: int | None = None) -> None:
        """Drop the socket (and anything queued on it) and connect afresh (to the public
        port unless ``port`` is given)."""
        with self._lock:
            self.sock.disable_monitor()
            self.monitor.close(0)
            self.sock.close(0)
            self._open(port)
            self.on_control = port is not None

    def _check_monitor(self, timed_out: bool = False) -> None:
        """Raise AuthError on a refused handshake; a handshake cut short counts as one only
        when it kept the request from an answer (``timed_out``)."""
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            why = HANDSHAKE_FAILURES.get(event["event"])
            if event["event"] in HANDSHAKE_REFUSALS:
                self.auth_failure = why
            elif why:
                self.cut_handshakes += 1
                log.debug("handshake with %s:%s cut short (errno %s); libzmq retries", self.host, self.port,
                          event.get("value"))  # fmt: skip
        if timed_out and self.cut_handshakes and not self.auth_failure:
            self.auth_failure = f"security handshake failed ({self.cut_handshakes} attempts cut short)"
        if self.auth_failure:
            raise AuthError(
                f"the edge daemon at {self.host}:{self.port} refused this client: "
                f"{self.auth_failure}. Check edge.server_public_key / edge.client_secret_key "
                "and that the client's public key is in the daemon's authorized keys"
            )

    # -- requests ------------------------------------------------------------------
    def send(self, kind: str, body: dict | None = None, arrays: dict | None = None) -> int:
        """Queue a request. Never blocks longer than the client timeout: a DEALER whose
        connection is down (refused handshake, daemon gone) has nowhere to queue it."""
        with self._lock:
            self._rid += 1
            frames = encode(Message(kind, self._rid, body or {}, arrays or {}))
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:
                    self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                    break
                except zmq.Again:
                    timed_out = time.monotonic() > deadline
                    self._check_monitor(timed_out)
                    if timed_out:
                        raise EdgeTimeout(
                            f"cannot send to the edge daemon at {self.host}:{self.port}: no connection "
                            f"within {self.timeout_s:.1f} s"
                        ) from None
                    self.sock.poll(50, zmq.POLLOUT)
            self._last_sent = time.monotonic()
            return self._rid

    def wait(self, rid: int, timeout_s: float | None = None) -> Message:
        """The reply to request ``rid``; raises EdgeRefused on an error reply."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        with self._lock:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._check_monitor(timed_out=True)
                    raise EdgeTimeout(
                        f"no reply from the edge daemon at {self.host}:{self.port} within "
                        f"{timeout_s or self.timeout_s:.1f} s"
                    )
                if time.monotonic() - self._last_sent > self.heartbeat_s:
                    # a long request (homing) must not look like a dead client to the daemon
                    try:
                        self.sock.send_multipart(encode(Message("ping", 0)), flags=zmq.NOBLOCK)
                    except zmq.Again:
                        pass  # no connection right now; the deadline still applies
                    self._last_sent = time.monotonic()
                if not self.sock.poll(min(remaining, self.heartbeat_s / 2, 0.1) * 1e3):
                    self._check_monitor()
                    continue
                frames = self.sock.recv_multipart(copy=False)
                try:
                    msg = decode([f.buffer for f in frames])
                except ProtocolError as err:
                    raise EdgeRefused(err.code, f"undecodable reply from the edge: {err}") from err
                self.last_heard, self.cut_handshakes = time.monotonic(), 0
                if msg.rid in self.stream_rids and (msg.rid != rid or msg.body.get("stream")):
                    self.streamed.append(msg)
                    continue
                if msg.kind == "error" and msg.rid in (rid, 0):
                    raise EdgeRefused(msg.body.get("code", "?"), msg.body.get("message", ""))
                if msg.rid == rid:
                    return msg
                if msg.kind == "telemetry" and msg.rid == 0:
                    log.info("edge event: %s", msg.body)
                # else: a heartbeat or a late reply to an abandoned request

    def request(self, kind: str, body: dict | None = None, arrays: dict | None = None,
                timeout_s: float | None = None) -> Message:  # fmt: skip
        with self._lock:
            return self.wait(self.send(kind, body, arrays), timeout_s)

    def hello(self, timeout_s: float | None = None) -> dict[str, Any]:
        body = {"client": self.client_name, "session": self.session, "protocol": PROTOCOL_VERSION}
        with self._lock:
            if self.on_control:  # still (or again) in control with this session: nothing moves
                try:
                    self.spec = dict(self.request("hello", body, timeout_s=timeout_s).body)
                    return self.spec
                except EdgeRefused as err:
                    if err.code != "not_controller":
                        raise
                self.reconnect()  # control is asked for on the public socket
            try:
                msg = self.request("hello", body, timeout_s=timeout_s)
                offset = msg.body.get("control_offset")
                if isinstance(offset, int):  # the controller's own socket: present the session there
                    self._move_to_control(self.port + offset, body, timeout_s)
            except AuthError:
                self.close(say_bye=False)  # refused for good: release the sockets and the thread
                raise
        self.spec = dict(msg.body)
        return self.spec

    def _move_to_control(self, port: int, body: dict[str, Any], timeout_s: float | None) -> None:
        """Present the session on the controller's socket and send everything there from now
        on; if it cannot be reached (a firewall that opens only the public port), stay on the
        public socket, which still serves the controller. The public connection keeps beating
        while the controller's socket is tried, so the daemon never sees the session go silent
        (a probe longer than its ``peer_timeout_s`` would otherwise lose control); and a reply
        that comes too late does no harm: the daemon takes the session's commands from either
        of its two connections."""
        public, public_monitor = self.sock, self.monitor
        self._open(port)
        deadline = time.monotonic() + min(timeout_s or self.timeout_s, 3.0)
        rid = self.send("hello", body)
        try:
            while True:
                try:
                    self.wait(rid, timeout_s=min(self.heartbeat_s / 2, max(deadline - time.monotonic(), 0.0)))
                    break
                except EdgeTimeout:
                    if time.monotonic() >= deadline:
                        raise
                    try:
                        public.send_multipart(encode(Message("ping", 0)), flags=zmq.NOBLOCK)
                    except zmq.Again:
                        pass
        except (EdgeTimeout, EdgeRefused, AuthError) as err:
            log.warning("the edge daemon's controller socket :%d is unreachable (%s); commands go "
                        "through its public port, behind other clients' requests", port, err)  # fmt: skip
            self.sock.disable_monitor()
            self.monitor.close(0)
            self.sock.close(0)
            self.sock, self.monitor, self.auth_failure = public, public_monitor, None
            self._last_sent = time.monotonic()
            return
        public.disable_monitor()
        public_monitor.close(0)
        public.close(0)
        self.on_control = True

    def act(self, action: np.ndarray, timeout_s: float | None = None) -> Message:
        return self.request("act", arrays={"action": np.asarray(action, np.float32)},
                            timeout_s=timeout_s)  # fmt: skip

    def chunk(self, actions: np.ndarray, start_tick: int | None = None, blend: int = 0,
              timeout_s: float | None = None, observe: bool = False) -> Message:  # fmt: skip
        """Schedule ``actions`` (H, 7) from the tick after ``start_tick`` (the tick of the
        observation they were computed from; None: the next tick). The ack says how many
        were queued and how many were already late. With ``observe`` every tick's
        observation comes back while the schedule lasts: read them with :meth:`next_streamed`."""
        body = {"blend": int(blend)} if start_tick is None else {"start_tick": int(start_tick), "blend": int(blend)}
        if not observe:
            return self.request("chunk", body, arrays={"actions": np.asarray(actions, np.float32)}, timeout_s=timeout_s)
        body["observe"] = True
        with self._lock:
            rid = self.send("chunk", body, arrays={"actions": np.asarray(actions, np.float32)})
            # the old schedule's observations up to the switch are still on their way
            self.stream_rids = {max(self.stream_rids, default=rid), rid}
            return self.wait(rid, timeout_s)

    def next_streamed(self, timeout_s: float | None = None) -> Message:
        """The next observation of an observed chunk (``chunk(..., observe=True)``), in
        tick order; raises EdgeRefused on the schedule's error (an unsafe action) and
        EdgeTimeout when none came in time."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        with self._lock:
            while not self.streamed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EdgeTimeout(f"no streamed observation from the edge within {timeout_s or self.timeout_s:.1f} s")
                try:  # waiting on a request nobody answers: every message read is routed
                    self.wait(-1, min(remaining, 0.05))
                except EdgeTimeout:
                    pass
            msg = self.streamed.popleft()
        if msg.kind == "error":
            raise EdgeRefused(msg.body.get("code", "?"), msg.body.get("message", ""))
        return msg

    def end_stream(self) -> None:
        """Forget observed chunks (a reset or a single action replaced the schedule)."""
        with self._lock:
            self.stream_rids = set()
            self.streamed.clear()

    def reset(self, seed: int | None = None, timeout_s: float = 60.0, home: bool = True) -> Message:
        return self.request("reset", {"seed": seed, "options": {"home": home}}, timeout_s=timeout_s)

    def telemetry(self) -> dict[str, Any]:
        return dict(self.request("telemetry").body)

    # -- heartbeats ----------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s / 2):
            if time.monotonic() - self._last_sent < self.heartbeat_s:
                continue
            if not self._lock.acquire(timeout=0.01):
                continue  # a request is in flight: that is a heartbeat already
            try:
                self.sock.send_multipart(encode(Message("ping", 0)), flags=zmq.NOBLOCK)
                self._last_sent = time.monotonic()
                while self.sock.poll(0):
                    frames = self.sock.recv_multipart()
                    try:
                        msg = decode(frames)
                    except ProtocolError:
                        continue
                    self.last_heard = time.monotonic()
                    if msg.rid in self.stream_rids:  # read while the caller computes: kept
                        self.streamed.append(msg)
                    elif msg.kind == "error":
                        log.warning("edge: %s", msg.body.get("message"))
            except zmq.ZMQError:
                pass
            finally:
                self._lock.release()

    def close(self, say_bye: bool = True) -> None:
        if self._stop.is_set():
            return  # already closed
        self._stop.set()
        self._beat.join(1)
        with self._lock:
            if say_bye:
                try:
                    self.sock.send_multipart(encode(Message("bye", 0)), flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
            self.sock.disable_monitor()
            self.monitor.close(0)
            self.sock.close(200 if say_bye else 0)
        self.ctx.term()
