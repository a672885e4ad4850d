"""Chunked execution on the edge: the schedule's arithmetic, and the real control loop over
real ZMQ sockets running a chunk one action per tick, dropping late actions, blending the
seam, holding when the schedule runs dry, and refusing a bad chunk whole."""

from __future__ import annotations

import time

import numpy as np
import pytest
from loop_harness import running_loop

from rlinf_user.edge.plan import ActionPlan
from rlinf_user.edge.protocol import Message, ProtocolError, validate_request
from rlinf_user.robots.arm import ArmDriver, ArmState


def test_a_plan_drops_late_actions_keeps_the_old_head_and_blends_the_seam():
    p = ActionPlan()
    a = np.arange(10, dtype=float)[:, None].repeat(7, 1)  # action k = k
    info = p.replace(a, first_tick=5, next_tick=8, blend=0, rid=1)  # 3 ticks of latency
    assert info == {"queued": 7, "late": 3, "first_tick": 8, "blended": 0} and p.left(8) == 7
    assert p.pop(8)[0] == 3 and p.pop(9)[0] == 4
    # a new chunk computed at tick 9, for ticks 10..; it arrives before tick 11 runs
    b = np.full((6, 7), 100.0)
    info = p.replace(b, first_tick=10, next_tick=11, blend=2, rid=2)
    assert info["late"] == 1 and info["blended"] == 2
    assert p.pop(11)[0] == pytest.approx(6 * 2 / 3 + 100 / 3)  # w = 1/3 toward the new chunk
    assert p.pop(12)[0] == pytest.approx(7 / 3 + 200 / 3)
    assert p.pop(13)[0] == 100.0
    # a chunk that starts later than the next tick leaves the old actions until it does
    q = ActionPlan()
    q.replace(a, 1, 1, 0, 1)
    q.replace(b, 4, 2, 0, 2)
    assert [q.pop(t)[0] for t in range(2, 6)] == [1.0, 2.0, 100.0, 100.0]
    assert q.pop(100) is None and len(q) == 0  # past its end: nothing, and empty


def test_a_bad_chunk_is_refused_whole():
    def check(arrays, body=None):
        validate_request(Message("chunk", 1, body or {}, arrays))

    check({"actions": np.zeros((5, 7), np.float32)}, {"start_tick": 3, "blend": 2})
    bad = np.zeros((5, 7), np.float32)
    bad[3, 2] = np.nan
    with pytest.raises(ProtocolError, match="chunk action 3 is not finite: the whole chunk refused"):
        check({"actions": bad})
    for arrays, body, match in [({}, {}, "needs an 'actions'"), ({"actions": np.zeros((5, 6), np.float32)}, {}, r"\(H, 7\)"),
                                ({"actions": np.zeros((300, 7), np.float32)}, {}, "H <= 256"),
                                ({"actions": np.zeros((2, 7), np.int32)}, {}, "floats"),
                                ({"actions": np.zeros((2, 7), np.float32)}, {"start_tick": -1}, "start_tick"),
                                ({"actions": np.zeros((2, 7), np.float32)}, {"blend": True}, "blend")]:  # fmt: skip
        with pytest.raises(ProtocolError, match=match):
            check(arrays, body)


class RecordingArm(ArmDriver):
    """A driver that records every command the backend sends it (the arm itself is not
    what is tested here: the schedule and the loop are)."""

    def __init__(self):
        self.tracked: list = []
        self.holds = 0

    def _state(self):
        return ArmState(0.0, np.array([0.5, 0, 0.3]), np.array([1.0, 0, 0, 0]), np.zeros(6), np.zeros(7), 0.0, None)

    def connect(self):
        pass

    def home(self):
        return self._state()

    def track(self, command):
        self.tracked.append(command)

    def read(self):
        return self._state()

    def hold(self):
        self.holds += 1

    def recover(self):
        return True

    def stop(self):
        pass

    def close(self):
        pass


