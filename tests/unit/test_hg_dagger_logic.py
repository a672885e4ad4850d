"""The supervisor rule and the per-round/per-version statistics of HG-DAgger."""

import numpy as np

from rlinf_user.teleop.hg_dagger import EpisodeLog, round_summary, version_summary
from rlinf_user.teleop.synthetic import DeviationRule


def a(x, y, z, g):
    return np.array([x, y, z, 0, 0, 0, g], np.float32)


def test_supervisor_takes_over_on_persistent_disagreement_only():
    rule = DeviationRule(min_cos=0.0, patience=3, min_control=4, min_motion=0.5)
    want = a(1, 0, 0, -1)
    assert not rule({}, want, a(0.8, 0.3, 0, -1))  # same direction: fine
    assert not rule({}, want, a(-1, 0, 0, -1))  # opposite once, twice: wait
    assert not rule({}, want, a(-1, 0, 0, -1))
    assert not rule({}, want, a(1, 0, 0, -1))  # back on track resets the count
    assert not rule({}, a(0.1, 0, 0, -1), a(-1, 0, 0, -1))  # tiny corrections are not worth it
    for _ in range(2):
        assert not rule({}, want, a(0, 0, 0, 1))  # gripper against intent
    assert rule({}, want, a(0, 0, 0, 1))  # third in a row: take over
    assert all(rule({}, want, want) for _ in range(3))  # kept at least min_control steps
    assert not rule({}, want, want)  # the policy agrees again: hand back
    rule.reset()
    assert not rule.engaged


def log(round_, kind, version, steps, iv, success):
    return EpisodeLog(round_, 0, kind, version, steps, iv, int(iv > 0), success, 1.0)


def test_round_and_version_statistics():
    entries = [
        log(0, "dagger", 0, 20, 10, True), log(0, "dagger", 1, 20, 0, False),
        log(0, "eval", 1, 20, 0, False), log(0, "eval", 2, 20, 0, True),
        log(1, "dagger", 3, 10, 1, True), log(1, "dagger", 3, 10, 0, True),
    ]  # fmt: skip
    rounds = round_summary(entries)
    assert rounds[0]["intervention_rate"] == 0.25 and rounds[0]["autonomous_success"] == 0.5
    assert rounds[0]["autonomous_episodes"] == 2  # eval episodes when there are some
    assert rounds[1]["intervention_rate"] == 0.05 and rounds[1]["autonomous_episodes"] == 1  # else untouched ones
    per_version = version_summary(entries)
    assert per_version[1] == {"episodes": 2, "successes": 0, "success_rate": 0.0}
    assert per_version[3]["success_rate"] == 1.0 and 0 not in per_version
