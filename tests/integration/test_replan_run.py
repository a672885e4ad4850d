"""A ``placement=auto`` run that re-plans itself: its plan (``plan.json``) promised a learner 50x
faster than the one it got, so the first drift window re-fits the cost model to the run's own
measured costs, finds the learner the bottleneck, and retires the env worker it cannot keep
busy, once that worker's rollouts in flight came back: no transition is lost and the run goes
on with the other."""

from __future__ import annotations

import json
import os

import pytest
from cluster_runs import cluster_run, wait_for

from rlinf_user.config.compose import compose_config, validate
from rlinf_user.rundir import create_run_dir
from rlinf_user.runtime.orchestration.drift import DriftWatch
from rlinf_user.runtime.orchestration.trainer import Trainer
from rlinf_user.runtime.planning.model import Candidate, Costs, Curve, Pipeline, predict


def optimistic_plan(cfg) -> dict:
    """What a profile might have said: a worker's vector step 2 ms, an update 0.1 ms."""
    costs = Costs(cores=2, worker=Curve({1: 0.002}), act={"cpu": Curve({1: 0.001})},
                  update={"cpu": Curve({128: 0.0001})}, store=Curve({25: 0.0005}))  # fmt: skip
    pipe = Pipeline(on_policy=False, batch_size=int(cfg.algo.batch_size), utd_ratio=float(cfg.algo.utd_ratio),
                    paced=True, send_rows=int(cfg.buffer.chunk_steps))  # fmt: skip
    chosen = Candidate("collocated", 2, 1)
    best = predict(costs, pipe, chosen)
    return {"costs": costs.to_dict(), "pipeline": pipe.__dict__, "ranking": [best.row()],
            "chosen": chosen.placement(), "predicted": best.row()}  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_slower_than_its_plan_replans_and_retires_a_worker_without_losing_a_row(tmp_path):
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cfg = compose_config(["seed=0", "total_env_steps=2500", "algo.paced=true", "algo.utd_ratio=4", "algo.batch_size=128",
                          "policy.hidden=[128,128]", "placement=collocated", "placement.num_env_workers=2",
                          "eval_every_steps=100000", "eval_episodes=2", "test_episodes=0", "buffer.chunk_steps=25",
                          f"run_root={tmp_path}", "run_name=replan", "progress=false"], sim="reach")  # fmt: skip
    validate(cfg)
    run_dir = create_run_dir(cfg)
    plan = optimistic_plan(cfg)
    (run_dir / "plan.json").write_text(json.dumps(plan, default=str))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 5})

    def trainer():
        t = Trainer(cfg, run_dir)
        assert t.replanner is not None and t.replanner.live.workers == 2
        t.drift = DriftWatch(plan["predicted"], float(cfg.algo.utd_ratio), window_s=4.0, warmup_s=2.0)
        return t

    with cluster_run(cluster, trainer) as run:
        tr = run.trainer
        wait_for(lambda: tr.replanner.decisions, 240, "a re-plan", run.thread)
        wait_for(lambda: any(e["event"] == "retire" for e in tr.pool.events), 240, "the worker retired", run.thread)
        steps_then = tr.progress.env_steps
        assert tr.pool.slots[1].status == "retired" and tr.pool.slots[0].status == "running"
        wait_for(lambda: tr.progress.env_steps >= min(steps_then + 300, 2500), 300, "the run going on", run.thread)
        summary = run.finish()
    first = summary["placement_replans"][0]
    print("re-plan:", json.dumps(first))
    assert first["reason"] == "drift" and first["workers"] == {"from": 2, "to": 1}, first
    assert first["refit"]["update"] > 5  # the learner it got, against the one it was promised
    assert first["predicted"]["bottleneck"] == "learner"
    retire = next(e for e in summary["elastic"] if e["event"] == "retire")
    assert retire["worker"] == 1 and retire["reason"] == "re-planned"
    # the drift watch measures against the re-plan's prediction from then on
    last = summary["placement_replans"][-1]
    assert summary["placement_drift"]["predicted"] == pytest.approx(last["score"], rel=0.01)
    # every row a worker sent is in the replay, the retired one's included
    assert summary["env_steps"] >= 2500
    assert summary["replay"]["total_added"] >= summary["env_steps"], summary["replay"]
    assert summary["replay"]["rejected"] == 0
