"""The fixed-rate control loop: its own process, owning the backend (robot or simulator).

Timing. Tick ``k`` is due at ``t0 + k * period``. The loop waits for it in ``poll`` (so
commands are handled the moment they arrive) and busy-polls only the last ``spin_s``
seconds; the wake-up error (actual - due) of every tick is kept for telemetry, and a tick
that is late by more than a whole period counts as an overrun and re-anchors the clock.

Per tick: observe the backend; if an action was applied during the previous period,
send its observation (the reply to that ``act``); run the watchdog. An ``act`` is applied
as soon as it arrives (at most one per period; a second one waits for the next tick), so
the time from observation to motion is the policy's latency, not a whole period.

A ``chunk`` schedules several actions by tick (:mod:`rlinf_user.edge.plan`): each tick runs
the one due, through the same safety checks as an ``act``, and streams its observation
with the action it applied; an ``act`` replaces the schedule. A chunk sent with
``observe: true`` gets every tick's observation as an ``obs`` reply carrying its id
(``stream: true``, ``plan``: the action that tick ran or nil, ``dry``: the schedule ran
out and this is the last one), camera frames attached, so a learner records every
transition the robot made while it computed the next chunk.

Watchdog: when no action has been applied for ``watchdog_periods`` ticks during an
episode, the backend holds (the arm stops where it is; nothing opens) until the next
command. ``stop`` stops the arm and refuses actions until the next ``reset``.

The loop talks to the daemon's network process over one ZMQ PAIR socket using the wire
format of :mod:`rlinf_user.edge.protocol`. Nothing a client does can make the loop wait:
every send is non-blocking. Stream messages (``state``, telemetry snapshots) are dropped
when the daemon is not reading; replies wait in a small bounded outbox. The loop publishes
a telemetry snapshot at most every ``SNAPSHOT_S`` and after every command, and the daemon
answers telemetry requests from it. If the daemon dies (parent gone) or stops reading for
``daemon_timeout_s``, the loop holds the robot and exits. A backend error while observing
puts the loop in a reported fault state (the robot held, actions refused) that a ``reset``
recovers from.
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
from rlinf_user.edge.plan import ActionPlan
from rlinf_user.edge.protocol import Message, decode, encode, error, finite_body
from rlinf_user.edge.safety import UnsafeCommand
from rlinf_user.edge.timing import TimingStats

log = logging.getLogger(__name__)

SNAPSHOT_S = 0.02  # telemetry snapshots to the daemon at most 50 per second
OUTBOX = 32  # replies (each after a snapshot) kept while the daemon does not read; oldest dropped
PAIR_HWM = 64  # messages queued towards the daemon before sends fail


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


class ControlLoop:
    def __init__(self, backend: EdgeBackend, sock: zmq.Socket, hz: float, watchdog_periods: int,
                 spin_s: float = 0.0005, window: int = 2000, daemon_timeout_s: float = 2.0):  # fmt: skip
        if not 0 < hz <= 1000:
            raise ValueError(f"control_hz must be in (0, 1000], got {hz}")
        self.backend, self.sock = backend, sock
        self.daemon_timeout_s = daemon_timeout_s
        self.outbox: collections.deque[list[Any]] = collections.deque()
        self.blocked_since: float | None = None  # first failed send since the last success
        self.sends = {"dropped_stream": 0, "dropped_replies": 0, "queued_replies": 0}
        self.last_snapshot = 0.0
        self.fault: str | None = None  # a backend error while observing; reset recovers
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
        self.plan = ActionPlan()
        self.observe_rid: int | None = None  # a chunk sent with observe: each tick's obs goes to it
        self.plan_ran = False  # a scheduled action ran during the period now ending
        self.chunks: dict[str, Any] = {"received": 0, "late_actions": 0, "dropped_actions": 0, "refused_steps": 0,
                                       "seam_jump_max": None, "seam_jump_p50": None}
        self.last_applied: np.ndarray | None = None  # the last scheduled action run
        self.last_chunk = -1
        self.seam_jumps: collections.deque[float] = collections.deque(maxlen=window)
        self.started = time.monotonic()
        self.reset_seconds = 0.0  # time spent in backend resets (homing)
        self.resets = 0
        self.episode_ticks = 0  # ticks inside episodes (resets excluded)
        self.acted_ticks = 0  # ... of which ended a period in which a policy action ran
        self.running = True

    # -- messages ------------------------------------------------------------------
    def _send(self, msg: Message, stream: bool = False) -> None:
        """Never blocks: a ``stream`` message is dropped when the daemon is not reading; a
        reply waits in the bounded outbox (in order), preceded by a fresh telemetry snapshot
        (the daemon answers telemetry from snapshots: never older than a reply)."""
        if stream:
            if self.outbox or not self._try_send(encode(msg)):
                self.sends["dropped_stream"] += 1
            return
        self._queue(self._snapshot_frames())
        self._queue(encode(msg))

    def _queue(self, frames: list[Any]) -> None:
        if not self.outbox and self._try_send(frames):
            return
        if len(self.outbox) >= OUTBOX:
            self.outbox.popleft()
            self.sends["dropped_replies"] += 1
        self.outbox.append(frames)
        self.sends["queued_replies"] += 1
        self._flush()

    def _try_send(self, frames: list[Any]) -> bool:
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            if self.blocked_since is None:
                self.blocked_since = time.monotonic()
            return False
        self.blocked_since = None
        return True

    def _flush(self) -> None:
        while self.outbox and self._try_send(self.outbox[0]):
            self.outbox.popleft()

    def _snapshot_frames(self) -> list[Any]:
        self.last_snapshot = time.monotonic()
        return encode(Message("telemetry", 0, {"snapshot": finite_body(self.telemetry())}))

    def _snapshot(self, force: bool = False) -> None:
        if force or time.monotonic() - self.last_snapshot >= SNAPSHOT_S:
            frames = self._snapshot_frames()
            if self.outbox or not self._try_send(frames):
                self.sends["dropped_stream"] += 1

    def _handle(self, msg: Message) -> None:
        kind = msg.kind
        if kind == "chunk":
            self._chunk(msg)
        elif kind == "act":
            self._drop_plan()  # a single action replaces a schedule
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
            self._drop_plan()
            if self._safely(self.backend.hold, msg.rid):
                self.holding = True
                self._send(Message("ack", msg.rid, {"held": True}))
        elif kind == "stop":
            self._answer_queued("the robot was stopped")
            self._drop_plan()
            if self._safely(self.backend.stop, msg.rid):
                self.stopped, self.in_episode = True, False
                log.warning("explicit stop: actions refused until the next reset")
                self._send(Message("ack", msg.rid, {"stopped": True}))
        elif kind == "telemetry":  # the daemon answers from snapshots; this asks for a fresh one
            self._snapshot(force=True)
        elif kind == "bye":
            self.running = False
        else:
            self._send(error(msg.rid, "kind", f"the control loop does not handle {kind!r}"))

    def _safely(self, call: Callable[[], Any], rid: int | None = None) -> bool:
        """Run a backend call; an error becomes the fault state, never the loop's end."""
        try:
            call()
            return True
        except Exception as err:  # noqa: BLE001
            self._enter_fault(err, rid)
            return False

    def _answer_queued(self, why: str) -> None:
        if self.queued is not None:
            self._send(error(self.queued.rid, "state", f"action dropped: {why}"))
            self.queued = None

    def _apply(self, msg: Message) -> None:
        why = self._refusal()
        if why:
            self._send(error(msg.rid, "state", f"action refused: {why}"))
            return
        action = msg.arrays.get("action")
        try:
            breaches = self.backend.apply(action if action is not None else np.full(7, np.nan))
        except UnsafeCommand as err:
            self._send(error(msg.rid, "unsafe", f"action refused, nothing sent: {err}"))
            return
        except Exception as err:  # noqa: BLE001 - a driver error must reach the client
            self._enter_fault(err, msg.rid)
            return
        self.applied += 1
        self.pending_rid = msg.rid
        self.pending_breaches = [b.kind for b in breaches]
        self.last_action_tick = self.tick
        self.last_action_time = time.monotonic()
        self.holding = False

    def _refusal(self) -> str | None:
        if not (self.stopped or not self.in_episode):
            return None
        return ("the robot is stopped" if self.stopped else
                f"the robot is in fault ({self.fault}): send reset" if self.fault else
                "no episode: send reset first")  # fmt: skip

    def _chunk(self, msg: Message) -> None:
        why = self._refusal()
        if why:
            self._send(error(msg.rid, "state", f"chunk refused: {why}"))
            return
        start = msg.body.get("start_tick")
        if start is not None and start > self.tick:
            self._send(error(msg.rid, "body", f"chunk start_tick {start} is ahead of the loop (tick {self.tick})"))
            return
        self._answer_queued("a chunk replaced it")
        self.chunks["received"] += 1
        first = (start if start is not None else self.tick) + 1
        info = self.plan.replace(msg.arrays["actions"], first, self.tick + 1, int(msg.body.get("blend", 0)), msg.rid)
        self.observe_rid = msg.rid if msg.body.get("observe") else None
        self.chunks["late_actions"] += info["late"]
        self._send(Message("ack", msg.rid, {**info, "tick": self.tick, "scheduled": len(self.plan)}))

    def _drop_plan(self) -> None:
        self.chunks["dropped_actions"] += self.plan.clear()
        self.observe_rid = None

    def _run_plan(self) -> dict[str, Any] | None:
        """The scheduled action of this tick, applied (None when nothing is due)."""
        if self.pending_rid is not None:  # a single action runs this period; the plan waits
            return None
        action = self.plan.pop(self.tick)
        if action is None:
            return None
        try:
            breaches = self.backend.apply(action)
        except UnsafeCommand as err:
            self.chunks["refused_steps"] += 1
            self._drop_plan()
            self._send(error(self.plan.rid, "unsafe", f"chunk action at tick {self.tick} refused, the rest "
                                                      f"dropped (the watchdog holds): {err}"))  # fmt: skip
            return None
        except Exception as err:  # noqa: BLE001 - a driver error must reach the client
            self._enter_fault(err, self.plan.rid)
            return None
        action = np.clip(action, -1.0, 1.0)  # what the arm was sent (the safety layer clipped it)
        if self.last_applied is not None and self.last_chunk != self.plan.rid:  # a seam between chunks
            self.seam_jumps.append(float(np.abs(action - self.last_applied).max()))
            # statistics refreshed here, once per seam, not in every telemetry snapshot
            self.chunks["seam_jump_max"] = max(self.seam_jumps)
            self.chunks["seam_jump_p50"] = float(np.median(self.seam_jumps))
        self.last_chunk = self.plan.rid
        self.last_applied = np.array(action)
        self.applied += 1
        self.plan_ran = True
        self.last_action_tick = self.tick
        self.last_action_time = time.monotonic()
        self.holding = False
        return {"applied": [float(x) for x in action], "chunk": self.plan.rid, "scheduled": len(self.plan),
                "breaches": [b.kind for b in breaches]}  # fmt: skip

    def _reset(self, msg: Message) -> None:
        self._answer_queued("a reset came first")
        self._drop_plan()
        self.last_applied = None
        if self.pending_rid is not None:
            self._send(error(self.pending_rid, "state", "action's observation dropped: a reset came first"))
            self.pending_rid = None
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
        if self.fault:
            log.warning("reset recovered from the fault: %s", self.fault)
        self.stopped, self.in_episode, self.holding, self.fault = False, True, False, None
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
                if msg.kind in ("bye", "hold"):
                    self._snapshot(force=True)
                if msg.kind == "reset":
                    due = self.next_due

    def _enter_fault(self, err: Exception, rid: int | None = None) -> None:
        """A backend error (reading or commanding the robot): hold, refuse actions until a
        reset recovers, and report it to the request ``rid`` (else the one owed a reply)."""
        self.fault = f"{type(err).__name__}: {err}"
        self._drop_plan()
        log.error("backend fault, robot held until the next reset: %s", self.fault)
        try:
            self.backend.hold()
        except Exception as hold_err:  # noqa: BLE001 - the driver may be down entirely
            log.error("hold after the fault failed too: %s", hold_err)
        self._answer_queued(f"robot fault: {self.fault}")
        self.in_episode, self.holding = False, True
        if rid is None:
            rid = self.pending_rid or 0
        elif self.pending_rid is not None:  # the earlier action's observation never comes
            self._send(error(self.pending_rid, "backend", f"robot fault: {self.fault}"))
        self.pending_rid = None
        self._send(error(rid, "backend", f"robot fault, send reset to recover: {self.fault}"))

    def _on_tick(self) -> None:
        if not self.in_episode:
            return
        self.episode_ticks += 1
        if self.plan_ran:  # the period now ending ran a scheduled action
            self.acted_ticks += 1
            self.plan_ran = False
        try:
            t = self.backend.observe()
        except Exception as err:  # noqa: BLE001 - never let a driver error kill the loop
            self._enter_fault(err)
            return
        ran = self._run_plan() if len(self.plan) else None  # this tick's scheduled action
        if not self.in_episode:  # the plan's action put the loop in fault
            return
        idle = self.tick - self.last_action_tick  # the watchdog first: this tick's state says so
        if not self.holding and not self.stopped and idle >= self.watchdog_periods:
            if not self._safely(self.backend.hold):
                return
            self.holding = True
            self.holds += 1
            self.last_hold = {
                "tick": self.tick,
                "idle_periods": idle,
                "after_s": time.monotonic() - self.last_action_time,
            }
            log.warning("watchdog: no command for %d periods, holding the robot", idle)
            self._send(Message("telemetry", 0, {"event": "watchdog_hold", "tick": self.tick}), stream=True)
        if self.pending_rid is not None:
            self.acted_ticks += 1
            extra = {"tick": self.tick, "breaches": self.pending_breaches + t.info.pop("safety", [])}
            self._send(tick_message("obs", self.pending_rid, t, extra))
            self.pending_rid = None
            if self.queued is not None:
                queued, self.queued = self.queued, None
                self._apply(queued)
        elif self.observe_rid is not None:  # an observed chunk: every tick's obs, with what ran
            dry = ran is None and not len(self.plan)
            extra = {"tick": self.tick, "stream": True, "plan": ran, "dry": dry, "holding": self.holding,
                     "breaches": (ran or {}).get("breaches", []) + t.info.pop("safety", [])}  # fmt: skip
            self._send(tick_message("obs", self.observe_rid, t, extra))
            if dry:  # the schedule ran out: this was the stream's last message
                self.observe_rid = None
        else:  # nobody is owed a reply: still stream the state (latest-value stream)
            extra = {"tick": self.tick, "holding": self.holding, **({"plan": ran} if ran else {})}
            self._send(tick_message("state", 0, t, extra), stream=True)

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
            self._flush()
            self._on_tick()
            self._snapshot()
            if self.blocked_since is not None and now - self.blocked_since > self.daemon_timeout_s:
                log.error("the edge daemon has not read for %.1f s; holding the robot and exiting",
                          now - self.blocked_since)  # fmt: skip
                break
            self.next_due += self.period
            if time.monotonic() > self.next_due:  # a whole period lost: re-anchor
                self.timing.overruns += 1
                self.next_due = time.monotonic() + self.period

    def telemetry(self) -> dict[str, Any]:
        return {
            **self.timing.summary(max_age_s=SNAPSHOT_S),
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
            "chunks": {**self.chunks, "scheduled": len(self.plan)},
            "last_hold": self.last_hold,
            "holding": self.holding,
            "stopped": self.stopped,
            "fault": self.fault,
            "sends": dict(self.sends),
            **self.backend.telemetry(),
        }
