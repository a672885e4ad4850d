"""The edge daemon's network process: authentication, validation, cameras, forwarding.

Sockets (``tcp://<bind>:<port>``):

* ``port``   ROUTER, the public socket: ``hello``, ``ping``, ``telemetry``, ``bye`` from
  anyone authorised (and, for clients that never move to the control socket, the
  controller's commands).
* ``port+1`` PUB: latest-value streams (``state`` every tick with a reply); publishers keep
  at most ``stream_hwm`` messages per subscriber so a slow subscriber only ever sees
  recent values.
* ``port+2`` ROUTER, the controller's own socket (``control_port``; ``welcome`` gives its
  offset from ``port``, so a tunnel that forwards three consecutive ports works): the client
  whose ``hello`` was accepted connects to it, presents its session in a ``hello`` there, and
  sends every command on it. With CURVE it admits only the controller's key.

One client controls the robot at a time (:mod:`rlinf_user.edge.session`). Every inbound message is decoded and checked here; a malformed, oversized or
wrong-version message is answered with an ``error`` and never reaches the control loop.
When the controller goes silent for ``peer_timeout_s`` the daemon tells the loop to hold
(the loop's own watchdog acts after ``watchdog_periods`` ticks already). Camera frames are
captured here, one thread per camera, and attached to each observation with their capture
stamps.

Flooding. The controller is served first: every pass reads its socket before anything
else, and between every few requests of others. The public socket is read at most
``total_rate_hz`` messages a second: what others send beyond that stays queued in libzmq
(``public_hwm`` messages per peer), and then in the kernel, so their flood costs this
process nothing and never delays the controller. Of what is read, requests from peers that
are not the controller are rate-limited per peer (a CURVE key, else a connection) and
dropped unanswered beyond it. The controller's ``act`` and ``chunk`` beyond
``controller_rate_hz`` a second are answered ``rate_limited`` here (a runaway policy cannot
swamp the control loop); its ``hold``, ``stop`` and ``reset`` always go through.
``telemetry`` and ``ping`` are answered here from the snapshot the control loop publishes,
never by a round trip through the loop. The daemon never blocks on the loop: a command the
loop cannot take right now is answered ``overloaded``. Each pass of the main loop handles a
bounded batch of requests, so stop signals and heartbeats are served under any load.

Connections. A connection that has not finished its ZMTP/CURVE handshake within
``handshake_timeout_s`` is dropped by libzmq; beyond ``max_pending_connections`` of them the
ingress guard (:mod:`rlinf_user.edge.memguard`) cuts the oldest, and the soft limit on open
files is raised to the hard limit at start, so no peer without a key can lock one out.
"""

from __future__ import annotations

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
from rlinf_user.edge.protocol import Message, ProtocolError, decode, encode, error
from rlinf_user.edge.ratelimit import LogThrottle, PeerLimiter, TokenBucket
from rlinf_user.edge.security import HANDSHAKE_FAILURES, ServerAuth, is_ipv4, user_id
from rlinf_user.edge.session import ControlSession, Peer
from rlinf_user.procs import make_ipc_dir

log = logging.getLogger(__name__)

