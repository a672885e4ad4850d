"""Gamepad teleop (Xbox-style layout as the Linux ``xpad`` driver reports it) over evdev.

Default mapping (base frame)::

    left stick   up/down -> +x/-x, left/right -> +y/-y
    triggers     RT -> +z, LT -> -z
    right stick  left/right -> +rx/-rx, up/down -> +ry/-ry
    d-pad        left/right -> +rz/-rz
    LB held      deadman            RB       gripper toggle
    A            success            B        failure
    Y (north)    re-record          Start    intervene toggle      Back/Select  stop

Axis ranges come from config (``xpad``: sticks -32768..32767, triggers 0..1023).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlinf_user.robots.teleop.axes import deadzone
from rlinf_user.robots.teleop.device import Source, TeleopDevice
from rlinf_user.robots.teleop.evdev_input import EV_ABS, EV_KEY, parse_events

ABS_X, ABS_Y, ABS_Z, ABS_RX, ABS_RY, ABS_RZ, ABS_HAT0X, ABS_HAT0Y = 0, 1, 2, 3, 4, 5, 16, 17
BTN = {"SOUTH": 304, "EAST": 305, "NORTH": 307, "WEST": 308, "TL": 310, "TR": 311, "SELECT": 314, "START": 315}
DEFAULT_BUTTONS = {
    "TL": "deadman", "TR": "gripper", "SOUTH": "success", "EAST": "failure",
    "NORTH": "rerecord", "START": "intervene", "SELECT": "stop",
}  # fmt: skip


class Gamepad(TeleopDevice):
    kind = "gamepad"

    def __init__(
        self,
        source: Source,
        stick_range: tuple[int, int] = (-32768, 32767),
        trigger_range: tuple[int, int] = (0, 1023),
        deadzone: float = 0.12,
        buttons: Mapping[str, str] | None = None,
        name: str | None = None,
    ):
        super().__init__(source, name)
        self.stick_range = tuple(stick_range)
        self.trigger_range = tuple(trigger_range)
        self.deadzone = float(deadzone)
        self.button_codes = {BTN[k]: v for k, v in (buttons or DEFAULT_BUTTONS).items()}
        self._abs = {ABS_X: 0.0, ABS_Y: 0.0, ABS_Z: 0.0, ABS_RX: 0.0, ABS_RY: 0.0, ABS_RZ: 0.0, ABS_HAT0X: 0.0}

    def _norm_stick(self, v: int) -> float:
        lo, hi = self.stick_range
        return float(np.clip((2.0 * (v - lo) / (hi - lo)) - 1.0, -1.0, 1.0))

    def _norm_trigger(self, v: int) -> float:
        lo, hi = self.trigger_range
        return float(np.clip((v - lo) / (hi - lo), 0.0, 1.0))

    def _apply(self, report) -> None:
        for ev in parse_events(bytes(report)):
            if ev.type == EV_ABS:
                if ev.code in (ABS_X, ABS_Y, ABS_RX, ABS_RY):
                    self._abs[ev.code] = self._norm_stick(ev.value)
                elif ev.code in (ABS_Z, ABS_RZ):
                    self._abs[ev.code] = self._norm_trigger(ev.value)
                elif ev.code == ABS_HAT0X:
                    self._abs[ABS_HAT0X] = float(np.sign(ev.value))
            elif ev.type == EV_KEY and ev.code in self.button_codes and ev.value in (0, 1):
                self._button(self.button_codes[ev.code], ev.value == 1)
        a = self._abs
        # stick "up" reports negative y
        t = np.array([-a[ABS_Y], -a[ABS_X], a[ABS_RZ] - a[ABS_Z]], np.float32)
        r = np.array([a[ABS_RX], -a[ABS_RY], -a[ABS_HAT0X]], np.float32)
        self._motion = np.concatenate([deadzone(t, self.deadzone), deadzone(r, self.deadzone)])
