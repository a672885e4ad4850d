"""ArmBackend's episode logic around a driver.

franky-sim has no safety reflexes, so a reflex cannot be produced there; this driver
double stands in for a Franka that reports a fault (the only thing it scripts), to check
that the next reset recovers before homing, and that soft resets hold instead of homing.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_user.edge.arm import ArmDriver, ArmError, ArmState
from rlinf_user.edge.backends import ArmBackend
from rlinf_user.edge.safety import SafetyConfig


class FaultyArm(ArmDriver):
    def __init__(self, recovers: bool):
        self.error: str | None = None
        self.recovers = recovers
        self.calls: list[str] = []

    def _state(self):
        return ArmState(0.0, np.array([0.5, 0, 0.3]), np.array([1.0, 0, 0, 0]), np.zeros(6),
                        np.zeros(7), 0.0, self.error)  # fmt: skip

    def connect(self):
        self.calls.append("connect")

    def home(self):
        self.calls.append("home")
        return self._state()

    def track(self, command):
        self.calls.append("track")

    def read(self):
        return self._state()

    def hold(self):
        self.calls.append("hold")

    def recover(self):
        self.calls.append("recover")
        if self.recovers:
            self.error = None
        return self.recovers

    def stop(self):
        self.calls.append("stop")

    def close(self):
        self.calls.append("close")


def test_reset_recovers_a_faulted_arm_before_homing():
    arm = FaultyArm(recovers=True)
    backend = ArmBackend(arm, SafetyConfig())
    backend.reset(None, {})
    arm.error = "cartesian_reflex"
    backend.reset(None, {"home": False})  # a fault forces recovery + homing
    assert arm.calls[-2:] == ["recover", "home"]
    assert backend.telemetry()["recoveries"] == 1


def test_failed_recovery_is_a_clear_error():
    arm = FaultyArm(recovers=False)
    backend = ArmBackend(arm, SafetyConfig())
    arm.error = "joint_reflex"
    with pytest.raises(ArmError, match="joint_reflex.*recovery failed"):
        backend.reset(None, {})
    assert "home" not in arm.calls


def test_soft_reset_holds_where_the_arm_is():
    arm = FaultyArm(recovers=True)
    backend = ArmBackend(arm, SafetyConfig())
    backend.reset(None, {})
    backend.reset(None, {"home": False})
    assert arm.calls[-1] == "hold" and arm.calls.count("home") == 1
