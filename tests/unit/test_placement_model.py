"""The placement cost model: bottlenecks, choices and their reasons, from given role costs."""

import pytest

from rlinf_user.runtime.planning.model import Candidate, Costs, Curve, Pipeline, candidates, predict, rank


def flat(seconds: float, at=(1, 64)) -> Curve:
    """A cost that does not grow with the batch (a batched forward pass on a wide device)."""
    return Curve({b: seconds for b in at}, {b: seconds for b in at})


def linear(per_item: float, at=(1, 64)) -> Curve:
    return Curve({b: per_item * b for b in at}, {b: per_item * b for b in at})


def costs(env=1e-3, act=1e-3, update=5e-3, cores=4, **kw) -> Costs:
    return Costs(cores=cores, env_step=linear(env), act={"cpu": flat(act)}, row=linear(1e-6), store=linear(1e-6),
                 update={"cpu": flat(update, at=(256,))}, sample_transfer=flat(1e-4, at=(256,)), call_s=1e-4, **kw)


def test_a_curve_interpolates_between_measured_batches_and_extrapolates_past_them():
    c = Curve({1: 1.0, 4: 4.0}, {1: 0.5, 4: 2.0})
    assert c.wall_s(2) == pytest.approx(2.0) and c.cpu_s(2) == pytest.approx(1.0)
    assert c.wall_s(8) == pytest.approx(8.0)  # the last segment's slope, carried on
    assert Curve({256: 0.01}).wall_s(512) == pytest.approx(0.02)  # one point: proportional
    assert Costs.from_dict(costs().to_dict()) == costs()


def test_a_slow_learner_at_its_pace_sets_the_rate_and_the_simplest_placement_wins():
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=True)
    best = rank(costs(update=0.02), pipe)[0]
    assert best.bottleneck == "learner"
    assert best.env_steps_per_s == pytest.approx(1 / 0.02, rel=0.03)  # 1 update per env step, 20 ms each
    assert (best.candidate.workers, best.candidate.envs_per_worker, best.candidate.rollout) == (1, 1, False)
    assert best.candidate.mode == "collocated"


def test_slow_envs_and_a_fast_learner_get_more_workers_and_envs_until_the_cores_are_full():
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=0.1, paced=True)
    c = costs(env=0.01, act=2e-4, update=1e-3, cores=4)
    one = predict(c, pipe, Candidate("collocated", 1, 1))
    best = rank(c, pipe)[0]
    assert one.bottleneck == "workers" and one.env_steps_per_s == pytest.approx(1 / 0.0103, rel=0.05)
    assert best.env_steps_per_s > 3 * one.env_steps_per_s
    assert best.bottleneck == "cpu"  # an env step's CPU time is what is left to spend
    assert best.usage["cpu"] == pytest.approx(0.9, rel=0.02)


def test_an_expensive_policy_that_batches_well_is_served_to_every_worker():
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=0.05, paced=True)
    c = costs(env=1e-3, act=0.05, update=1e-3, cores=4)  # 50 ms a forward pass, whatever the batch
    best = rank(c, pipe)[0]
    local = predict(c, pipe, Candidate("collocated", best.candidate.workers, best.candidate.envs_per_worker))
    assert best.candidate.rollout
    assert best.env_steps_per_s > 1.3 * local.env_steps_per_s
    assert best.bottleneck == "rollout server"


def test_a_learner_that_cannot_keep_up_with_free_running_workers_is_what_limits_learning():
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=False)
    p = predict(costs(env=1e-4, act=1e-4, update=0.01, cores=8), pipe, Candidate("collocated", 2, 1))
    assert p.bottleneck == "learner"
    assert p.updates_per_s == pytest.approx(100, rel=0.05)  # flat out at 10 ms an update
    assert p.env_steps_per_s > 5 * p.updates_per_s  # the workers do not wait
    assert p.score == pytest.approx(p.updates_per_s)  # learning runs at the learner's pace


def test_a_robot_steps_at_its_rate_and_a_placement_that_would_hold_it_back_is_never_chosen():
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=False, robots=1)
    c = costs(update=0.2, robot_hz=10.0)
    cands = candidates(c, pipe)
    assert {(x.workers, x.envs_per_worker) for x in cands} == {(1, 1)}  # a robot's count is its own
    p = predict(c, pipe, Candidate("collocated", 1, 1))
    assert p.env_steps_per_s == pytest.approx(1 / (0.1 + 1e-3 + 1e-6 + 1e-6), rel=0.02)  # its control rate
    assert p.updates_per_s == pytest.approx(5.0, rel=0.05) and p.holds_robot is False  # the robot does not wait
    assert p.bottleneck == "learner"
    paced = predict(c, Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=True, robots=1), p.candidate)
    assert paced.holds_robot and paced.bottleneck == "learner (the robot waits)"  # pacing would make it wait: flagged
    fast = predict(costs(update=0.001, robot_hz=10.0), pipe, p.candidate)
    assert fast.bottleneck == "robot" and not fast.holds_robot  # its control rate is what limits it


