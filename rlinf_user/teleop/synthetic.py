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

from rlinf_user.env.spec import Col
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


class StallRule:
    """When a supervising person takes over: the task has made no progress for
    ``patience`` steps in a row (``progress(obs)`` has not beaten its best by
    ``min_gain``), the way someone watching sees the robot hover, dither or grab
    nothing. They keep control ``min_control`` steps, then hand back; a policy that
    stalls again is taken over again."""

    def __init__(
        self,
        progress: Callable[[dict], float],
        patience: int = 5,
        min_gain: float = 0.005,
        min_control: int = 8,
    ):
        self.progress, self.patience, self.min_gain, self.min_control = progress, patience, min_gain, min_control
        self.reset()

    def reset(self) -> None:
        self.engaged = False
        self.best: float | None = None
        self.stalled = 0
        self.held = 0

    def __call__(self, obs: dict, want: np.ndarray, policy_action: np.ndarray | None) -> bool:
        p = float(self.progress(obs))
        if self.engaged:
            self.held += 1
            if self.held >= self.min_control:  # hand back from where they got it to
                self.engaged, self.best, self.stalled = False, p, 0
            return self.engaged
        if self.best is None or p > self.best + self.min_gain:
            self.best, self.stalled = p, 0
        else:
            self.stalled += 1
            if self.stalled >= self.patience:
                self.engaged, self.held = True, 0
        return self.engaged


class PickCubeExpert:
    """Scripted pick for gym_hil's PandaPickCube, a function of the state alone (so its
    labels are consistent wherever the policy leaves the robot): state = ..., gripper
    command (14, 0 open .. 1 closed), TCP (15:18), block (18:21). Above the block with the
    gripper open, down, close, lift; a missed or dropped block is released and retried."""

    def __init__(self, step: float = 0.025, grasp_dz: float = 0.0, block_z0: float | None = None, env=None):
        self.step = step
        # an env observed through cameras has no block in its state: read it from the
        # simulator (privileged, as a person sees the scene)
        self.env = getattr(env, "unwrapped", env)
        self.grasp_dz = grasp_dz
        self.block_z0 = block_z0  # resting height of the block; learned from the first state seen

    def reset(self) -> None:
        pass

    def _block(self, s) -> np.ndarray:
        if len(s) >= 21:
            return np.asarray(s[18:21], np.float64)
        if self.env is None or not hasattr(self.env, "block_position"):
            raise ValueError("the scripted pick needs the block's position: a state-only env, or the env itself")
        return self.env.block_position

    def progress(self, obs: dict) -> float:
        """How far the pick has got: minus the path left to the grasp (via the point above
        the block while not lined up), a bonus for closing at the block, then the lift."""
        s = obs[Col.STATE]
        tcp, block = np.asarray(s[15:18], np.float64), self._block(s)
        if self.block_z0 is None:
            self.block_z0 = float(block[2])
        if block[2] > self.block_z0 + 0.01:
            return 1.0 + float(block[2] - self.block_z0)
        grasp = block + [0.0, 0.0, self.grasp_dz]
        if float(np.linalg.norm(block[:2] - tcp[:2])) > 0.008:
            above = grasp + [0.0, 0.0, 0.06]
            return -float(np.linalg.norm(above - tcp)) - 0.06
        left = float(np.linalg.norm(grasp - tcp))
        return -left + (0.05 * float(s[14]) if left < 0.015 else 0.0)

    def __call__(self, obs: dict) -> np.ndarray:
        s = obs[Col.STATE]
        closed = float(s[14]) > 0.5
        tcp, block = np.asarray(s[15:18], np.float64), self._block(s)
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


class ReachExpert:
    """Scripted reach for the reach sim (``Reach``, ``ReachColor``): straight to the goal.
    It reads the goal from the simulator (privileged, as a person sees the scene), so it
    also supervises ``ReachColor``, whose observation holds no goal."""

    def __init__(self, env, step: float = 0.02):
        self.env = getattr(env, "unwrapped", env)
        self.step = step

    def reset(self) -> None:
        pass

    def progress(self, obs: dict) -> float:
        return -float(np.linalg.norm(self.env.goal - self.env.tcp))

    def __call__(self, obs: dict) -> np.ndarray:
        a = np.zeros(7, np.float32)
        a[:3] = np.clip((self.env.goal - self.env.tcp) / self.step, -1.0, 1.0)
        return a


def synthetic_expert(env_cfg, env):
    """The scripted expert a synthetic supervisor uses on this task (``ValueError`` where
    there is none)."""
    if env_cfg.backend == "gym_hil" and "PickCube" in str(env_cfg.task):
        return PickCubeExpert(env=env)
    if env_cfg.backend == "reach":
        return ReachExpert(env, step=float((env_cfg.kwargs or {}).get("max_translation", 0.02)))
    raise ValueError(
        f"no scripted supervisor for {env_cfg.backend}/{env_cfg.task}: synthetic_human=true drives gym_hil's "
        "PandaPickCube and the reach sim (Reach, ReachColor)"
    )
