"""The fixed-rate control loop: its own process, owning the backend (robot or simulator).

Timing. Tick ``k`` is due at ``t0 + k * period``. The loop waits for it in ``poll`` (so
commands are handled the moment they arrive) and busy-polls only the last ``spin_s``
seconds; the wake-up error (actual - due) of every tick is kept for telemetry, and a tick
that is late by more than a whole period counts as an overrun and re-anchors the clock.

Per tick: observe the backend; if an action was applied during the previous period,
send its observation (the reply to that ``act``); run the watchdog. An ``act`` is applied
as soon as it arrives (at most one per period; a second one waits for the next tick), so
the time from observation to motion is the policy's latency, not a whole period.

Watchdog: when no action has been applied for ``watchdog_periods`` ticks during an
episode, the backend holds (the arm stops where it is; nothing opens) until the next
command. ``stop`` stops the arm and refuses actions until the next ``reset``.

The loop talks to the daemon's network process over one ZMQ PAIR socket using the wire
format of :mod:`rlinf_user.edge.protocol`.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from rlinf_user.edge.backends import EdgeBackend, Tick
from rlinf_user.edge.protocol import Message, decode, encode, error, finite_body
from rlinf_user.edge.safety import UnsafeCommand

log = logging.getLogger(__name__)


def tick_message(kind: str, rid: int, tick: Tick, extra: dict[str, Any] | None = None) -> Message:
    arrays = {"state": np.asarray(tick.state, dtype=np.float32)}
    for name, img in tick.images.items():
        arrays[f"image/{name}"] = img
    body = {
        "stamp": tick.stamp,
        "image_stamps": tick.image_stamps,
        "reward": tick.reward,
        "terminated": tick.terminated,
        "success": tick.success,
        "info": finite_body(tick.info),
        **(extra or {}),
    }
    return Message(kind, rid, body, arrays)


class TimingStats:
    def __init__(self, window: int):
        self.errors: collections.deque[float] = collections.deque(maxlen=window)
        self.ticks = 0
        self.overruns = 0

    def add(self, err: float) -> None:
        self.errors.append(err)
        self.ticks += 1

    def summary(self) -> dict[str, Any]:
        e = np.abs(np.asarray(self.errors)) * 1e3
        out: dict[str, Any] = {"ticks": self.ticks, "overruns": self.overruns}
        if e.size:
            out.update(
                period_error_ms_p50=float(np.median(e)),
                period_error_ms_p99=float(np.percentile(e, 99)),
                period_error_ms_max=float(e.max()),
            )
        return out


class ControlLoop:
    def __init__(self, backend: EdgeBackend, sock: zmq.Socket, hz: float, watchdog_periods: int,
                 spin_s: float = 0.0005, window: int = 2000):  # fmt: skip
        if not 0 < hz <= 1000:
            raise ValueError(f"control_hz must be in (0, 1000], got {hz}")
        self.backend, self.sock = backend, sock
        self.period = 1.0 / hz
        self.watchdog_periods = watchdog_periods
        self.spin_s = spin_s
        self.timing = TimingStats(window)
        self.tick = 0
        self.in_episode = False
        self.stopped = False
        self.holding = False
        self.holds = 0
        self.applied = 0
        self.deferred = 0
        self.pending_rid: int | None = None  # action applied this period, obs owed
        self.queued: Message | None = None  # second action in one period
        self.last_action_tick = 0
        self.last_action_time = time.monotonic()
        self.last_hold: dict[str, Any] | None = None
        self.started = time.monotonic()
        self.reset_seconds = 0.0  # time spent in backend resets (homing)
        self.resets = 0
        self.episode_ticks = 0  # ticks inside episodes (resets excluded)
        self.acted_ticks = 0  # ... of which ended a period in which a policy action ran
        self.running = True

    # -- messages ------------------------------------------------------------------
    def _send(self, msg: Message) -> None:
        self.sock.send_multipart(encode(msg), copy=False)

    def _handle(self, msg: Message) -> None:
        kind = msg.kind
        if kind == "act":
            if self.pending_rid is not None:
                if self.queued is not None:  # the earlier queued one is superseded
                    self._send(error(self.queued.rid, "superseded", "a newer action replaced it"))
                self.queued = msg
                self.deferred += 1
            else:
                self._apply(msg)
        elif kind == "reset":
            self._reset(msg)
        elif kind == "hold":
            self.backend.hold()
            self.holding = True
            self._send(Message("ack", msg.rid, {"held": True}))
        elif kind == "stop":
            self.backend.stop()
            self.stopped, self.in_episode, self.queued = True, False, None
            log.warning("explicit stop: actions refused until the next reset")
            self._send(Message("ack", msg.rid, {"stopped": True}))
        elif kind == "telemetry":
            self._send(Message("telemetry", msg.rid, finite_body(self.telemetry())))
        elif kind == "bye":
            self.running = False
        else:
            self._send(error(msg.rid, "kind", f"the control loop does not handle {kind!r}"))

    def _apply(self, msg: Message) -> None:
        if self.stopped or not self.in_episode:
            why = "the robot is stopped" if self.stopped else "no episode: send reset first"
            self._send(error(msg.rid, "state", f"action refused: {why}"))
            return
        action = msg.arrays.get("action")
        try:
            breaches = self.backend.apply(action if action is not None else np.full(7, np.nan))
        except UnsafeCommand as err:
            self._send(error(msg.rid, "unsafe", f"action refused, nothing sent: {err}"))
            return
        except Exception as err:  # noqa: BLE001 - a driver error must reach the client
            log.exception("backend failed to apply an action")
            self._send(error(msg.rid, "backend", f"{type(err).__name__}: {err}"))
            return
        self.applied += 1
        self.pending_rid = msg.rid
        self.pending_breaches = [b.kind for b in breaches]
        self.last_action_tick = self.tick
        self.last_action_time = time.monotonic()
        self.holding = False

    def _reset(self, msg: Message) -> None:
        self.queued, self.pending_rid = None, None
        started = time.monotonic()
        try:
            t = self.backend.reset(msg.body.get("seed"), msg.body.get("options") or {})
        except Exception as err:  # noqa: BLE001
            log.exception("reset failed")
            self._send(error(msg.rid, "backend", f"reset failed: {type(err).__name__}: {err}"))
            return
        finally:
            self.reset_seconds += time.monotonic() - started
            self.resets += 1
        self.stopped, self.in_episode, self.holding = False, True, False
        self.last_action_tick = self.tick
        self.last_action_time = time.monotonic()
        self._send(tick_message("obs", msg.rid, t, {"reset": True}))
        self.next_due = time.monotonic() + self.period

    # -- loop ----------------------------------------------------------------------
    def _wait_until(self, due: float) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while self.running:
            remaining = due - time.monotonic()
            if remaining <= 0:
                return
            timeout = max(0.0, remaining - self.spin_s) * 1e3 if remaining > self.spin_s else 0
            if poller.poll(timeout):
                frames = self.sock.recv_multipart(copy=False)
                try:
                    msg = decode([f.buffer for f in frames])
                except Exception as err:  # noqa: BLE001 - the daemon validated it already
                    log.error("dropping an undecodable internal message: %s", err)
                    continue
                self._handle(msg)
                if msg.kind == "reset":
                    due = self.next_due

    def _on_tick(self) -> None:
        if not self.in_episode:
            return
        self.episode_ticks += 1
        t = self.backend.observe()
        if self.pending_rid is not None:
            self.acted_ticks += 1
            extra = {"tick": self.tick, "breaches": self.pending_breaches}
            self._send(tick_message("obs", self.pending_rid, t, extra))
            self.pending_rid = None
            if self.queued is not None:
                queued, self.queued = self.queued, None
                self._apply(queued)
        else:  # nobody is owed a reply: still stream the state (latest-value stream)
            self._send(tick_message("state", 0, t, {"tick": self.tick, "holding": self.holding}))
        idle = self.tick - self.last_action_tick
        if not self.holding and not self.stopped and idle >= self.watchdog_periods:
            self.backend.hold()
            self.holding = True
            self.holds += 1
            self.last_hold = {
                "tick": self.tick,
                "idle_periods": idle,
                "after_s": time.monotonic() - self.last_action_time,
            }
            log.warning("watchdog: no command for %d periods, holding the robot", idle)
            self._send(Message("telemetry", 0, {"event": "watchdog_hold", "tick": self.tick}))

    def run(self) -> None:
        self.next_due = time.monotonic() + self.period
        parent = os.getppid()
        while self.running:
            self._wait_until(self.next_due)
            if not self.running:
                break
            if os.getppid() != parent:  # the daemon died: hold (in serve's finally) and exit
                log.error("the edge daemon process is gone; holding the robot and exiting")
                break
            now = time.monotonic()
            self.timing.add(now - self.next_due)
            self.tick += 1
            self._on_tick()
            self.next_due += self.period
            if time.monotonic() > self.next_due:  # a whole period lost: re-anchor
                self.timing.overruns += 1
                self.next_due = time.monotonic() + self.period

    def telemetry(self) -> dict[str, Any]:
        return {
            **self.timing.summary(),
            "hz": 1.0 / self.period,
            "applied": self.applied,
            "deferred": self.deferred,
            # duty cycle over a window = d(acted_ticks) / (d(uptime_s) - d(reset_seconds)) / hz
            "uptime_s": time.monotonic() - self.started,
            "reset_seconds": self.reset_seconds,
            "resets": self.resets,
            "acted_ticks": self.acted_ticks,
            "episode_ticks": self.episode_ticks,
            "watchdog_holds": self.holds,
            "last_hold": self.last_hold,
            "holding": self.holding,
            "stopped": self.stopped,
            **self.backend.telemetry(),
        }


def set_realtime(priority: int) -> None:
    if priority <= 0:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        log.info("control loop runs SCHED_FIFO priority %d", priority)
    except (PermissionError, OSError) as err:
        log.warning(
            "could not get real-time priority %d (%s); timing under load will suffer. Give the "
            "user an rtprio limit (/etc/security/limits.conf) or run a PREEMPT_RT kernel", priority, err
        )


def serve(make_backend: Callable[[], EdgeBackend], address: str, hz: float, watchdog_periods: int,
          realtime_priority: int = 0, spin_s: float = 0.0005, log_level: int = logging.INFO) -> None:  # fmt: skip
    """Entry point of the control-loop process: build the backend, report, loop."""
    logging.basicConfig(level=log_level, format="%(asctime)s control %(levelname)s %(message)s")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.linger = 0
    sock.connect(address)
    try:
        backend = make_backend()
    except Exception as err:  # noqa: BLE001 - reported to the daemon, which exits cleanly
        log.exception("backend failed to start")
        sock.send_multipart(encode(error(0, "backend", f"{type(err).__name__}: {err}")))
        sock.close()
        ctx.term()
        return
    sock.send_multipart(encode(Message("welcome", 0, finite_body(backend.spec()))))
    set_realtime(realtime_priority)
    loop = ControlLoop(backend, sock, hz, watchdog_periods, spin_s)
    try:
        loop.run()
    finally:
        try:
            backend.hold()
        finally:
            backend.close()
            sock.close()
            ctx.term()