def test_on_policy_rounds_add_collection_and_the_update():
    pipe = Pipeline(on_policy=True, batch_size=256, num_steps=100)
    c = costs(env=1e-3, act=1e-3, cores=4)
    c.update["cpu"] = Curve({400: 0.2, 800: 0.4}, {400: 0.2, 800: 0.4})  # an update on a round, by its rows
    p = predict(c, pipe, Candidate("collocated", 2, 4))
    collect = 100 * (4e-3 + 1e-3 + 4 * 1e-6 + 1e-6)  # steps x (4 envs + act + rows + the call's share)
    rows = 100 * 2 * 4
    update = 0.4  # the round's 800 rows
    assert p.env_steps_per_s == pytest.approx(rows / (collect + update), rel=0.05)
    assert p.bottleneck == "workers"
    unprofiled = costs(env=1e-3, act=1e-3, cores=4)
    unprofiled.update = {}  # on-policy updates are not profiled yet: collection alone, no error
    alone = predict(unprofiled, pipe, Candidate("collocated", 2, 4))
    assert alone.env_steps_per_s == pytest.approx(rows / collect, rel=0.05)
    crowded_costs = costs(env=1e-3, act=1e-3, cores=1)
    crowded_costs.update["cpu"] = c.update["cpu"]
    crowded = predict(crowded_costs, pipe, Candidate("collocated", 2, 4))
    assert crowded.env_steps_per_s < 0.6 * p.env_steps_per_s  # two workers on one core take turns


def test_candidates_cover_both_modes_the_server_and_each_device_present():
    pipe = Pipeline(on_policy=False)
    cpu_only = candidates(costs(cores=2), pipe, max_envs=4)
    assert {c.mode for c in cpu_only} == {"collocated", "disaggregated"}
    assert {c.workers for c in cpu_only} == {1, 2} and {c.envs_per_worker for c in cpu_only} == {1, 2, 4}
    assert not any(c.rollout for c in cpu_only if c.workers * c.envs_per_worker == 1)  # nothing to batch
    gpu = costs(cores=2, gpus=1)
    gpu.act["cuda"], gpu.update["cuda"] = flat(1e-3), flat(1e-3, at=(256,))
    assert {c.learner_device for c in candidates(gpu, pipe)} == {"cpu", "cuda"}


def test_the_update_measured_beside_a_worker_is_the_one_a_run_gets():
    """Profiled alone, an update took 6.5 ms; inside the runs 7.5-12 ms (the worker beside it
    shares the cores and caches): where the profile measured it beside a worker, that sets the
    learner's pace, and it is no extra learner device."""
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=True)
    c = costs(env=1e-4, act=1e-4, update=5e-3, cores=8)
    alone = predict(c, pipe, Candidate("collocated", 1, 1))
    c.update["cpu_beside_worker"] = flat(1e-2, at=(256,))
    beside = predict(c, pipe, Candidate("collocated", 1, 1))
    assert beside.bottleneck == "learner" and beside.updates_per_s == pytest.approx(alone.updates_per_s / 2, rel=0.05)
    assert {x.learner_device for x in candidates(c, pipe)} == {"cpu"}


def test_learner_replicas_split_a_compute_bound_update_and_only_add_overhead_to_a_launch_bound_one():
    """N data-parallel replicas update on B / N each and add their measured overhead (shards,
    all-reduce): that pays where the update grows with the batch, never where it is bound by
    launching kernels (the same 12.5 ms at any batch), and CPU replicas each take a core."""
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=4.0, paced=False)
    box = costs(env=1e-4, act=1e-4, cores=16, gpus=4)
    box.act["cuda"] = flat(1e-4)
    box.update["cuda"] = linear(0.01 / 256, at=(128, 256))  # 10 ms at 256, 5 ms at 128
    box.dp_overhead["cuda"] = Curve({2: 1e-3}, {2: 1e-4})
    cands = candidates(box, pipe)
    assert {x.learner_replicas for x in cands if x.learner_device == "cuda"} == {1, 2, 4}
    assert {x.learner_replicas for x in cands if x.learner_device == "cpu"} == {1}  # not profiled there
    one = predict(box, pipe, Candidate("collocated", 4, 1, False, "cuda", "cpu"))
    two = predict(box, pipe, Candidate("collocated", 4, 1, False, "cuda", "cpu", 2))
    four = predict(box, pipe, Candidate("collocated", 4, 1, False, "cuda", "cpu", 4))
    assert one.bottleneck == two.bottleneck == "learner"
    assert one.updates_per_s == pytest.approx(100, rel=0.02)
    assert two.updates_per_s == pytest.approx(1 / 0.006, rel=0.02)  # 5 ms on half the batch + 1 ms
    assert four.updates_per_s == pytest.approx(1 / 0.0035, rel=0.02)  # the overhead flat past 2
    assert rank(box, pipe)[0].candidate.learner_replicas == 4
    assert "4 learner replicas" in four.candidate.label() and "placement.learner_replicas=4" in four.candidate.overrides()
    box.update["cuda"] = flat(0.0125, at=(128, 256))  # launch-bound: the same at any batch
    assert predict(box, pipe, two.candidate).updates_per_s < predict(box, pipe, one.candidate).updates_per_s
    # below the smallest batch measured (64 for 4 replicas) the measured slope is carried down
    assert predict(box, pipe, four.candidate).updates_per_s == pytest.approx(1 / 0.0135, rel=0.02)
    assert rank(box, pipe)[0].candidate.learner_replicas == 1


