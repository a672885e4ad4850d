"""A scripted "synthetic human" that operates a SpaceMouse, for tests and benchmarks.

An expert controller decides the base-frame motion and gripper it wants; this module
turns that into exactly what a SpaceMouse would send (the inverse axis map, the deadzone,
int16 counts in HID reports, button press/release reports) and feeds the reports
through the device's own parser. A gating rule decides when the human takes over (the
intervene button) and hands back, as a person supervising a policy would.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlinf_user.robots.teleop.spacemouse import SpaceMouse, button_report, translation_report


class SpaceMouseHand:
    """Moves a SpaceMouse's cap and presses its buttons by feeding HID reports."""

    def __init__(self, device: SpaceMouse, gripper_button: int = 0, intervene_button: int = 1):
        self.device = device
        self.gripper_button = gripper_button
        self.intervene_button = intervene_button
        self._inv_t = np.linalg.inv(device._tmap)
        self._inv_r = np.linalg.inv(device._rmap)

    def _counts(self, base: np.ndarray, inv: np.ndarray, gain: float) -> np.ndarray:
        dz = self.device.deadzone
        v = np.clip(np.asarray(base, np.float64) / max(gain, 1e-9), -1, 1)
        # undo the deadzone rescaling so the parsed value comes back as ``base``
        raw = np.where(np.abs(v) < 1e-6, 0.0, np.sign(v) * (np.abs(v) * (1 - dz) + dz))
        dev = inv @ raw
        return np.clip(np.round(dev * self.device.full_scale), -32768, 32767).astype(int)

    def move(self, motion: np.ndarray) -> None:
        """Deflect the cap so the device reports ``motion`` (6 values, base frame)."""
        t = self._counts(motion[:3], self._inv_t, self.device.gains[0])
        r = self._counts(motion[3:6], self._inv_r, self.device.gains[1])
        self.device.feed(translation_report(t, r))

    def click(self, button: int) -> None:
        self.device.feed(button_report(1 << button))
        self.device.feed(button_report(0))

    def set_gripper(self, closed: bool) -> None:
        if (self.device.read_gripper() > 0) != closed:
            self.click(self.gripper_button)

    def set_engaged(self, engaged: bool) -> None:
        if self.device.engaged != engaged:
            self.click(self.intervene_button)


class SyntheticHuman:
    """Each step: look at the observation, decide whether to be in control (``gate``),
    and if so operate the device like ``expert`` says. Used as ``before_step``."""

    def __init__(
        self,
        hand: SpaceMouseHand,
        expert: Callable[[dict], np.ndarray],
        gate: Callable[[dict, np.ndarray], bool] | None = None,
    ):
        self.hand = hand
        self.expert = expert
        self.gate = gate  # None: always in control (teleoperation)

    def reset(self) -> None:
        """A new episode: the expert starts over, hands off the device."""
        if hasattr(self.expert, "reset"):
            self.expert.reset()
        self.hand.move(np.zeros(6))

    def __call__(self, obs: dict) -> None:
        want = self.expert(obs)
        engage = True if self.gate is None else bool(self.gate(obs, want))
        if self.gate is not None:
            self.hand.set_engaged(engage)
        if engage:
            self.hand.set_gripper(bool(want[6] > 0))
            self.hand.move(want[:6])
        else:
            self.hand.move(np.zeros(6))  # hands off the cap


class PickCubeExpert:
    """Scripted pick for gym_hil's PandaPickCube (state: tcp at 15:18, block at 18:21):
    above the block, down, close, lift. Contract action, translation scaled by ``step``."""

    def __init__(self, step: float = 0.025, grasp_dz: float = 0.0):
        self.step = step
        self.grasp_dz = grasp_dz
        self.reset()

    def reset(self) -> None:
        self.phase = 0
        self.closing = 0

    def __call__(self, obs: dict) -> np.ndarray:
        s = obs["state"]
        tcp, block = s[15:18], s[18:21]
        a = np.zeros(7, np.float32)
        a[6] = -1.0
        if self.phase == 0:
            target = block + [0.0, 0.0, 0.06]
            if np.linalg.norm(target - tcp) < 0.01:
                self.phase = 1
        if self.phase == 1:
            target = block + [0.0, 0.0, self.grasp_dz]
            if np.linalg.norm(target - tcp) < 0.008:
                self.phase = 2
        if self.phase == 2:
            target = block + [0.0, 0.0, self.grasp_dz]
            a[6] = 1.0
            self.closing += 1
            if self.closing > 4:
                self.phase = 3
        if self.phase == 3:
            target = tcp + [0.0, 0.0, 0.1]
            a[6] = 1.0
            if np.linalg.norm(block[:2] - tcp[:2]) > 0.03 or block[2] < tcp[2] - 0.05:  # dropped it
                self.reset()
        a[:3] = np.clip((target - tcp) / self.step, -1.0, 1.0)
        return a