CONTROLLER_KINDS = ("reset", "act", "chunk", "hold", "stop")
REQUEST_BATCH = 64  # requests handled per pass before the loop's messages and timers
CONTROLLER_CHECK = 8  # the controller's socket is read again after this many requests of others


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
                 ingress_budget_bytes: int | None = None, handshake_timeout_s: float = 1.0,
                 max_pending_connections: int = 64, control_port: int | None = None,
                 controller_rate_hz: float | None = None, public_hwm: int = 100):  # fmt: skip
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
        if handshake_timeout_s <= 0 or max_pending_connections < 2:
            raise ValueError("handshake_timeout_s must be > 0 and max_pending_connections >= 2")
        self.handshake_timeout_s, self.max_pending = handshake_timeout_s, max_pending_connections
        self.control_port = port + 2 if control_port is None else control_port
        self.public_hwm = public_hwm
        self.control = ControlSession(peer_timeout_s, self.auth.enabled)
        self.counts = {"rejected": 0, "refused_peers": 0, "forwarded": 0, "replies": 0,
                       "rate_limited": 0, "overloaded": 0, "busy": 0, "shed": 0, "public_read": 0,
                       "controller_throttled": 0}  # fmt: skip
        self.limiter = PeerLimiter(peer_rate_hz, total_rate_hz)
        self.public_reads = TokenBucket(total_rate_hz, 2 * total_rate_hz)  # messages read from the public socket
        rate = controller_rate_hz or max(100.0, 10 * control_hz)
        self.controller_reads = TokenBucket(rate, rate)
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
        from rlinf_user.edge.loop_process import serve
        from rlinf_user.procs import raise_fd_limit

        old, new = raise_fd_limit()
        if new != old:
            log.info("open-file limit raised from %d to %d", old, new)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.router_mandatory = False
        self.router.sndhwm = 64  # per peer: a client that does not read loses replies, not us
        self.router.rcvhwm = self.public_hwm  # per peer: beyond it libzmq stops reading that peer
        # A frame above the whole-message limit drops the connection before it is buffered;
        # the message total is checked on arrival (libzmq assembles a multipart message
        # before handing it over, see README "Safety").
        self.router.maxmsgsize = self.max_bytes
        self.auth.apply(self.router)
        self.router.handshake_ivl = int(self.handshake_timeout_s * 1e3)  # unfinished handshakes dropped
        self.monitor = self.router.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED
        )  # fmt: skip
        self._bind(self.router, self.port)
        self.ctl = self.ctx.socket(zmq.ROUTER)
        self.ctl.linger = 0
        self.ctl.sndhwm = 64
        self.ctl.maxmsgsize = self.max_bytes
        self.ctl.handshake_ivl = int(self.handshake_timeout_s * 1e3)
        self.auth.apply(self.ctl, admit=lambda key: key == self.control.key)  # the controller's key only
        self._bind(self.ctl, self.control_port)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.linger = 0
        self.pub.sndhwm = self.stream_hwm
        self.pub.handshake_ivl = int(self.handshake_timeout_s * 1e3)
        self.auth.apply(self.pub)
        self._bind(self.pub, self.port + 1)
        from rlinf_user.edge.memguard import IngressGuard

        # a finished handshake has received a ZMTP greeting (64 bytes) plus, with CURVE, HELLO
        # and INITIATE (567 bytes in all measured on loopback); without keys a READY command
        # (103-107 bytes in all)
        handshake_bytes = 64 + (400 if self.auth.enabled else 20)
        self.guard = IngressGuard(self.ingress_budget, (self.port, self.port + 1, self.control_port),
                                  max_pending=self.max_pending,
                                  handshake_bytes=handshake_bytes)  # fmt: skip
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
        log.info("edge daemon serving %s on tcp://%s:%d (controller socket :%d, auth %s)", self.spec.get("description"),
                 self.bind, self.port, self.control_port, "CURVE" if self.auth.enabled else "none")  # fmt: skip
        return self.spec

    def _bind(self, sock: zmq.Socket, port: int) -> None:
        try:
            sock.bind(f"tcp://{self.bind}:{port}")
        except zmq.ZMQError as err:
            from rlinf_user.procs import port_holder

            host = self.bind if is_ipv4(self.bind) and self.bind != "0.0.0.0" else None
            holder = port_holder(port, host) if err.errno == zmq.EADDRINUSE else None
            self.close()
            raise EdgeStartError(f"cannot serve on {self.bind}:{port}: {err}"
                                 + (f" (held by {holder})" if holder else "")) from None  # fmt: skip

    def _camera_shapes(self) -> dict[str, list[int]]:
        return {name: list(stream.output_shape[:2]) for name, stream in self.cameras.items()}

    # -- main loop -----------------------------------------------------------------
    def run(self, duration_s: float | None = None) -> None:
        quiet, full = zmq.Poller(), zmq.Poller()  # without and with the public socket
        for s in (self.ctl, self.pair, self.monitor):
            quiet.register(s, zmq.POLLIN)
            full.register(s, zmq.POLLIN)
        full.register(self.router, zmq.POLLIN)
        self.running = True
        end = None if duration_s is None else time.monotonic() + duration_s
        next_beat = time.monotonic() + self.heartbeat_s
        try:
            while self.running and (end is None or time.monotonic() < end):
                # the public socket is polled only while its read budget lasts: beyond it,
                # others' messages wait in libzmq and the kernel, costing nothing here
                now = time.monotonic()
                open_ = self.public_reads.refill(now)
                wait_ms = self.heartbeat_s * 1e3 / 2 if open_ else 1e3 / self.public_reads.rate
                events = dict((full if open_ else quiet).poll(max(1, int(wait_ms))))
                self._serve_controller()
                # the loop's messages next (replies, state), then a bounded batch of requests
                for _ in range(4 * PAIR_HWM):
                    if not self.pair.poll(0):
                        break
                    self._on_control(self.pair.recv_multipart(copy=False))
                if self.router in events:
                    self._serve_public()
                if self.monitor in events:
                    while self.monitor.poll(0):
                        self._on_monitor()
                if time.monotonic() >= next_beat:
                    late = time.monotonic() - next_beat
                    next_beat = time.monotonic() + self.heartbeat_s
                    self._heartbeat(late)
                    self.throttle.flush()
        finally:
            self.close()

    def _serve_controller(self) -> None:
        """Everything waiting on the controller's socket (a bounded batch per call)."""
        for _ in range(REQUEST_BATCH):
            try:
                frames = self.ctl.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._on_request(self.ctl, frames)

    def _serve_public(self) -> None:
        for k in range(REQUEST_BATCH):
            if not self.public_reads.take(time.monotonic()):
                return
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self.public_reads.tokens += 1
                return
            self.counts["public_read"] += 1
            self._on_request(self.router, frames)
            if k % CONTROLLER_CHECK == CONTROLLER_CHECK - 1:
                self._serve_controller()

    def _reply(self, to: Peer, msg: Message) -> None:
        to[0].send_multipart([to[1], *encode(msg)], copy=False)

    def _on_request(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        peer: Peer = (sock, frames[0].bytes)
        peer_key = user_id(frames[-1]) if self.auth.enabled else None
        if not self.control.controls(peer, peer_key) and not self.limiter.allow(peer_key or peer[1]):
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
            self._reply(peer, error(protocol.request_id(payload), err.code, str(err)))
            return
        if self.control.controls(peer, peer_key):
            self.control.last_seen = time.monotonic()
        kind = msg.kind
        if kind == "hello":
            (self._bind_control if sock is self.ctl else self._hello)(peer, peer_key, msg)
        elif kind == "ping":
            self._reply(peer, Message("pong", msg.rid, {"edge_time": time.monotonic()}))
        elif kind == "bye":
            if self.control.controls(peer, peer_key):
                self._forward(Message("hold", 0))
                self.control.release()
            self._reply(peer, Message("ack", msg.rid))
        elif kind == "telemetry":  # read-only: any authenticated client may ask
            self._reply(peer, Message("telemetry", msg.rid, self.telemetry()))
        elif kind in CONTROLLER_KINDS:
            if not self.control.controls(peer, peer_key):
                self._reply(peer, error(msg.rid, "not_controller",
                                        "this client does not control the robot: send hello"))  # fmt: skip
                return
            if self.control.follow(peer):
                log.info("the controller's commands now come from its %s socket",
                         "controller" if sock is self.ctl else "public")  # fmt: skip
            if kind == "act" and "action" not in msg.arrays:
                self._reply(peer, error(msg.rid, "body", "act needs an 'action' array"))
                return
            if kind in ("act", "chunk") and not self.controller_reads.take(time.monotonic()):
                # a runaway policy: its motion commands beyond the rate are answered here and
                # never reach the loop; hold, stop and reset always do
                self.counts["controller_throttled"] += 1
                self.throttle.warn("controller throttled", "the controller sends more than %g motion commands "
                                   "a second: the excess is refused", self.controller_reads.rate)  # fmt: skip
                self._reply(peer, error(msg.rid, "rate_limited", "more motion commands than the control loop "
                                        "can use: wait for each observation"))  # fmt: skip
                return
            self._forward(msg, peer)
        else:
            self._reply(peer, error(msg.rid, "kind", f"{kind!r} is not a request"))

    def telemetry(self) -> dict[str, Any]:
        """The loop's latest snapshot plus this process's counters (no round trip)."""
        body = dict(self.snapshot)
        counts = dict(self.counts, rate_limited=self.limiter.limited, ingress_cut=self.guard.cut if self.guard else 0)
        body.update(daemon=counts, cameras=self._camera_stats(), ingress=self.guard.status() if self.guard else None,
                    camera_info={n: protocol.finite_body(s.camera_info()) for n, s in self.cameras.items()},
                    snapshot_age_s=time.monotonic() - self.snapshot_at if self.snapshot_at else None)  # fmt: skip
        return body

    def _hello(self, peer: Peer, peer_key: str | None, msg: Message) -> None:
        granted, how = self.control.claim(peer, peer_key, str(msg.body.get("session", "")), time.monotonic())
        if not granted:
            self.counts["busy"] += 1
            self._reply(peer, error(msg.rid, "busy", "another client controls this robot; it must "
                                    "say bye or stay silent for peer_timeout_s before another may"))  # fmt: skip
            return
        log.info("client %s controls the robot (%s)%s", msg.body.get("client"), how,
                 f" (key {peer_key[:8]}...)" if peer_key else "")  # fmt: skip
        self._reply(peer, Message("welcome", msg.rid, self._welcome()))

    def _welcome(self) -> dict[str, Any]:
        return {**protocol.finite_body(self.spec), "control_offset": self.control_port - self.port}

    def _bind_control(self, peer: Peer, peer_key: str | None, msg: Message) -> None:
        """A ``hello`` on the controller's socket: the accepted session moves its commands here."""
        if not self.control.bind(peer, peer_key, str(msg.body.get("session", "")), time.monotonic()):
            self.counts["shed"] += 1
            self._reply(peer, error(msg.rid, "not_controller", "say hello on the public socket first"))
            return
        self._reply(peer, Message("welcome", msg.rid, self._welcome()))

    def _forward(self, msg: Message, peer: Peer | None = None) -> None:
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
            if peer is not None:
                self._reply(peer, error(msg.rid, "overloaded", "the control loop is busy; try again"))

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
        if self.control.peer is not None:
            self.counts["replies"] += 1
            self._reply(self.control.peer, msg)

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

    def _heartbeat(self, late: float = 0.0) -> None:
        """``late``: how far past its time this beat runs (this process did not run: a
        loaded robot PC)."""
        if self.hold_pending:
            self._forward(Message("hold", 0))
        if not self.proc.is_alive():
            log.error("the control loop process died (exit code %s); stopping", self.proc.exitcode)
            if self.control.peer is not None:
                self._reply(self.control.peer, error(0, "backend", "the edge control loop died"))
            self.running = False
            return
        if self.control.peer is None:
            return
        if late > self.heartbeat_s:
            # silence is counted over the time this process listened: what the controller
            # sent while it stalled is still on its way in, and is read at the next passes
            self.control.last_seen += late
        if not self.control.alive(time.monotonic()):
            log.warning("controller silent for %.1f s: holding the robot", self.peer_timeout_s)
            self._forward(Message("hold", 0))
            self.control.lapse()  # the session may come back with hello (same key)
            return
        self._reply(self.control.peer, Message("pong", 0, {"edge_time": time.monotonic()}))

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
        for name in ("router", "ctl", "pub", "pair", "monitor"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(0)
        self.auth.close()
        if not self.ctx.closed:
            self.ctx.term()
        ipc = getattr(self, "_ipc_dir", None)
        if ipc and os.path.isdir(ipc):
            shutil.rmtree(ipc, ignore_errors=True)

