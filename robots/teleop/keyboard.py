"""Keyboard teleop over evdev key events.

Default bindings (Linux key codes; base frame)::

    W / S   +x / -x        I / K   +rx / -rx       Space      gripper toggle
    A / D   +y / -y        J / L   +ry / -ry       Left Shift deadman (held)
    E / Q   +z / -z        U / O   +rz / -rz       Tab        intervene toggle
    Enter   success        Backspace failure       R re-record      Esc stop
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlinf_user.robots.teleop.device import Source, TeleopDevice
from rlinf_user.robots.teleop.evdev_input import EV_KEY, parse_events

KEY = {
    "ESC": 1, "BACKSPACE": 14, "TAB": 15, "Q": 16, "W": 17, "E": 18, "R": 19, "U": 22, "I": 23, "O": 24,
    "ENTER": 28, "A": 30, "S": 31, "D": 32, "J": 36, "K": 37, "L": 38, "LEFTSHIFT": 42, "SPACE": 57,
}  # fmt: skip

DEFAULT_MOTION = {
    "W": (0, 1), "S": (0, -1), "A": (1, 1), "D": (1, -1), "E": (2, 1), "Q": (2, -1),
    "I": (3, 1), "K": (3, -1), "J": (4, 1), "L": (4, -1), "U": (5, 1), "O": (5, -1),
}  # fmt: skip
DEFAULT_BUTTONS = {
    "SPACE": "gripper", "LEFTSHIFT": "deadman", "TAB": "intervene", "ENTER": "success",
    "BACKSPACE": "failure", "R": "rerecord", "ESC": "stop",
}  # fmt: skip


class Keyboard(TeleopDevice):
    kind = "keyboard"

    def __init__(
        self,
        source: Source,
        speed: float = 0.6,
        motion_keys: Mapping[str, tuple[int, int]] | None = None,
        buttons: Mapping[str, str] | None = None,
        name: str | None = None,
    ):
        super().__init__(source, name)
        self.speed = float(speed)
        self.motion_keys = {KEY[k]: tuple(v) for k, v in (motion_keys or DEFAULT_MOTION).items()}
        self.button_keys = {KEY[k]: v for k, v in (buttons or DEFAULT_BUTTONS).items()}
        self._held: set[int] = set()

    def _apply(self, report) -> None:
        for ev in parse_events(bytes(report)):
            if ev.type != EV_KEY or ev.value == 2:  # ignore autorepeat
                continue
            pressed = ev.value == 1
            if ev.code in self.motion_keys:
                (self._held.add if pressed else self._held.discard)(ev.code)
            elif ev.code in self.button_keys:
                self._button(self.button_keys[ev.code], pressed)
        m = np.zeros(6, np.float32)
        for code in self._held:
            axis, sign = self.motion_keys[code]
            m[axis] += sign * self.speed
        self._motion = np.clip(m, -1.0, 1.0)