@pytest.fixture()
def loop():
    arm = RecordingArm()
    with running_loop(arm, hz=50, watchdog_periods=3, name="chunks") as (control, ask, collect, states):
        yield control, arm, ask, collect, states


def test_the_loop_runs_a_chunk_one_action_per_tick_then_holds(loop):
    control, arm, ask, collect, states = loop
    refused = ask("chunk", 1, actions=np.zeros((4, 7), np.float32))
    assert refused.kind == "error" and "no episode" in refused.body["message"]
    assert ask("reset", 2).kind == "obs"
    actions = np.zeros((10, 7), np.float32)
    actions[:, 0] = np.linspace(0.1, 1.0, 10)
    ack = ask("chunk", 3, actions=actions)
    assert ack.kind == "ack" and ack.body["queued"] == 10 and ack.body["late"] == 0
    collect(0.5)  # 25 ticks at 50 Hz: 10 actions, then the watchdog (3 periods) holds
    for _ in range(30):  # busy cores can slow the loop's thread: wait for the hold, not a fixed time
        if control.holding:
            break
        collect(0.1)
    ran = [m.body["plan"] for m in states if "plan" in m.body]
    assert [round(r["applied"][0], 3) for r in ran] == [round(float(x), 3) for x in actions[:, 0]]
    ticks = [m.body["tick"] for m in states if "plan" in m.body]
    assert np.all(np.diff(ticks) == 1)  # one per tick, no gaps
    assert len(arm.tracked) == 10 and control.holds == 1 and control.holding
    tel = control.telemetry()
    assert tel["chunks"]["received"] == 1 and tel["chunks"]["scheduled"] == 0 and tel["applied"] == 10


def test_a_late_chunk_skips_the_past_and_an_act_replaces_a_schedule(loop):
    control, arm, ask, collect, states = loop
    ask("reset", 1)
    now = control.tick
    deadline = time.monotonic() + 5.0
    while control.tick < now + 5 and time.monotonic() < deadline:  # 5 ticks pass while "the model thinks"
        time.sleep(0.01)
    ack = ask("chunk", 2, {"start_tick": now}, actions=np.full((20, 7), 0.5, np.float32))
    assert ack.body["late"] >= 4 and ack.body["queued"] == 20 - ack.body["late"]
    assert ask("chunk", 3, {"start_tick": control.tick + 1000}, actions=np.zeros((2, 7), np.float32)).body["code"] == "body"
    ask("act", 4, action=np.zeros(7, np.float32))  # a single action: the schedule is dropped
    collect(0.1)
    assert control.telemetry()["chunks"]["scheduled"] == 0 and control.chunks["dropped_actions"] > 0


def test_blending_shrinks_the_jump_at_a_chunk_seam(loop):
    control, arm, ask, collect, states = loop
    jumps = {}
    for blend in (0, 5):
        ask("reset", 10 + blend)
        ask("chunk", 20 + blend, actions=np.full((30, 7), -0.5, np.float32))
        collect(0.1)
        ask("chunk", 30 + blend, {"blend": blend}, actions=np.full((30, 7), 0.5, np.float32))
        collect(0.3)
        jumps[blend] = control.telemetry()["chunks"]["seam_jump_max"]
        control.seam_jumps.clear()
        control.chunks["seam_jump_max"] = None
    assert jumps[0] == pytest.approx(1.0) and jumps[5] == pytest.approx(1.0 / 6, abs=1e-6)


def test_a_saturated_seam_is_reported_as_the_arm_got_it(loop):
    """Actions past +/-1 are clipped by the safety layer: the seam statistic and the
    reported action are the clipped ones (not 2e9)."""
    control, arm, ask, collect, states = loop
    ask("reset", 40)
    ask("chunk", 41, actions=np.full((20, 7), -1e9, np.float32))
    collect(0.1)
    ask("chunk", 42, actions=np.full((20, 7), 1e9, np.float32))
    collect(0.2)
    assert control.telemetry()["chunks"]["seam_jump_max"] == pytest.approx(2.0)
    assert np.all(np.abs(control.last_applied) <= 1.0)
