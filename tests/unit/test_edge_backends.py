"""ArmBackend's episode logic around a driver.

franky-sim has no safety reflexes, so a reflex cannot be produced there; this driver
double stands in for a Franka that reports a fault (the only thing it scripts), to check
that the next reset recovers before homing, and that soft resets hold instead of homing.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlinf_user.edge.backends import ArmBackend
from rlinf_user.edge.safety import SafetyConfig
from rlinf_user.robots.arm import ArmDriver, ArmError, ArmState


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


class FlakyLink(FaultyArm):
    """A driver whose reads raise as libfranka does after a UDP receive timeout."""

    def __init__(self):
        super().__init__(recovers=True)
        self.down = False

    def read(self):
        if self.down:
            raise ArmError("cannot read the Franka state: NetworkException: libfranka: UDP receive: Timeout")
        return self._state()

    def recover(self):
        self.down = False
        return super().recover()


def test_a_robot_link_error_is_a_reported_fault_that_reset_recovers():
    """The real control loop over real ZMQ sockets: a read error holds the arm, refuses
    actions with the reason, keeps the loop ticking, and the next reset recovers."""
    from loop_harness import running_loop

    arm = FlakyLink()
    with running_loop(arm, hz=50, watchdog_periods=2) as (loop, ask, _collect, _states):
        assert ask("reset", 1).kind == "obs"
        assert ask("act", 2, action=np.zeros(7, np.float32)).kind == "obs"
        arm.down = True
        fault = ask("act", 3, action=np.zeros(7, np.float32))  # answered at the next tick
        assert fault.kind == "error" and fault.body["code"] == "backend" and "UDP" in fault.body["message"]
        refused = ask("act", 4, action=np.zeros(7, np.float32))
        assert refused.body["code"] == "state" and "fault" in refused.body["message"]
        ticks = loop.tick
        time.sleep(0.1)
        assert loop.tick > ticks and loop.running  # the loop keeps ticking
        assert "hold" in arm.calls
        assert ask("reset", 5).kind == "obs"  # recovery, then homing
        assert arm.calls[-2:] == ["recover", "home"] and loop.fault is None
        assert ask("act", 6, action=np.zeros(7, np.float32)).kind == "obs"
