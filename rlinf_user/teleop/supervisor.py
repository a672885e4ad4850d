"""A person supervising an acting policy through a teleop device (HIL-SERL style).

Used by the env worker that owns the supervised env during ``rlinf-user train``: each step
the policy proposes, the device is read, and the :class:`InterventionGate` decides who
acts. A scripted supervisor (``synthetic_human``) drives a simulated SpaceMouse through
its real HID parser instead of a person.

A device that is lost mid-run does not stop training: the supervisor logs it once, the
policy acts alone from then on, and ``lost`` says why.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from rlinf_user.robots.teleop.command import DeviceDisconnected
from rlinf_user.teleop.gate import GateDecision, InterventionGate

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, device, ramp_steps: int = 3, human=None, rate_hz: float = 0.0):
        self.device = device
        self.gate = InterventionGate(ramp_steps)
        self.human = human  # scripted: called with (obs, policy_action) before each read
        self.period = 1.0 / rate_hz if rate_hz > 0 else 0.0
        self.lost: str | None = None
        self._next = 0.0

    @classmethod
    def from_config(cls, cfg, env=None) -> Supervisor:
        """``env``: the supervised env (a scripted human reads what its cameras show from it)."""
        iv = cfg.intervention
        if iv.synthetic_human:
            from rlinf_user.robots.teleop.device import QueueSource
            from rlinf_user.robots.teleop.spacemouse import SpaceMouse
            from rlinf_user.teleop.synthetic import PickCubeExpert, SpaceMouseHand, StallRule, SyntheticHuman

            device = SpaceMouse(QueueSource())
            expert = PickCubeExpert(env=env)
            stall = StallRule(expert.progress, patience=int(iv.patience), min_control=int(iv.min_control))
            human = SyntheticHuman(SpaceMouseHand(device), expert, stall)
            return cls(device, iv.ramp_steps, human)
        from rlinf_user.robots.teleop.factory import open_teleop

        device = open_teleop(cfg.teleop)
        if not device.started:
            device.start()
        # A person needs the env at human speed: a simulator is paced to the teleop rate
        # (a robot's edge already steps at its control rate; pacing on top costs nothing).
        return cls(device, iv.ramp_steps, rate_hz=float(cfg.teleop.rate_hz))

    def begin_episode(self) -> None:
        self.gate.reset()
        if self.lost is None:
            self.device.release()
        if self.human is not None and hasattr(self.human, "reset"):
            self.human.reset()

    def decide(self, obs: dict, policy_action: np.ndarray) -> GateDecision | None:
        """Who acts on this step; None once the device is lost (the policy acts alone)."""
        if self.lost is not None:
            return None
        if self.period:
            now = time.monotonic()
            if now < self._next:
                time.sleep(self._next - now)
            self._next = max(now, self._next) + self.period
        if self.human is not None:
            self.human(obs, policy_action)
        try:
            cmd = self.device.read()
        except DeviceDisconnected as exc:
            self.lost = str(exc)
            log.error("teleop device lost (%s): the policy acts alone from now on", exc)
            return None
        return self.gate.step(policy_action, cmd, self.device)

    def close(self) -> None:
        try:
            self.device.close()
        except Exception:  # noqa: BLE001 - best effort on shutdown
            log.debug("closing the teleop device failed", exc_info=True)
