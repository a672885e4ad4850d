"""Elastic env workers (``placement.max_env_workers``), on a multi-node Ray cluster simulated on
one machine with ``ray.cluster_utils.Cluster``. The head holds the run's roles with no CPU to
spare; a node that joins mid-run gets an env worker that feeds the learner without a restart;
when that node is removed its worker is retired, the learner never stops, every row that
reached the replay stays there, and SAC still reaches its target on the reach sim."""

from __future__ import annotations

import os
import time

import pytest
from cluster_runs import cluster_run, wait_for

from rlinf_user.config.compose import ConfigError, compose_config, validate
from rlinf_user.rundir import create_run_dir
from rlinf_user.runtime.orchestration.trainer import Trainer


def reach_cfg(tmp_path, *extra):
    return compose_config(
        ["seed=1", "total_env_steps=20000", "algo.n_step=3", "algo.init_temperature=0.1", "algo.paced=true",
         "algo.utd_ratio=0.5", "algo.batch_size=128", "policy.hidden=[128,128]",
         "eval_every_steps=100000", "eval_episodes=2", "test_episodes=0", "buffer.chunk_steps=25", f"run_root={tmp_path}",
         "run_name=elastic", "progress=false", *extra],
        sim="reach",
    )  # fmt: skip


def test_max_env_workers_is_checked_where_it_is_set(tmp_path):
    with pytest.raises(ConfigError, match="at least placement.num_env_workers"):
        validate(reach_cfg(tmp_path, "placement.num_env_workers=2", "placement.max_env_workers=1"))
    with pytest.raises(ConfigError, match="a fleet's members are placed by their robots' resources"):
        validate(reach_cfg(tmp_path, "placement.max_env_workers=3", "fleet=[{name: a}]", "algo.paced=false"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_node_that_joins_gets_a_worker_and_one_that_leaves_loses_nothing_sent(tmp_path):
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # the head: learner 1 + env worker 1 + eval worker 1 + weight store 0.1 CPUs, nothing spare
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4})
    cfg = reach_cfg(tmp_path, "placement.max_env_workers=2")
    validate(cfg)
    with cluster_run(cluster, lambda: Trainer(cfg, create_run_dir(cfg))) as run:
        trainer, thread = run.trainer, run.thread
        wait_for(lambda: trainer.progress.env_steps >= 1000, 300, "the first worker stepping", thread)
        assert len(trainer.pool.slots) == 1  # no spare CPU: no worker was added
        node = cluster.add_node(num_cpus=1)  # a node joins the running job
        joined = lambda: [e for e in trainer.pool.events if e["event"] == "join"]  # noqa: E731
        wait_for(lambda: joined(), 120, "a worker on the new node feeding the learner", thread)
        added = trainer.pool.slots[1]
        assert added.elastic and added.nodes == [node.node_id], (added, node.node_id)
        steps_then = trainer.progress.env_steps
        wait_for(lambda: trainer.progress.env_steps >= steps_then + 1000, 300, "both workers stepping", thread)
        updates_then = trainer.progress.updates
        cluster.remove_node(node)  # the node leaves (its raylet killed)
        left_at = time.time()
        wait_for(lambda: [e for e in trainer.pool.events if e["event"] == "leave"], 120, "the worker retired", thread)
        assert added.status == "retired" and trainer.pool.slots[0].status == "running"
        wait_for(lambda: trainer.progress.updates >= updates_then + 200, 300, "the learner going on", thread)
        trainer.stop("the join and the leave are done")
        summary = run.finish()
    events = summary["elastic"]
    join, leave = events[0], events[1]
    assert (join["event"], leave["event"]) == ("join", "leave") and join["worker"] == leave["worker"] == 1
    print(f"elastic: join -> first rows {join['join_to_first_rows_s']} s; leave -> retired {leave['at'] - left_at:.1f} s")
    # every row a worker sent is in the replay: the rollouts counted, and the chunks the
    # removed worker had sent before its last rollout could return
    assert summary["replay"]["total_added"] >= summary["env_steps"], summary["replay"]
    assert summary["replay"]["rejected"] == 0
    assert summary["stop_reason"] == "the join and the leave are done"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_synchronous_ppo_stays_on_policy_through_a_join_and_a_leave(tmp_path):
    """A node joins a running PPO job and later leaves it while its rounds go on: the joined
    worker takes part from the next round, the rows the leaving one sent train in their own
    round, and every update trains on rows of exactly the newest policy (no round mixes
    versions)."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4})
    cfg = compose_config(
        ["algo=ppo", "policy=gaussian_ac", "policy.hidden=[64,64]", "algo.num_steps=20", "placement.num_env_workers=1",
         "placement.envs_per_worker=2", "placement.max_env_workers=2", "total_env_steps=4000",
         "eval_every_steps=100000", "eval_episodes=2", "test_episodes=0", "buffer.chunk_steps=10", "seed=0",
         f"run_root={tmp_path}", "run_name=elastic_ppo", "progress=false"],
        sim="reach",
    )  # fmt: skip
    validate(cfg)
    with cluster_run(cluster, lambda: Trainer(cfg, create_run_dir(cfg))) as run:
        trainer, thread = run.trainer, run.thread
        wait_for(lambda: trainer.progress.updates >= 3, 300, "the first rounds", thread)
        node = cluster.add_node(num_cpus=1)
        wait_for(lambda: [e for e in trainer.pool.events if e["event"] == "join"], 120, "the joined worker's rows", thread)
        updates_then = trainer.progress.updates
        wait_for(lambda: trainer.progress.updates >= updates_then + 3, 300, "rounds with both workers", thread)
        cluster.remove_node(node)
        wait_for(lambda: [e for e in trainer.pool.events if e["event"] == "leave"], 120, "the worker retired", thread)
        updates_then = trainer.progress.updates
        wait_for(lambda: trainer.progress.updates >= updates_then + 3, 300, "rounds after the leave", thread)
        trainer.stop("the join and the leave are done")
        summary = run.finish()
    stats = summary["replay"]
    print("elastic PPO:", summary["elastic"], {k: stats.get(k) for k in ("updates", "rows_trained", "max_policy_lag",
          "dropped_stale", "on_policy_rows_waiting")}, "env steps", summary["env_steps"])  # fmt: skip
    assert [e["event"] for e in summary["elastic"]][:2] == ["join", "leave"]
    # each update trained on one round of the newest policy's rows, whoever collected them
    assert stats["max_policy_lag"] == 0 and stats["dropped_stale"] == 0, stats
    assert stats["updates"] == summary["updates"] and summary["policy_version"] == stats["updates"]
    # every row the workers sent was trained on (the leaving worker's last chunks included)
    assert stats["rows_trained"] + stats["on_policy_rows_waiting"] >= summary["env_steps"], stats
