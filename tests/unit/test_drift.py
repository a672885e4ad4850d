"""placement=auto's prediction watched while the run goes on: each window's measured rate at
the update-to-data ratio against the predicted one; windows more than 20% off are drifts."""

import json

import pytest

from rlinf_user.runtime.orchestration.drift import DriftWatch


def test_windows_compare_the_rate_learning_gets_with_the_prediction(tmp_path, caplog):
    (tmp_path / "plan.json").write_text(json.dumps({"predicted": {"env_steps_per_s": 200.0, "updates_per_s": 50.0}}))
    watch = DriftWatch.of_run(tmp_path, utd_ratio=0.5, window_s=30, warmup_s=20)
    assert watch.predicted == 100.0  # 50 updates/s at 0.5 per env step: learning gets 100 env steps/s
    assert watch.tick(30, 300, 0, now=30) is None  # no update yet: the learner waits for a batch
    assert watch.tick(35, 400, 1, now=35) is None  # the first update: the warm-up counts from here
    assert watch.tick(50, 1000, 150, now=50) is None  # warming up
    assert watch.tick(55, 1000, 200, now=55) is None  # the first window opens
    assert watch.tick(75, 4000, 800, now=75) is None  # not 30 s yet
    held = watch.tick(85, 4000, 1700, now=85)  # 3000 steps and 1500 updates in 30 s: 100 and 50/s
    assert held == {"at_s": 85, "measured": 100.0, "predicted": 100.0, "ratio": 1.0, "drift": False}
    with caplog.at_level("WARNING"):
        slow = watch.tick(115, 5500, 2300, now=115)  # 1500 steps/s/30 = 50, updates 20/s -> 40: the learner lags
    assert slow["measured"] == pytest.approx(40.0) and slow["drift"] and "-60%" in caplog.text
    summary = watch.summary()
    assert summary["drifted_windows"] == 1 and len(summary["windows"]) == 2


def test_on_policy_rounds_compare_env_steps_and_a_hand_placed_run_has_no_watch(tmp_path):
    assert DriftWatch.of_run(tmp_path, 1.0) is None  # no plan.json: placed by hand
    watch = DriftWatch({"env_steps_per_s": 300.0, "updates_per_s": 1.0}, None, window_s=10, warmup_s=0)
    watch.tick(0, 0, 1, now=0)
    assert watch.tick(10, 3600, 13, now=10)["ratio"] == pytest.approx(1.2)  # 360 against 300: within 20%
