"""Re-planning a running ``placement=auto`` job from its own measured costs: the cost model
refitted so the live placement's worker step and update take the seconds the run measured,
the env worker count ranked again (the live change), a better placement that needs a restart
advised, and a cluster that gained CPUs re-planned on them."""

import pytest

from rlinf_user.runtime.planning.model import Candidate, Costs, Curve, Pipeline
from rlinf_user.runtime.planning.replan import Replanner


def plan(workers=1, cores=4, store_s=0.0, mode="collocated"):
    """A profile: a worker's step of 1 env 10 ms, an update of 256 rows 5 ms; replay at UTD 1, paced."""
    costs = Costs(cores=cores, worker=Curve({1: 0.010}, {1: 0.010}), act={"cpu": Curve({1: 0.002})},
                  update={"cpu": Curve({256: 0.005}, {256: 0.005})}, store=Curve({50: store_s}),
                  sample_transfer=Curve({256: 0.001}))  # fmt: skip
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=True)
    chosen = Candidate(mode, workers, 1).placement()
    return {"costs": costs.to_dict(), "pipeline": pipe.__dict__, "chosen": chosen, "predicted": {}}


def observe(r: Replanner, step_s=None, update_s=None, calls=3):
    for _ in range(calls):
        if step_s is not None:
            r.observe_rollout({"steps": 100, "seconds": 100 * step_s})
        if update_s is not None:
            r.observe_train({"updates": 50, "seconds": 50 * update_s})


def test_a_learner_slower_than_profiled_retires_the_workers_it_cannot_keep_busy():
    r = Replanner(plan(workers=2), max_workers=2)
    observe(r, step_s=0.010, update_s=0.020)  # updates 4x the profile's
    d = r.replan(2, at_s=60.0)
    assert d["refit"] == {"worker": 1.0, "update": 4.0}
    assert d["measured"] == {"worker_step_ms": 10.0, "update_ms": 20.0}
    # 50 updates/s at UTD 1 hold the run at 50 env steps/s: one worker (100/s) is enough
    assert d["workers"] == {"from": 2, "to": 1}
    assert d["predicted"]["bottleneck"] == "learner" and d["score"] == pytest.approx(50.0, rel=0.02)
    assert r.decisions == [d] and d["reason"] == "drift"


def test_workers_slower_than_profiled_get_company_up_to_the_most_allowed():
    r = Replanner(plan(workers=1), max_workers=3)
    observe(r, step_s=0.030, update_s=0.005)
    d = r.replan(1, at_s=60.0)
    assert d["refit"]["worker"] == pytest.approx(3.0)
    assert d["predicted_before"] == pytest.approx(33.3, rel=0.02)  # what the run measured: one worker at 30 ms
    assert d["workers"] == {"from": 1, "to": 3} and d["score"] == pytest.approx(100.0, rel=0.02)


def test_a_window_that_measured_too_little_is_not_refitted_on():
    r = Replanner(plan(), max_workers=2)
    observe(r, step_s=0.03, update_s=0.005, calls=1)
    assert r.replan(1, at_s=30.0) is None and r.decisions == []
    r.reset_window()
    assert r.measured() == {"worker_step_s": None, "update_s": None}


def test_a_cluster_that_gained_cpus_is_replanned_on_them_with_the_last_refit():
    r = Replanner(plan(workers=1, cores=1), max_workers=4)
    observe(r, step_s=0.010, update_s=0.005)
    d = r.replan(1, at_s=30.0)
    assert d["workers"]["to"] == 1 and d["predicted"]["bottleneck"] == "cpu"  # one core: a second worker has none
    d = r.replan(1, at_s=40.0, added_cores=3.0, reason="cluster")  # a node with 3 CPUs joined
    assert d["reason"] == "cluster" and d["cores"] == 4 and d["measured"]["update_ms"] is None
    assert d["workers"]["to"] == 2 and d["score"] == pytest.approx(200.0, rel=0.02)


def test_a_better_placement_that_needs_a_restart_is_advised_not_switched():
    # a collocated learner that also stores every row (10 ms per row): the replay actor of
    # the disaggregated mode takes that off it
    r = Replanner(plan(workers=1, store_s=0.5), max_workers=1)
    observe(r, step_s=0.010, update_s=0.005)
    d = r.replan(1, at_s=30.0)
    assert d["workers"] == {"from": 1, "to": 1}
    assert d["restart"] is not None and "placement=disaggregated" in d["restart"]["overrides"]
    assert d["restart"]["predicted"]["env_steps_per_s"] > 1.2 * d["predicted"]["env_steps_per_s"]


def test_only_replay_runs_placed_by_auto_without_robots_replan():
    p = plan()
    assert Replanner.applies(p, on_policy=False)
    assert not Replanner.applies(None, on_policy=False)  # placed by hand
    assert not Replanner.applies(p, on_policy=True)  # a round keeps its workers
    robot = {**p, "pipeline": {**p["pipeline"], "robots": 1}}
    assert not Replanner.applies(robot, on_policy=False)


def test_a_lower_target_marks_the_workers_added_last_and_never_worker_0():
    from rlinf_user.runtime.orchestration.workers import Slot, WorkerPool

    pool = WorkerPool.__new__(WorkerPool)
    pool.max_workers, pool.target = 4, None
    pool.slots = [Slot(i, member=None, status="running", elastic=i >= 2) for i in range(4)]
    assert pool.most() == 4
    marked = pool.set_target(2)
    assert [s.index for s in marked] == [3, 2]  # the elastic ones, newest first
    assert pool.most() == 2 and [s.status for s in pool.slots] == ["running", "running", "retiring", "retiring"]
    pool.slots[2].status = pool.slots[3].status = "retired"
    assert [s.index for s in pool.set_target(1)] == [1]  # worker 0 (whose episodes are shown) stays
    assert pool.set_target(0) == [] and pool.target == 1  # at least one


def test_step_replans_after_a_drifted_window_or_a_resized_cluster_and_nothing_else():
    r = Replanner(plan(workers=1, cores=1), max_workers=4)
    assert r.step(None, 4.0, 1, at_s=2.0) is None  # the cluster as first seen: its baseline
    observe(r, step_s=0.010, update_s=0.005)
    assert r.step(False, 4.0, 1, at_s=30.0) is None  # on plan: the window's measurements are dropped
    assert r.measured() == {"worker_step_s": None, "update_s": None}
    observe(r, step_s=0.010, update_s=0.005)
    d = r.step(True, 4.0, 1, at_s=60.0)
    assert d["reason"] == "drift" and d["cores"] == 1
    assert r.step(None, 4.5, 1, at_s=62.0) is None  # less than a CPU more
    d = r.step(None, 7.0, 1, at_s=64.0)  # a node with 3 CPUs joined
    assert d["reason"] == "cluster" and d["cores"] == 4 and d["workers"]["to"] == 2
    assert r.step(None, 7.0, 2, at_s=66.0) is None  # planned on already
    d = r.step(None, 4.0, 2, at_s=68.0)  # and left
    assert d["cores"] == 1 and d["workers"]["to"] == 1
