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
        gate: Callable[[dict, np.ndarray, np.ndarray | None], bool] | None = None,
    ):
        self.hand = hand
        self.expert = expert
        self.gate = gate  # None: always in control (teleoperation)

    def reset(self) -> None:
        """A new episode: the expert starts over, hands off the device."""
        if hasattr(self.expert, "reset"):
            self.expert.reset()
        if hasattr(self.gate, "reset"):
            self.gate.reset()
        self.hand.move(np.zeros(6))

    def __call__(self, obs: dict, policy_action: np.ndarray | None = None) -> None:
        want = self.expert(obs)
        engage = True if self.gate is None else bool(self.gate(obs, want, policy_action))
        if self.gate is not None:
            self.hand.set_engaged(engage)
        if engage:
            self.hand.set_gripper(bool(want[6] > 0))
            self.hand.move(want[:6])
        else:
            self.hand.move(np.zeros(6))  # hands off the cap


class DeviationRule:
    """When a supervising person takes over: for ``patience`` steps in a row the policy
    proposes to move the tool somewhere they would not (cosine similarity of the
    translations below ``min_cos`` while they want to move) or to open/close the gripper
    against their intent. They keep control at least ``min_control`` steps and hand back
    once the policy's proposal agrees with them again."""

    def __init__(self, min_cos: float = 0.0, patience: int = 3, min_control: int = 10, min_motion: float = 0.5):
        self.min_cos, self.patience, self.min_control, self.min_motion = min_cos, patience, min_control, min_motion
        self.reset()

    def reset(self) -> None:
        self.engaged = False
        self.bad = 0
        self.held = 0

    def disagrees(self, want: np.ndarray, policy_action: np.ndarray) -> bool:
        w, p = np.asarray(want, np.float64), np.asarray(policy_action, np.float64)
        if np.sign(w[6]) != np.sign(p[6]):
            return True
        nw, np_ = np.linalg.norm(w[:3]), np.linalg.norm(p[:3])
        if nw < self.min_motion:
            return False  # small corrections are not worth taking over for
        return np_ < 0.1 * nw or float(w[:3] @ p[:3]) / (nw * np_) < self.min_cos

    def __call__(self, obs: dict, want: np.ndarray, policy_action: np.ndarray | None) -> bool:
        if policy_action is None:
            return True
        bad = self.disagrees(want, policy_action)
        if self.engaged:
            self.held += 1
            if self.held >= self.min_control and not bad:
                self.engaged, self.bad = False, 0
        else:
            self.bad = self.bad + 1 if bad else 0
            if self.bad >= self.patience:
                self.engaged, self.held = True, 0
        return self.engaged


class PickCubeExpert:
    """Scripted pick for gym_hil's PandaPickCube, a function of the state alone (so its
    labels are consistent wherever the policy leaves the robot): state = ..., gripper
    command (14, 0 open .. 1 closed), TCP (15:18), block (18:21). Above the block with the
    gripper open, down, close, lift; a missed or dropped block is released and retried."""

    def __init__(self, step: float = 0.025, grasp_dz: float = 0.0, block_z0: float | None = None):
        self.step = step
        self.grasp_dz = grasp_dz
        self.block_z0 = block_z0  # resting height of the block; learned from the first state seen

    def reset(self) -> None:
        pass

    def __call__(self, obs: dict) -> np.ndarray:
        s = obs["state"]
        closed = float(s[14]) > 0.5
        tcp, block = np.asarray(s[15:18], np.float64), np.asarray(s[18:21], np.float64)
        if self.block_z0 is None:
            self.block_z0 = float(block[2])
        a = np.zeros(7, np.float32)
        xy_err = float(np.linalg.norm(block[:2] - tcp[:2]))
        grasp = block + [0.0, 0.0, self.grasp_dz]
        lifted = block[2] > self.block_z0 + 0.01
        if closed and (lifted or (xy_err < 0.01 and abs(tcp[2] - grasp[2]) < 0.012)):
            target, a[6] = tcp + [0.0, 0.0, 0.1], 1.0  # holding it: lift
        elif closed:
            target, a[6] = tcp + [0.0, 0.0, 0.05], -1.0  # closed on nothing: open and back off
        elif xy_err > 0.008:
            target, a[6] = block + [0.0, 0.0, 0.06], -1.0  # line up above it
            if tcp[2] < block[2] + 0.04:
                target = np.array([tcp[0], tcp[1], block[2] + 0.06])  # clear the block first
        elif tcp[2] - grasp[2] > 0.006:
            target, a[6] = grasp, -1.0  # straight down
        else:
            target, a[6] = grasp, 1.0  # at the block: close
        a[:3] = np.clip((target - tcp) / self.step, -1.0, 1.0)
        return a