def test_cpu_replicas_count_every_replica_against_the_cores():
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=True)
    c = costs(env=4e-3, act=5e-4, cores=2)
    c.update["cpu"] = linear(0.006 / 256, at=(128, 256))
    c.dp_overhead["cpu"] = Curve({2: 1e-3}, {2: 1e-3})
    one = predict(c, pipe, Candidate("collocated", 1, 1))
    two = predict(c, pipe, Candidate("collocated", 1, 1, learner_replicas=2))
    # per env step: one learner spends 6 ms of CPU; two replicas 2 x 3 ms + 1 ms
    per_step_one = one.usage["cpu"] * c.cores / one.env_steps_per_s
    per_step_two = two.usage["cpu"] * c.cores / two.env_steps_per_s
    assert per_step_two - per_step_one == pytest.approx(1e-3, rel=0.05)
    assert {x.learner_replicas for x in candidates(c, pipe)} == {1, 2}
    assert two.bottleneck == "cpu" and two.env_steps_per_s < one.env_steps_per_s  # the cores, not the learner
    assert rank(c, pipe)[0].candidate.learner_replicas == 1


def test_the_profile_budget_takes_what_came_before_a_step_from_the_steps_after_it():
    import time

    from rlinf_user.runtime.planning.profile import Budget

    budget = Budget(60.0, time.perf_counter() + 60.0, {"env": 1.0, "update": 4.0, "replicas": 1.0})
    assert budget.share("env") == pytest.approx(10.0, rel=0.01)  # a sixth of the 60 s left
    budget.end -= 45.0  # Ray's start, an actor's start, the env step itself: 15 s left, not 50
    assert budget.share("update") == pytest.approx(15.0 * 4 / 5, rel=0.02)
    budget.end -= 15.0  # nothing left: the floor (a fortieth of the budget), not zero
    assert budget.share("replicas") == pytest.approx(1.5)


def test_a_learner_that_samples_big_batches_itself_is_relieved_by_a_replay_actor():
    """Collocated, the learner samples every batch from its own buffer (a pixel learner spent
    ~19% of a run doing so); disaggregated, the replay actor samples the next while it updates."""
    pipe = Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=True)
    c = costs(update=0.2, cores=4, sampling=flat(0.04, at=(256,)))
    here = predict(c, pipe, Candidate("collocated", 1, 1))
    apart = predict(c, pipe, Candidate("disaggregated", 1, 1))
    assert here.bottleneck == apart.bottleneck == "learner"
    assert here.env_steps_per_s == pytest.approx(1 / 0.2, rel=0.02)
    assert apart.env_steps_per_s == pytest.approx(1 / 0.16, rel=0.02)
    assert rank(c, pipe)[0].candidate.mode == "disaggregated"
    assert Costs.from_dict(c.to_dict()) == c
    # a sampling that costs nothing next to the update: the simpler placement still wins
    assert rank(costs(update=0.2, cores=4, sampling=flat(1e-4, at=(256,))), pipe)[0].candidate.mode == "collocated"


def test_replicas_are_not_profiled_where_half_a_batch_costs_as_much_as_the_whole():
    """Profiling two replicas starts a second learner process (25 s for DSRL over lite_vla);
    where an update on half the batch costs at least 90% of the whole one, replicas cannot
    gain even with no overhead, so that step measures nothing and starts nothing."""
    from types import SimpleNamespace

    from rlinf_user.runtime.planning.profile_learner import LearnerProfiles

    flat = Costs(cores=2)
    flat.update["cpu"] = Curve({32: 0.0249, 16: 0.0257}, {32: 0.0217, 16: 0.0198})  # DSRL's noise actor
    plan = SimpleNamespace(batch_size=32)
    # rows=None: the step would fail on its first use of them, so returning {} proves it stopped first
    assert LearnerProfiles()._replicas(None, None, plan, flat, share=1.0, gpus=0) == {}
    split = Costs(cores=2)
    split.update["cpu"] = Curve({32: 0.0249, 16: 0.0130}, {32: 0.0249, 16: 0.0130})
    with pytest.raises(TypeError):  # here it goes on to build the replicas (and meets rows=None)
        LearnerProfiles()._replicas(None, None, plan, split, share=1.0, gpus=0)
