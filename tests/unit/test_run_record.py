"""A run's record says when success has fallen below the 95% interval of its best, in the
progress display and in the summary's end-of-run table, and clears it on recovery."""

from rich.console import Console

from rlinf_user.cli.progress import progress_table
from rlinf_user.evaluation import wilson
from rlinf_user.runtime.orchestration.run_record import RECENT_EPISODES, RunRecord


def _eval(k: int, n: int = 50, deterministic: bool = False) -> dict:
    return {"success_rate": k / n, "success_ci95": wilson(k, n), "policy_version": 1, "episodes": n,
            "distinct_initial_states": 1 if deterministic else n, "deterministic_reset": deterministic,
            "mean_return": 0.0}  # fmt: skip


def _shown(record: RunRecord) -> str:
    console = Console(width=200, record=True)
    console.print(progress_table(record.progress, 10_000, "t"))
    return console.export_text()


def test_an_evaluation_below_its_best_by_more_than_its_interval_is_flagged_until_it_recovers(tmp_path):
    (tmp_path / "eval").mkdir()
    rec = RunRecord(tmp_path, supervised=False, many_members=False)
    rec.progress.env_steps = 5000
    rec.record_eval(_eval(47), wall=1.0, spec=None)  # 94% (84-98%)
    assert rec.progress.eval_fall is None
    rec.progress.env_steps = 6000
    rec.record_eval(_eval(43), wall=2.0, spec=None)  # 86%: within the best's noise
    assert rec.progress.eval_fall is None
    rec.progress.env_steps = 17500
    rec.record_eval(_eval(39), wall=3.0, spec=None)  # 78%: below it
    fall = rec.progress.eval_fall
    assert fall["best"] == 0.94 and fall["best_at_env_steps"] == 5000 and fall["now"] == 0.78
    assert "eval fell from its best" in _shown(rec) and "best 94% (84%-98%) at 5,000 env steps" in _shown(rec)
    rec.progress.env_steps = 20000
    rec.record_eval(_eval(46), wall=4.0, spec=None)  # 92% (81-97%): back within reach of the best
    assert rec.progress.eval_fall is None and "fell" not in _shown(rec)
    rec.record_eval(_eval(0, 1, deterministic=True), wall=5.0, spec=None)  # one trial: no interval
    assert rec.progress.eval_fall is None


def test_training_success_over_a_full_window_is_watched_the_same_way(tmp_path):
    rec = RunRecord(tmp_path, supervised=False, many_members=False)

    def episodes(successes):
        return {"steps": 10 * len(successes), "episodes": [{"return": 1.0, "success": s, "length": 10} for s in successes]}

    rec.book_rollout(episodes([False] * 10), supervised_worker=False)
    assert rec.recent_watch.best is None  # no full window yet
    rec.book_rollout(episodes([True] * RECENT_EPISODES), supervised_worker=False)
    assert rec.recent_watch.best == 1.0 and rec.progress.recent_fall is None
    # 100% over 50 episodes: 93-100%
    rec.book_rollout(episodes([False] * 2), supervised_worker=False)  # 48/50 is within it
    assert rec.progress.recent_fall is None
    rec.book_rollout(episodes([True, False] * 9), supervised_worker=False)  # 39/50: 78%
    fall = rec.progress.recent_fall
    assert fall is not None and fall["now"] == 0.78 and fall["best"] == 1.0
    assert "training success fell from its best" in _shown(rec)
    rec.book_rollout(episodes([False] * 2 + [True] * 48), supervised_worker=False)  # 48/50
    assert rec.progress.recent_fall is None


def test_best_pt_is_the_best_evaluation_and_a_later_equal_one_replaces_it(tmp_path):
    import types

    import torch

    (tmp_path / "eval").mkdir()
    rec = RunRecord(tmp_path, supervised=False, many_members=False)
    spec = types.SimpleNamespace(to_dict=lambda: {})
    for version, k in ((1, 50), (2, 49), (3, 50), (4, 48)):  # 100%, 98%, 100%, 96%
        rec.progress.env_steps = 5000 * version
        rec.record_eval({**_eval(k), "policy_version": version, "policy_state": {"w": torch.tensor([version])}},
                        wall=float(version), spec=spec)  # fmt: skip
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    assert best["version"] == 3 and best["env_steps"] == 15000 and best["eval_success"] == 1.0
    assert int(best["policy"]["w"]) == 3 and rec.best["policy_version"] == 3
    rec.record_eval({**_eval(0), "policy_version": 5, "policy_state": {"w": torch.tensor([5])}}, wall=6.0, spec=spec)
    assert torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)["version"] == 3


def test_a_target_stops_the_run_only_on_an_evaluation_that_ran():
    """``target_success=0`` (evaluate the starting policy and stop): no stop, and no crash,
    before the first evaluation is booked; the stop once it is."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from rlinf_user.runtime.orchestration.loops import Schedule
    from rlinf_user.runtime.orchestration.run_record import Progress

    cfg = OmegaConf.create({"eval_every_steps": 10_000, "checkpoint_every_steps": 10_000, "target_success": 0.0,
                            "max_wall_minutes": None, "eval_at_start": False, "resume": None})  # fmt: skip
    tr = SimpleNamespace(cfg=cfg, progress=Progress(), eval_worker=None, drift=None, replanner=None, stop_requested=None,
                         pool=SimpleNamespace(running=list), record=SimpleNamespace(scalars=lambda *a, **k: None),
                         on_progress=lambda p: None)  # fmt: skip
    sched = Schedule(tr)
    assert sched.tick() is None
    tr.progress.eval_success = 0.0
    assert sched.tick() == "evaluation success 0.00 >= target 0.0"
