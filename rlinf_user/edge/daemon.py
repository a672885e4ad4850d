"""The edge daemon's network process: authentication, validation, cameras, forwarding.

Sockets (``tcp://<bind>:<port>``):

* ``port``   ROUTER: requests from the training side and their replies (``hello``,
  ``reset``, ``act``, ``hold``, ``stop``, ``ping``, ``telemetry``, ``bye``).
* ``port+1`` PUB: latest-value streams (``state`` every tick with a reply); publishers keep
  at most ``stream_hwm`` messages per subscriber so a slow subscriber only ever sees
  recent values.

One client controls the robot at a time (the one whose ``hello`` was accepted). Its
session id is a bearer secret: never echoed, compared in constant time, and good for
taking control back from a live connection only when the same CURVE key presents it (a
client reconnecting after a network drop); without keys a live controller is never
displaced, the robot is free once it says ``bye`` or goes silent for ``peer_timeout_s``.
Every inbound message is decoded and checked here; a malformed, oversized or
wrong-version message is answered with an ``error`` and never reaches the control loop.
When the controller goes silent for ``peer_timeout_s`` the daemon tells the loop to hold
(the loop's own watchdog acts after ``watchdog_periods`` ticks already). Camera frames are
captured here, one thread per camera, and attached to each observation with their capture
stamps.

Flooding. Requests from peers that are not the controller are rate-limited per peer (a
CURVE key, else a connection) and in total, and dropped unanswered beyond it.
``telemetry`` and ``ping`` are answered here from the snapshot the control loop publishes,
never by a round trip through the loop. The daemon never blocks on the loop: a command the
loop cannot take right now is answered ``overloaded``. Each pass of the main loop handles a
bounded batch of requests, so stop signals and heartbeats are served under any load.
"""

from __future__ import annotations

import hmac
import logging
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from rlinf_user.edge import protocol
from rlinf_user.edge.control_loop import PAIR_HWM
from rlinf_user.edge.procs import make_ipc_dir
from rlinf_user.edge.protocol import Message, ProtocolError, decode, encode, error
from rlinf_user.edge.ratelimit import LogThrottle, PeerLimiter
from rlinf_user.edge.security import HANDSHAKE_FAILURES, ServerAuth

log = logging.getLogger(__name__)

CONTROLLER_KINDS = ("reset", "act", "chunk", "hold", "stop")
REQUEST_BATCH = 64  # requests handled per pass before the loop's messages and timers


class EdgeStartError(RuntimeError):
    pass


