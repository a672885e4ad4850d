"""Linux input events (evdev): the kernel's ``struct input_event`` and live device sources.

On 64-bit Linux each event is 24 bytes: ``struct timeval`` (two longs), ``__u16 type``,
``__u16 code``, ``__s32 value``. Keyboards and gamepads both speak it; a recording of
``/dev/input/eventN`` is a concatenation of these structs.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from typing import NamedTuple

from rlinf_user.robots.teleop.command import DeviceDisconnected
from rlinf_user.robots.teleop.device import Source

log = logging.getLogger(__name__)

EVENT = struct.Struct("llHHi")
EV_SYN, EV_KEY, EV_ABS = 0x00, 0x01, 0x03


class InputEvent(NamedTuple):
    sec: int
    usec: int
    type: int
    code: int
    value: int


def pack_event(type_: int, code: int, value: int, t: float = 0.0) -> bytes:
    sec = int(t)
    return EVENT.pack(sec, int(round((t - sec) * 1e6)), type_, code, value)


def parse_events(data: bytes) -> Iterator[InputEvent]:
    """Split raw bytes read from an event device into events."""
    if len(data) % EVENT.size:
        raise ValueError(f"{len(data)} bytes is not a whole number of {EVENT.size}-byte input events")
    for off in range(0, len(data), EVENT.size):
        yield InputEvent(*EVENT.unpack_from(data, off))


class EvdevSource(Source):
    """A live keyboard/gamepad through python-evdev (``/dev/input/eventN``, needs the
    ``input`` group). ``read`` returns the raw bytes of the pending events."""

    name = "evdev"

    def __init__(self, path: str | None = None, kind: str = "keyboard", grab: bool = False):
        try:
            import evdev
        except ImportError as exc:
            raise DeviceDisconnected("python-evdev is not installed: pip install evdev") from exc
        self._evdev = evdev
        if path is None:
            path = find_device(kind)
        try:
            self.dev = evdev.InputDevice(path)
        except OSError as exc:
            raise DeviceDisconnected(f"cannot open {path}: {exc} (is the user in the 'input' group?)") from exc
        if grab:
            self.dev.grab()
        log.info("%s: %s (%s)", kind, self.dev.name, path)

    def read(self, timeout: float):
        import select

        try:
            r, _, _ = select.select([self.dev.fd], [], [], timeout)
            if not r:
                return None
            events = list(self.dev.read())
        except OSError as exc:
            raise DeviceDisconnected(f"{self.dev.path}: {exc}") from exc
        return b"".join(pack_event(e.type, e.code, e.value, e.sec + e.usec * 1e-6) for e in events)

    def close(self) -> None:
        try:
            self.dev.close()
        except Exception:  # noqa: BLE001
            pass


def find_device(kind: str) -> str:
    """The first event device that looks like a ``keyboard`` or a ``gamepad``."""
    import evdev

    for path in evdev.list_devices():
        try:
            dev = evdev.InputDevice(path)
            caps = dev.capabilities()
        except OSError:
            continue
        keys = set(caps.get(EV_KEY, []))
        if kind == "keyboard" and {30, 31, 32, 17}.issubset(keys):  # KEY_A, S, D, W
            return path
        if kind == "gamepad" and 304 in keys and EV_ABS in caps:  # BTN_SOUTH + sticks
            return path
    raise DeviceDisconnected(f"no {kind} found under /dev/input (is the user in the 'input' group?)")
