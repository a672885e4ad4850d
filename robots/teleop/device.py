"""A teleop device: a report source read on its own thread, folded into a latest state.

Sources deliver the device's raw wire format (HID input reports, evdev input events), so
the same parsing runs on a live device, a recording, or generated reports in tests.
"""

from __future__ import annotations

import abc
import logging
import threading
from typing import Any, Protocol

import numpy as np

from rlinf_user.robots.teleop.command import DeviceDisconnected, TeleopCommand, now

log = logging.getLogger(__name__)


class Source(abc.ABC):
    """Yields raw reports: ``read(timeout)`` -> a report or None on timeout; raises
    :class:`DeviceDisconnected` when the device is gone."""

    name = "source"

    @abc.abstractmethod
    def read(self, timeout: float) -> Any: ...

    def close(self) -> None:  # noqa: B027 - optional
        pass


class QueueSource(Source):
    """Reports pushed by a program (a recording being replayed, a scripted human)."""

    name = "queue"

    def __init__(self):
        import queue

        self._q: queue.Queue = queue.Queue()
        self._closed = False

    def push(self, report: Any) -> None:
        self._q.put(report)

    def unplug(self) -> None:
        """Behave like a device pulled out of its port."""
        self._q.put(DeviceDisconnected("device unplugged"))

    def read(self, timeout: float) -> Any:
        import queue

        try:
            item = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item


class Teleop(Protocol):
    """What the recorder, the gate and the supervisor use of a teleop device: one
    :class:`TeleopDevice`, or several combined (motion from one, controls from both)."""

    name: str
    kind: str

    @property
    def started(self) -> bool: ...

    @property
    def engaged(self) -> bool: ...

    def start(self) -> Teleop: ...

    def read(self) -> TeleopCommand: ...

    def release(self) -> None: ...

    def set_gripper(self, closed: bool) -> None: ...

    def read_gripper(self) -> float: ...

    def close(self) -> None: ...


class TeleopDevice(abc.ABC):
    """Folds reports into state on a thread; :meth:`read` returns a :class:`TeleopCommand`.

    Gripper: a toggle button flips the latched gripper state (open <-> closed).
    Engagement (who is in control): ``deadman`` held, or ``intervene`` toggled on.
    A motion that goes stale (no report for ``stale_s``; a SpaceMouse only reports on
    change, so this is only for devices that stream) is not zeroed here: the gate decides.
    """

    kind = "device"

    def __init__(self, source: Source, name: str | None = None):
        self.source = source
        self.name = name or self.kind
        self._lock = threading.Lock()
        self._motion = np.zeros(6, np.float32)
        self._gripper = -1.0
        self._deadman = False
        self._toggle = False
        self._events: set[str] = set()
        self._stamp = 0.0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reports = 0

    # ---------------------------------------------------------------- lifecycle
    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> TeleopDevice:
        self._thread = threading.Thread(target=self._run, name=f"teleop-{self.name}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.source.close()

    def __enter__(self) -> TeleopDevice:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                report = self.source.read(0.05)
            except DeviceDisconnected as exc:
                log.error("teleop device %s disconnected: %s", self.name, exc)
                with self._lock:
                    self._error = exc
                return
            except Exception as exc:  # noqa: BLE001 - a read error means the device is unusable
                log.error("teleop device %s failed: %s", self.name, exc)
                with self._lock:
                    self._error = DeviceDisconnected(f"{self.name}: {exc}")
                return
            if report is None:
                continue
            try:
                self.feed(report)
            except ValueError as exc:  # a malformed report is dropped, not fatal
                log.warning("teleop device %s: ignoring malformed report: %s", self.name, exc)

    # ---------------------------------------------------------------- state
    def feed(self, report: Any) -> None:
        """Parse one raw report (also callable directly, without the thread)."""
        with self._lock:
            self._apply(report)
            self._stamp = now()
            self.reports += 1

    @abc.abstractmethod
    def _apply(self, report: Any) -> None:
        """Update state from one report; called with the lock held."""

    def _button(self, action: str | None, pressed: bool) -> None:
        if action is None:
            return
        if action == "deadman":
            self._deadman = pressed
        elif not pressed:
            return
        elif action == "gripper":
            self._gripper = -self._gripper
        elif action == "gripper_close":
            self._gripper = 1.0
        elif action == "gripper_open":
            self._gripper = -1.0
        elif action == "intervene":
            self._toggle = not self._toggle
            self._events.add("intervene")
        else:
            self._events.add(action)

    def read(self) -> TeleopCommand:
        """The latest command; one-shot events are returned once. Raises
        :class:`DeviceDisconnected` once the device is gone (motion is never replayed)."""
        with self._lock:
            if self._error is not None:
                raise DeviceDisconnected(f"teleop device {self.name}: {self._error}")
            events = frozenset(self._events)
            self._events.clear()
            return TeleopCommand(
                motion=self._motion.copy(),
                gripper=self._gripper,
                engaged=self._deadman or self._toggle,
                events=events,
                stamp=self._stamp,
            )

    def set_gripper(self, closed: bool) -> None:
        """Align the latched gripper with the robot's (e.g. at a hand-over or reset)."""
        with self._lock:
            self._gripper = 1.0 if closed else -1.0

    def release(self) -> None:
        """Drop the intervention toggle (e.g. at the start of an episode)."""
        with self._lock:
            self._toggle = False

    @property
    def engaged(self) -> bool:
        with self._lock:
            return self._deadman or self._toggle

    def read_gripper(self) -> float:
        with self._lock:
            return self._gripper

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._error is None
