"""Placement on a multi-node Ray cluster, simulated on one machine with
``ray.cluster_utils.Cluster``: a "GPU box" head node and two "robot PCs", each offering its
robot as a Ray resource. The learner and buffer land on the GPU-box group, each fleet
member's worker on the node that offers its robot; the members differ (another task,
another state size) and feed one learner. Mid-run one robot PC leaves: training goes on
with the other; a node offering that robot joins again and its member is back."""

from __future__ import annotations

import json
import os

import pytest
from cluster_runs import cluster_run, wait_for

from rlinf_user.config.compose import compose_config, validate
from rlinf_user.rundir import create_run_dir
from rlinf_user.runtime.orchestration.trainer import Trainer


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_roles_follow_node_groups_and_robots_leave_and_rejoin(tmp_path):
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "resources": {"gpu_box": 1}})
    pc_a = cluster.add_node(num_cpus=1, resources={"robot_a": 1})
    pc_b = cluster.add_node(num_cpus=1, resources={"robot_b": 1})
    head = cluster.head_node.node_id
    cfg = compose_config(
        [
            "placement=disaggregated", "+placement.groups.gpu_box={gpu_box: 1}", "placement.learner.group=gpu_box",
            "placement.buffer.group=gpu_box", "placement.eval_worker={num_cpus: 1, group: gpu_box}",
            "fleet=[{name: pick, resources: {robot_a: 1}}, "
            "{name: boxes, resources: {robot_b: 1}, env: {task: PandaArrangeBoxes}}]",
            "env.max_episode_steps=40", "total_env_steps=100000", "algo.learning_starts=400", "algo.batch_size=64",
            "policy.hidden=[64,64]", "eval_every_steps=100000", "eval_episodes=1", "buffer.chunk_steps=25",
            f"run_root={tmp_path}", "run_name=fleet", "progress=false",
        ],
        sim="gym_hil",
    )  # fmt: skip
    validate(cfg)
    with cluster_run(cluster, lambda: Trainer(cfg, create_run_dir(cfg))) as run:
        trainer, thread = run.trainer, run.thread

        def steps(name: str) -> int:
            return trainer.progress.members.get(name, {}).get("env_steps", 0)

        wait_for(lambda: steps("boxes") >= 300 and steps("pick") >= 300, 300, "both members stepping", thread)
        assert trainer.spec.member_id_dims == 2  # different tasks: the policy is told which
        cluster.remove_node(pc_b)  # robot PC b goes away mid-run
        wait_for(lambda: trainer.pool.status()["boxes"]["waiting"] == 1, 120, "member boxes marked waiting", thread)
        pick_then, boxes_then = steps("pick"), steps("boxes")
        wait_for(lambda: steps("pick") >= pick_then + 300, 180, "training to go on without robot b", thread)
        assert steps("boxes") <= boxes_then + 2 * 100  # at most its in-flight chunks
        pc_b2 = cluster.add_node(num_cpus=1, resources={"robot_b": 1})  # a node offers robot b again
        wait_for(lambda: steps("boxes") >= boxes_then + 300, 300, "member boxes back", thread)
        trainer.stop("robot b left and came back")
        summary = run.finish()
    where = summary["placement"]
    assert where["learner"] == head and where["replay"] == head  # the GPU-box group
    assert where["members"]["pick"] == [pc_a.node_id]  # each robot's worker on its own PC
    assert where["members"]["boxes"] == sorted([pc_b.node_id, pc_b2.node_id])
    members = summary["members"]
    assert members["pick"]["env_steps"] > 0 and members["boxes"]["env_steps"] > 0
    assert members["boxes"]["running"] == 1 and members["boxes"]["restarts"] == 0  # a node leaving is not a failure
    assert summary["stop_reason"] == "robot b left and came back" and summary["updates"] > 0

    # the fleet's policy evaluates on either member's env (its spec is in the checkpoint)
    from rlinf_user.cli.main import main

    run_dir = trainer.run_dir
    assert main(["eval", str(run_dir), "--member", "boxes", "--episodes", "1", "--video-episodes", "0"]) == 0
    (result,) = list((run_dir / "eval").glob("eval-*-boxes.json"))
    assert json.loads(result.read_text())["member"] == "boxes"
    assert main(["eval", str(run_dir), "--member", "nobody", "--episodes", "1"]) == 2
