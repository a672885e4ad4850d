"""Who acts on each step: the policy, the human, or a blend while control changes hands.

The human takes over only through a deliberate gate (a deadman button held, or an
intervention toggle), never because the device moved. Hand-over and hand-back ramp the
executed motion linearly over ``ramp_steps`` steps between the two sources, so the robot
never sees a step change in commanded velocity; at take-over the device's latched gripper
is aligned with what the policy was commanding, so grabbing the device does not open or
close the gripper.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rlinf_user.robots.teleop.command import TeleopCommand


@dataclasses.dataclass
class GateDecision:
    action: np.ndarray  # what is sent to the env
    human_action: np.ndarray  # what the human asked for (the HG-DAgger label)
    intervention: bool  # the human acted on this step (alpha > 0)
    alpha: float  # share of the human in the executed motion
    took_over: bool = False
    handed_back: bool = False


class InterventionGate:
    def __init__(self, ramp_steps: int = 3):
        if ramp_steps < 1:
            raise ValueError("ramp_steps must be >= 1")
        self.ramp_steps = int(ramp_steps)
        self.alpha = 0.0
        self.engaged = False
        self.takeovers = 0

    def reset(self) -> None:
        self.alpha = 0.0
        self.engaged = False

    def step(self, policy_action: np.ndarray, cmd: TeleopCommand, device=None) -> GateDecision:
        policy_action = np.asarray(policy_action, np.float32)
        took_over = cmd.engaged and not self.engaged
        handed_back = self.engaged and not cmd.engaged
        if took_over:
            self.takeovers += 1
            if device is not None:  # no gripper jump at hand-over
                device.set_gripper(bool(policy_action[6] > 0))
                cmd = dataclasses.replace(cmd, gripper=1.0 if policy_action[6] > 0 else -1.0)
        self.engaged = cmd.engaged
        step = 1.0 / self.ramp_steps
        self.alpha = min(1.0, self.alpha + step) if cmd.engaged else max(0.0, self.alpha - step)
        human = cmd.action()
        action = policy_action.copy()
        action[:6] = (1.0 - self.alpha) * policy_action[:6] + self.alpha * human[:6]
        action[6] = human[6] if self.alpha >= 0.5 else policy_action[6]
        return GateDecision(
            action=action.astype(np.float32),
            human_action=human,
            intervention=self.alpha > 0.0,
            alpha=self.alpha,
            took_over=took_over,
            handed_back=handed_back,
        )
