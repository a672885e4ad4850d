"""placement=auto over a cluster's node groups: which group each role goes to, from each
group's own costs and the link between them (no Ray here: the costs are given)."""

import pytest
from test_placement_model import costs, flat

from rlinf_user.config.compose import compose_config
from rlinf_user.runtime.planning.cluster import ROBOTS, ClusterCosts, ClusterError, Site, find_sites, rank_cluster, view
from rlinf_user.runtime.planning.model import Candidate, Pipeline, predict

PACED = Pipeline(on_policy=False, batch_size=256, utd_ratio=0.25, paced=True)


def two_groups(link_chunk_s=1e-3, gpu_update=2e-3, box_cores=4, sims_cores=8) -> ClusterCosts:
    """A GPU box with few cores and a fast learner; a PC of simulators with many cores."""
    box = costs(env=2e-3, update=0.03, cores=box_cores, gpus=1)
    box.update["cuda"] = flat(gpu_update, at=(128, 256))
    box.act["cuda"] = flat(1e-3)
    sims = costs(env=2e-3, update=0.03, cores=sims_cores)
    sites = {"gpu_box": Site("gpu_box", {"gpu_box": 1.0}, "n1", 1, box_cores, box_cores, 1),
             "sims": Site("sims", {"sims": 1.0}, "n2", 1, sims_cores, sims_cores, 0)}  # fmt: skip
    link = {"sims->gpu_box": {"chunk_s": link_chunk_s, "weights_s": 2e-3},
            "gpu_box->sims": {"chunk_s": link_chunk_s, "weights_s": 2e-3}}  # fmt: skip
    return ClusterCosts(sites, {"gpu_box": box, "sims": sims}, link)


def test_the_learner_goes_to_the_gpu_and_the_workers_to_the_cores():
    best = rank_cluster(two_groups(), PACED)[0]
    c = best.candidate
    assert (c.learner_group, c.worker_group, c.learner_device) == ("gpu_box", "sims", "cuda")
    assert c.workers > 2  # more workers than the GPU box's cores could hold
    # everything on the GPU box is slower: its 4 cores hold the learner and one worker
    alone = max(p.score for p in rank_cluster(two_groups(), PACED) if p.candidate.worker_group == "gpu_box")
    assert best.score > 1.5 * alone
    assert "placement.learner.group=gpu_box" in c.overrides() and "placement.env_worker.group=sims" in c.overrides()
    groups = c.placement()["groups"]
    assert {k: groups[k] for k in ("learner", "buffer", "env_worker")} == {"learner": "gpu_box", "buffer": "gpu_box",
                                                                          "env_worker": "sims"}  # fmt: skip
    assert groups.get("rollout", "sims" if c.rollout else None) in ("sims", "gpu_box")
    assert "learner on gpu_box, workers on sims" in c.label()


def test_a_slow_link_keeps_the_rows_on_one_node():
    slow = two_groups(link_chunk_s=2.0)  # 2 s to move a worker's chunk of 50 rows
    best = rank_cluster(slow, PACED)[0]
    assert best.candidate.worker_group == best.candidate.learner_group
    far = [p for p in rank_cluster(slow, PACED) if p.candidate.worker_group != p.candidate.learner_group]
    assert max(p.env_steps_per_s for p in far) <= 50 / 2.0 + 1e-6  # the link carries 25 env steps/s at most
    assert far[0].bottleneck == "link"


def test_split_nodes_count_each_nodes_own_cores():
    cc = two_groups(gpu_update=0.05, box_cores=1)  # a slow learner on a 1-core box
    costs_, sites = view(cc, "sims", "gpu_box")
    assert sites is not None and sites.learner_cores == 1
    p = predict(costs_, PACED, Candidate("collocated", 4, 1, learner_device="cpu", learner_group="gpu_box",
                                         worker_group="sims"), sites)  # fmt: skip
    # the CPU learner's update (30 ms at UTD 0.25) on its own core, not the workers' 8
    assert p.usage["learner_node_cpu"] == pytest.approx(p.updates_per_s * 0.03 / 1, rel=0.1)
    assert p.usage["cpu"] < 0.9


def test_a_robot_runs_workers_on_its_robots_and_chooses_only_the_learners_group():
    cc = two_groups()
    robot = costs(env=1e-3, cores=4, robot_hz=10.0)
    cc.sites[ROBOTS] = Site(ROBOTS, {"franka": 1.0}, "n3", 1, 4, 4, 0)
    cc.costs[ROBOTS] = robot
    cc.link.update({"robots->gpu_box": {"chunk_s": 1e-3, "weights_s": 2e-3}, "gpu_box->robots": {"chunk_s": 1e-3, "weights_s": 2e-3},
                    "robots->sims": {"chunk_s": 1e-3, "weights_s": 2e-3}, "sims->robots": {"chunk_s": 1e-3, "weights_s": 2e-3}})  # fmt: skip
    preds = rank_cluster(cc, Pipeline(on_policy=False, batch_size=256, utd_ratio=1.0, paced=True, robots=1))
    assert {p.candidate.worker_group for p in preds} == {""}  # the robot's nodes, by its resources
    assert {p.candidate.workers for p in preds} == {1}
    assert not preds[0].holds_robot and preds[0].candidate.learner_group == "gpu_box"


def test_only_placements_whose_cpu_asks_fit_the_nodes_are_ranked():
    preds = rank_cluster(two_groups(), PACED)
    for p in preds:
        c = p.candidate
        if c.worker_group == "sims" and c.learner_group == "gpu_box":
            assert c.workers + 1 <= 8  # the workers and the evaluation worker within the PC's 8 CPUs
        if c.worker_group == c.learner_group == "gpu_box":
            assert c.workers == 1 and not c.rollout  # 1.1 (learner, weight store) + 1 + 1 (evaluation) of 4
    assert any(p.candidate.workers == 7 for p in preds) and not any(p.candidate.workers == 8 for p in preds)
    with pytest.raises(ClusterError, match="no placement of the roles fits the CPUs the node groups offer"):
        rank_cluster(two_groups(box_cores=1, sims_cores=1), PACED)


def test_cluster_costs_round_trip():
    cc = two_groups()
    assert ClusterCosts.from_dict(cc.to_dict()) == cc


def node(nid, cpus, **res):
    return {"NodeID": nid, "Alive": True, "Resources": {"CPU": float(cpus), **{k: float(v) for k, v in res.items()}}}


def test_node_groups_are_found_by_their_resources():
    cfg = compose_config(["placement=auto", "placement.ray_address=h:6379",
                          "+placement.groups.gpu_box={gpu_box: 1}", "+placement.groups.sims={sims: 1}"], sim="reach")  # fmt: skip
    sites = find_sites(cfg, [node("a", 4, gpu_box=1), node("b", 8, sims=1), node("c", 8, sims=1),
                             {**node("d", 64, sims=1), "Alive": False}])  # fmt: skip
    assert (sites["gpu_box"].node, sites["gpu_box"].cores) == ("a", 4)
    assert (sites["sims"].nodes, sites["sims"].cores, sites["sims"].node_cores) == (2, 16, 8)  # the dead node not counted
    # one machine offering both groups: one site
    assert list(find_sites(cfg, [node("a", 4, gpu_box=1, sims=1)])) == ["gpu_box"]
    with pytest.raises(ClusterError, match="no node of the cluster offers group 'sims'.*ray start --address"):
        find_sites(cfg, [node("a", 4, gpu_box=1)])
