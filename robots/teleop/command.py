"""What a teleop device says at one instant, in the env contract's terms."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

# Episode and session controls a device can raise (one-shot events).
EVENTS = ("success", "failure", "rerecord", "stop", "intervene")


class DeviceDisconnected(RuntimeError):
    """The device stopped answering (unplugged, receiver out of range, permissions)."""


@dataclasses.dataclass
class TeleopCommand:
    """``motion``: 6 values in [-1, 1] = (dx, dy, dz, drx, dry, drz) in the robot base frame
    after the device's axis map; ``gripper``: -1 open / +1 closed (the device's latched
    gripper state); ``engaged``: a human is in control (deadman held or toggle on);
    ``events``: one-shot controls since the last read; ``stamp``: time.monotonic() of the
    newest device report."""

    motion: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(6, np.float32))
    gripper: float = -1.0
    engaged: bool = False
    events: frozenset[str] = frozenset()
    stamp: float = 0.0

    def action(self) -> np.ndarray:
        """The 7-D contract action this command asks for."""
        a = np.zeros(7, np.float32)
        a[:6] = np.clip(self.motion, -1.0, 1.0)
        a[6] = self.gripper
        return a

    def moving(self, threshold: float = 0.05) -> bool:
        return bool(np.max(np.abs(self.motion)) > threshold)


def now() -> float:
    return time.monotonic()
