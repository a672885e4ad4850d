"""The supervisor in the acting loop of ``rlinf-user train`` (HIL-SERL style): gated
take-over through a device's real report format, and a device lost mid-run."""

import numpy as np

from rlinf_user.robots.teleop.device import QueueSource
from rlinf_user.robots.teleop.spacemouse import SpaceMouse, button_report, translation_report
from rlinf_user.teleop.supervisor import Supervisor

POLICY = np.array([0.5, 0, 0, 0, 0, 0, -1], np.float32)


def spacemouse():
    return SpaceMouse(QueueSource())


def test_motion_alone_does_not_take_over_the_button_does_and_ramps():
    dev = spacemouse()
    sup = Supervisor(dev, ramp_steps=2)
    sup.begin_episode()
    dev.feed(translation_report([0, 350, 0], [0, 0, 0]))  # the cap is pushed, no button
    d = sup.decide({}, POLICY)
    assert not d.intervention and np.allclose(d.action, POLICY)
    dev.feed(button_report(0b10))  # intervene toggle (button 1) pressed and released
    dev.feed(button_report(0))
    half = sup.decide({}, POLICY)
    full = sup.decide({}, POLICY)
    assert half.intervention and 0 < half.alpha < 1 and full.alpha == 1.0
    assert np.allclose(full.action[:6], full.human_action[:6])
    assert not np.allclose(half.action[:3], full.action[:3])  # a blend on the way over
    sup.begin_episode()  # a new episode: control is back with the policy
    assert not sup.decide({}, POLICY).intervention


def test_a_lost_device_leaves_the_policy_acting_and_says_why():
    src = QueueSource()
    dev = SpaceMouse(src).start()
    sup = Supervisor(dev)
    src.unplug()
    for _ in range(100):
        if dev._error is not None:
            break
        __import__("time").sleep(0.01)
    assert sup.decide({}, POLICY) is None
    assert "unplugged" in sup.lost
    assert sup.decide({}, POLICY) is None  # stays lost; no exception into the worker
    sup.begin_episode()
    sup.close()


def test_scripted_supervisor_takes_over_only_on_a_stall():
    calls = []

    class Human:
        def __init__(self, dev):
            self.dev = dev

        def __call__(self, obs, policy_action):
            calls.append(policy_action)
            if obs.get("stalled") and not self.dev.engaged:
                self.dev.feed(button_report(0b10))
                self.dev.feed(button_report(0))

    dev = spacemouse()
    sup = Supervisor(dev, ramp_steps=1, human=Human(dev))
    assert not sup.decide({"stalled": False}, POLICY).intervention
    assert sup.decide({"stalled": True}, POLICY).intervention
    assert len(calls) == 2 and np.allclose(calls[0], POLICY)  # it saw what the policy proposed