class EdgeDaemon:
    def __init__(self, make_backend: Callable[[], Any], *, bind: str = "127.0.0.1", port: int = 5555,
                 control_hz: float = 10.0, watchdog_periods: int = 2, secret_key: str | None = None,
                 authorized_keys: str | None = None, heartbeat_s: float = 0.5,
                 peer_timeout_s: float = 2.0, max_message_bytes: int = protocol.DEFAULT_MAX_BYTES,
                 realtime_priority: int = 0, spin_s: float = 0.0005, cameras: dict | None = None,
                 frame_max_age_s: float = 0.25, start_timeout_s: float = 60.0, stream_hwm: int = 2,
                 peer_rate_hz: float = 50.0, total_rate_hz: float = 500.0, daemon_timeout_s: float = 2.0,
                 ingress_budget_bytes: int | None = None):  # fmt: skip
        self.make_backend = make_backend
        self.bind, self.port = bind, port
        self.hz, self.watchdog_periods = control_hz, watchdog_periods
        self.heartbeat_s, self.peer_timeout_s = heartbeat_s, peer_timeout_s
        self.max_bytes = max_message_bytes
        self.realtime_priority, self.spin_s = realtime_priority, spin_s
        self.cameras = dict(cameras or {})  # name -> started capture stream
        self.frame_max_age_s = frame_max_age_s
        self.start_timeout_s = start_timeout_s
        self.ctx = zmq.Context()
        self.auth = ServerAuth(self.ctx, secret_key, authorized_keys, bind)
        self.stream_hwm = stream_hwm
        self.daemon_timeout_s = daemon_timeout_s
        # what unfinished messages from peers may make this process hold (see memguard)
        self.ingress_budget = ingress_budget_bytes or max(64 * 2**20, 4 * max_message_bytes)
        self.guard = None
        self.controller: bytes | None = None
        self.controller_key: str | None = None  # CURVE public key (z85) of the controller
        self.session: str | None = None
        self.last_seen = 0.0
        self.counts = {"rejected": 0, "refused_peers": 0, "forwarded": 0, "replies": 0,
                       "rate_limited": 0, "overloaded": 0, "busy": 0}  # fmt: skip
        self.limiter = PeerLimiter(peer_rate_hz, total_rate_hz)
        self.throttle = LogThrottle(log)
        self.running = False
        self.closed = False
        self.spec: dict[str, Any] = {}
        self.snapshot: dict[str, Any] = {}  # the control loop's latest telemetry
        self.snapshot_at = 0.0
        self.hold_pending = False  # a safety hold the loop could not take yet
        self._streamed: dict[str, int] = {}  # camera -> last frame seq published

    # -- start-up ------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        """Bind, start the control-loop process, wait for the backend; returns its spec.

        Call it from a thread that lives as long as the daemon (the main thread): the
        control-loop process is told to stop when the thread that started it ends."""
        from rlinf_user.edge.control_loop import serve

        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.router_mandatory = False
        self.router.sndhwm = 64  # per peer: a client that does not read loses replies, not us
        # A frame above the whole-message limit drops the connection before it is buffered;
        # the message total is checked on arrival (libzmq assembles a multipart message
        # before handing it over, see README "Safety").
        self.router.maxmsgsize = self.max_bytes
        self.auth.apply(self.router)
        self.monitor = self.router.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED
        )  # fmt: skip
        self._bind(self.router, self.port)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.linger = 0
        self.pub.sndhwm = self.stream_hwm
        self.auth.apply(self.pub)
        self._bind(self.pub, self.port + 1)
        from rlinf_user.edge.memguard import IngressGuard

        self.guard = IngressGuard(self.ingress_budget, self.port)
        self.guard.start()
        self._ipc_dir = make_ipc_dir()
        address = f"ipc://{self._ipc_dir}/control.sock"
        self.pair = self.ctx.socket(zmq.PAIR)
        self.pair.linger = 0
        self.pair.sndhwm = self.pair.rcvhwm = PAIR_HWM
        self.pair.bind(address)
        proc_ctx = mp.get_context("spawn")
        self.proc = proc_ctx.Process(
            target=serve,
            args=(self.make_backend, address, self.hz, self.watchdog_periods,
                  self.realtime_priority, self.spin_s, logging.getLogger().level or logging.INFO,
                  self.daemon_timeout_s, os.getpid()),
            name="rlinf-edge-control", daemon=True,
        )  # fmt: skip
        self.proc.start()
        if not self.pair.poll(self.start_timeout_s * 1e3):
            self.close()
            raise EdgeStartError(f"the control loop did not start within {self.start_timeout_s} s")
        first = decode(self.pair.recv_multipart())
        if first.kind == "error":
            self.close()
            raise EdgeStartError(f"the robot/simulator could not start: {first.body.get('message')}")
        self.spec = dict(first.body)
        self.spec["cameras"] = {**self.spec.get("cameras", {}), **self._camera_shapes()}
        self.spec.update(control_hz=self.hz, watchdog_periods=self.watchdog_periods)
        log.info("edge daemon serving %s on tcp://%s:%d (auth %s)", self.spec.get("description"),
                 self.bind, self.port, "CURVE" if self.auth.enabled else "none")  # fmt: skip
        return self.spec

    def _bind(self, sock: zmq.Socket, port: int) -> None:
        try:
            sock.bind(f"tcp://{self.bind}:{port}")
        except zmq.ZMQError as err:
            from rlinf_user.edge.procs import port_holder

            host = self.bind if _is_ipv4(self.bind) and self.bind != "0.0.0.0" else None
            holder = port_holder(port, host) if err.errno == zmq.EADDRINUSE else None
            self.close()
            raise EdgeStartError(f"cannot serve on {self.bind}:{port}: {err}"
                                 + (f" (held by {holder})" if holder else "")) from None  # fmt: skip

    def _camera_shapes(self) -> dict[str, list[int]]:
        return {name: list(stream.output_shape[:2]) for name, stream in self.cameras.items()}

    # -- main loop -----------------------------------------------------------------
    def run(self, duration_s: float | None = None) -> None:
        poller = zmq.Poller()
        for s in (self.router, self.pair, self.monitor):
            poller.register(s, zmq.POLLIN)
        self.running = True
        end = None if duration_s is None else time.monotonic() + duration_s
        next_beat = time.monotonic() + self.heartbeat_s
        try:
            while self.running and (end is None or time.monotonic() < end):
                events = dict(poller.poll(max(1, int(self.heartbeat_s * 1e3 / 2))))
                # the loop's messages first (replies, state), then a bounded batch of requests
                for _ in range(4 * PAIR_HWM):
                    if not self.pair.poll(0):
                        break
                    self._on_control(self.pair.recv_multipart(copy=False))
                if self.router in events:
                    for _ in range(REQUEST_BATCH):
                        try:
                            frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._on_request(frames)
                if self.monitor in events:
                    while self.monitor.poll(0):
                        self._on_monitor()
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.heartbeat_s
                    self._heartbeat()
                    self.throttle.flush()
        finally:
            self.close()

    def _reply(self, identity: bytes, msg: Message) -> None:
        self.router.send_multipart([identity, *encode(msg)], copy=False)

    def _on_request(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        peer_key = _user_id(frames[-1]) if self.auth.enabled else None
        if identity != self.controller and not self.limiter.allow(peer_key or identity):
            self.counts["rate_limited"] += 1  # dropped unanswered: answering is work too
            self.throttle.warn("rate-limited requests", "rate-limiting requests from a client that "
                               "does not control the robot (over %g/s)", self.limiter.per_peer_hz)  # fmt: skip
            return
        payload = [f.buffer for f in frames[1:]]
        try:
            msg = decode(payload, self.max_bytes)
            protocol.validate_request(msg)
        except ProtocolError as err:
            self.counts["rejected"] += 1
            self.throttle.warn(f"rejected messages ({err.code})", "rejected a message (%s): %s", err.code, err)
            self._reply(identity, error(_rid_of(payload), err.code, str(err)))
            return
        if identity == self.controller:
            self.last_seen = time.monotonic()
        kind = msg.kind
        if kind == "hello":
            self._hello(identity, peer_key, msg)
        elif kind == "ping":
            self._reply(identity, Message("pong", msg.rid, {"edge_time": time.monotonic()}))
        elif kind == "bye":
            if identity == self.controller:
                self._forward(Message("hold", 0))
                self._release()
            self._reply(identity, Message("ack", msg.rid))
        elif kind == "telemetry":  # read-only: any authenticated client may ask
            self._reply(identity, Message("telemetry", msg.rid, self.telemetry()))
        elif kind in CONTROLLER_KINDS:
            if identity != self.controller:
                self._reply(identity, error(msg.rid, "not_controller",
                                            "this client does not control the robot: send hello"))  # fmt: skip
                return
            if kind == "act" and "action" not in msg.arrays:
                self._reply(identity, error(msg.rid, "body", "act needs an 'action' array"))
                return
            self._forward(msg, identity)
        else:
            self._reply(identity, error(msg.rid, "kind", f"{kind!r} is not a request"))

    def telemetry(self) -> dict[str, Any]:
        """The loop's latest snapshot plus this process's counters (no round trip)."""
        body = dict(self.snapshot)
        counts = dict(self.counts, rate_limited=self.limiter.limited, ingress_cut=self.guard.cut if self.guard else 0)
        body.update(daemon=counts, cameras=self._camera_stats(),
                    camera_info={n: protocol.finite_body(s.camera_info()) for n, s in self.cameras.items()},
                    snapshot_age_s=time.monotonic() - self.snapshot_at if self.snapshot_at else None)  # fmt: skip
        return body

    def _hello(self, identity: bytes, peer_key: str | None, msg: Message) -> None:
        session = str(msg.body.get("session", ""))
        now = time.monotonic()
        if self.controller is not None and self.controller != identity:
            alive = now - self.last_seen < self.peer_timeout_s
            # Taking control from a live connection: only the same session presented by the
            # same CURVE key (a client reconnecting after a drop). Without keys, never.
            resume = (
                self.auth.enabled
                and peer_key is not None
                and peer_key == self.controller_key
                and self.session is not None
                and hmac.compare_digest(session.encode(), self.session.encode())
            )
            if alive and not resume:
                self.counts["busy"] += 1
                self._reply(identity, error(msg.rid, "busy", "another client controls this robot; it must "
                                            "say bye or stay silent for peer_timeout_s before another may"))  # fmt: skip
                return
            log.info("controller handover (%s)", "same key and session" if resume else "previous one silent")
        self.controller, self.controller_key, self.session, self.last_seen = identity, peer_key, session, now
        log.info("client %s controls the robot%s", msg.body.get("client"),
                 f" (key {peer_key[:8]}...)" if peer_key else "")  # fmt: skip
        self._reply(identity, Message("welcome", msg.rid, protocol.finite_body(self.spec)))

    def _release(self) -> None:
        self.controller = self.controller_key = self.session = None

    def _forward(self, msg: Message, identity: bytes | None = None) -> None:
        """Hand a command to the loop; never waits (a loop that cannot take it answers
        ``overloaded``; a safety hold is retried at the next heartbeat)."""
        try:
            self.pair.send_multipart(encode(msg), flags=zmq.NOBLOCK, copy=False)
            self.counts["forwarded"] += 1
            if msg.kind == "hold":
                self.hold_pending = False
        except zmq.Again:
            self.counts["overloaded"] += 1
            if msg.kind == "hold":
                self.hold_pending = True
            self.throttle.warn("overloaded", "the control loop is not taking commands right now")
            if identity is not None:
                self._reply(identity, error(msg.rid, "overloaded", "the control loop is busy; try again"))

    def _on_control(self, frames: list[zmq.Frame]) -> None:
        msg = decode([f.buffer for f in frames])
        self._stream_frames()
        if msg.kind == "state":  # a tick nobody asked for: stream only
            self.pub.send_multipart(encode(Message("state", 0, msg.body,
                                                   {"state": msg.arrays["state"]})), copy=False)  # fmt: skip
            return
        if msg.kind == "obs":
            self._attach_frames(msg)
            self.pub.send_multipart(encode(Message("state", msg.rid, msg.body,
                                                   {"state": msg.arrays["state"]})), copy=False)  # fmt: skip
        if msg.kind == "telemetry" and "snapshot" in msg.body:
            self.snapshot, self.snapshot_at = msg.body["snapshot"], time.monotonic()
            return
        if self.controller is not None:
            self.counts["replies"] += 1
            self._reply(self.controller, msg)

    def _attach_frames(self, msg: Message) -> None:
        stale = []
        for name, stream in self.cameras.items():
            frame = stream.latest()
            if frame is None or time.monotonic() - frame.stamp > self.frame_max_age_s:
                stale.append(name)
            if frame is None:
                continue
            if frame.jpeg is not None:
                msg.arrays[f"jpeg/{name}"] = np.frombuffer(frame.jpeg, dtype=np.uint8)
            else:
                msg.arrays[f"image/{name}"] = frame.image
            msg.body.setdefault("image_stamps", {})[name] = frame.stamp
        if stale:
            msg.body["stale_cameras"] = stale

    def _stream_frames(self) -> None:
        """Publish each camera's newest frame once (``frame`` messages, latest-value)."""
        for name, stream in self.cameras.items():
            frame = stream.latest()
            if frame is None or self._streamed.get(name) == frame.seq:
                continue
            self._streamed[name] = frame.seq
            arrays = ({"jpeg": np.frombuffer(frame.jpeg, dtype=np.uint8)} if frame.jpeg is not None
                      else {"image": frame.image})  # fmt: skip
            body = {"camera": name, "stamp": frame.stamp, "seq": frame.seq}
            self.pub.send_multipart(encode(Message("frame", 0, body, arrays)), copy=False)

    def _camera_stats(self) -> dict[str, Any]:
        return {name: protocol.finite_body(s.stats()) for name, s in self.cameras.items()}

    def _on_monitor(self) -> None:
        event = recv_monitor_message(self.monitor)
        why = HANDSHAKE_FAILURES.get(event["event"])
        if why:
            self.counts["refused_peers"] += 1
            self.throttle.warn(f"refused connections ({why})", "refused a connection on port %d: %s",
                               self.port, why)  # fmt: skip

    def _heartbeat(self) -> None:
        if self.hold_pending:
            self._forward(Message("hold", 0))
        if not self.proc.is_alive():
            log.error("the control loop process died (exit code %s); stopping", self.proc.exitcode)
            if self.controller is not None:
                self._reply(self.controller, error(0, "backend", "the edge control loop died"))
            self.running = False
            return
        if self.controller is None:
            return
        if time.monotonic() - self.last_seen > self.peer_timeout_s:
            log.warning("controller silent for %.1f s: holding the robot", self.peer_timeout_s)
            self._forward(Message("hold", 0))
            self.controller = None  # the session may come back with hello (same key)
            return
        self._reply(self.controller, Message("pong", 0, {"edge_time": time.monotonic()}))

    def stop(self) -> None:
        self.running = False

    def close(self) -> None:
        """Stop the loop (it holds the robot) and release everything; idempotent, bounded
        (about 1.5 s at most for a loop that does not answer)."""
        if self.closed:
            return
        self.closed = True
        proc = getattr(self, "proc", None)
        if proc is not None and proc.is_alive():
            try:
                self.pair.send_multipart(encode(Message("bye", 0)), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            proc.join(1.0)  # the loop holds the robot, then exits (its own guard: 1.5 s)
            if proc.is_alive():
                proc.kill()
                proc.join(0.5)
        if self.guard is not None:
            self.guard.stop()
        for stream in self.cameras.values():
            stream.stop()
        for name in ("router", "pub", "pair", "monitor"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(0)
        self.auth.close()
        if not self.ctx.closed:
            self.ctx.term()
        ipc = getattr(self, "_ipc_dir", None)
        if ipc and os.path.isdir(ipc):
            shutil.rmtree(ipc, ignore_errors=True)


def _user_id(frame: zmq.Frame) -> str | None:
    """The CURVE public key (z85) that authenticated this message's connection."""
    try:
        return frame.get("User-Id") or None
    except zmq.ZMQError:
        return None


def _rid_of(payload: list[Any]) -> int:
    """Best-effort request id of a rejected message, so the client can match the error."""
    try:
        rid = protocol.peek_header(payload[0]).get("id", 0)
        return rid if isinstance(rid, int) and rid >= 0 else 0
    except Exception:  # noqa: BLE001
        return 0


def _is_ipv4(addr: str) -> bool:
    import ipaddress

    try:
        ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return True
