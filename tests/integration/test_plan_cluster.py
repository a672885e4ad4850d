"""``placement=auto`` on a Ray cluster simulated on this machine (``ray.cluster_utils.Cluster``):
each node group profiles itself on its own node, the link between them is measured, and the
run places its learner and env workers on the groups the ranking chose, as the user types it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "rlinf_user.cli.main"]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_auto_places_the_roles_on_the_node_groups_it_profiled(tmp_path):
    from omegaconf import OmegaConf
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"gpu_box": 1}})
    try:
        sims = cluster.add_node(num_cpus=3, resources={"sims": 1})
        head = cluster.head_node.node_id
        base = ["--sim", "reach", f"placement.ray_address={cluster.address}"]
        groups = ["+placement.groups.gpu_box={gpu_box: 1}", "+placement.groups.sims={sims: 1}"]
        # a cluster of two nodes with no groups to place on, and a group no node offers: refused by name
        r = subprocess.run([*CLI, "plan", *base, "--budget", "2"], capture_output=True, text=True, timeout=300, env=ENV)
        text = " ".join(r.stderr.split())
        assert r.returncode == 1 and "error: placement=auto on a cluster of 2 nodes places its roles on node groups" in text, text[-2000:]
        r = subprocess.run([*CLI, "plan", *base, "--budget", "2", "+placement.groups.arm={arm_pc: 1}"],
                           capture_output=True, text=True, timeout=300, env=ENV)  # fmt: skip
        text = " ".join(r.stderr.split())
        assert r.returncode == 1 and "no node of the cluster offers group 'arm'" in text and "Traceback" not in text, text[-2000:]

        r = subprocess.run([*CLI, "train", *base, *groups, "placement=auto", "placement.profile_s=8", "total_env_steps=600",
                            "eval_every_steps=100000", "eval_episodes=2", "test_episodes=0", f"run_root={tmp_path}",
                            "run_name=auto", "progress=false"], capture_output=True, text=True, timeout=800, env=ENV)  # fmt: skip
        assert r.returncode == 0, r.stderr[-4000:]
        run = tmp_path / "auto"
        plan = json.loads((run / "plan.json").read_text())
        sites = plan["cluster"]["sites"]
        # each group profiled on its own node, with Ray's CPUs for it
        assert (sites["gpu_box"]["node"], sites["sims"]["node"]) == (head, sims.node_id)
        assert (sites["gpu_box"]["cores"], sites["sims"]["cores"]) == (2, 3)
        for name in ("gpu_box", "sims"):
            c = plan["cluster"]["costs"][name]
            assert c["env_step"]["wall"]["1"] > 0 and c["update"]["cpu"]["wall"]["256"] > 0 and c["cores"] == sites[name]["cores"]
        # the link measured both ways: a worker's chunk of rows and a publication of the weights
        for way in ("gpu_box->sims", "sims->gpu_box"):
            link = plan["cluster"]["link"][way]
            assert link["chunk_s"] > 0 and link["weights_s"] > 0 and link["weights_bytes"] > 10_000
        # the ranking covers every choice of groups, and the run holds the chosen one
        where = {row["placement"].split("[")[-1] for row in plan["ranking"]}
        assert {"learner on gpu_box, workers on sims]", "learner on sims, workers on gpu_box]"} <= where
        chosen = plan["chosen"]["groups"]
        kept = OmegaConf.load(run / "config.yaml").placement
        assert kept.learner.group == chosen["learner"] and kept.env_worker.group == chosen["env_worker"]
        assert kept.mode == plan["chosen"]["mode"] and kept.num_env_workers == plan["chosen"]["num_env_workers"]
        summary = json.loads((run / "eval" / "summary.json").read_text())
        assert summary["env_steps"] >= 600
        node_of = {name: s["node"] for name, s in sites.items()}
        assert summary["placement"]["learner"] == node_of[chosen["learner"]]
        worker_nodes = {n for nodes in summary["placement"]["members"].values() for n in nodes}
        assert worker_nodes == {node_of[chosen["env_worker"]]}, (worker_nodes, chosen)
        assert "placement=auto chose" in " ".join(r.stderr.split())
    finally:
        cluster.shutdown()
