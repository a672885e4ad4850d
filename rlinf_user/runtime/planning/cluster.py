"""``placement=auto`` on a Ray cluster: which node group gets which role.

A cluster's node groups (``placement.groups``, e.g. a GPU box and a PC of simulators) differ in
cores, GPUs and speed, and a link lies between them. Here each group's node profiles itself,
at the same time as the others, with the one-machine profile (:class:`~.profile.Profiler`,
its helper actors kept on that node), and the link between every two groups is measured:
a worker's chunk of rows and one publication of the weights, put in one node's object store
and fetched from the other's. A robot run's env workers are fixed to the nodes that offer its
robots' resources (``placement.env_worker.resources``): those nodes are profiled too (the
policy's act there), never stepped.

:func:`rank_cluster` then predicts every candidate of the one-machine model for every choice
of the learner's group, the workers' group and the rollout server's group, with
:class:`~.model.Sites` where the workers and the learner are on different nodes (each node's
own CPUs; the rows and the weights across the link), and ranks them as
:func:`~.model.rank` does. The chosen candidate sets ``placement.<role>.group``.

Groups whose nodes are all one machine (a single machine offering every group, as
``placement=cluster`` runs on a laptop) are one site: the one-machine plan applies.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rlinf_user.runtime.planning.model import Candidate, Costs, Pipeline, Prediction, Sites, candidates, predict, rank
from rlinf_user.runtime.planning.profile import ProfileError

log = logging.getLogger(__name__)

ROBOTS = "robots"  # the site of a robot run's env workers: the nodes offering its robots' resources
LINK_REPEATS = 3


@dataclass
class Site:
    """One node group as the profile found it."""

    name: str
    resources: dict[str, float]  # what a role asks for to land there
    node: str  # the node profiled (the group's first alive node)
    nodes: int  # alive nodes in the group: env workers spread over them
    cores: float  # their CPUs together
    node_cores: float  # one node's CPUs (the learner is one process on one node)
    gpus: int  # one node's GPUs


@dataclass
class ClusterCosts:
    sites: dict[str, Site]
    costs: dict[str, Costs]  # each site's profile
    # "a->b": seconds to fetch a worker's chunk of rows ("rows_s") and a publication
    # ("weights_s") on b's node from a's object store; with the bytes measured
    link: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"sites": {k: asdict(v) for k, v in self.sites.items()},
                "costs": {k: v.to_dict() for k, v in self.costs.items()}, "link": self.link}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> ClusterCosts:
        return cls({k: Site(**v) for k, v in d["sites"].items()}, {k: Costs.from_dict(v) for k, v in d["costs"].items()},
                   {k: dict(v) for k, v in d.get("link", {}).items()})  # fmt: skip


class ClusterError(ProfileError):
    """The cluster cannot be planned as configured: what is missing and how to add it."""


def find_sites(cfg, nodes: list[dict]) -> dict[str, Site]:
    """Each node group's alive nodes (``ray.nodes()``), and a robot run's robot nodes; groups
    that resolve to the same nodes are one site (the first name kept)."""
    alive = [n for n in nodes if n.get("Alive")]
    wanted = {str(g): {str(k): float(v) for k, v in dict(res or {}).items()}
              for g, res in dict(cfg.placement.get("groups") or {}).items()}  # fmt: skip
    robot_res = {str(k): float(v) for k, v in dict(cfg.placement.env_worker.get("resources") or {}).items()}
    if str(cfg.env.get("kind", "sim")) == "robot" and robot_res:
        wanted[ROBOTS] = robot_res
    sites: dict[str, Site] = {}
    seen: dict[tuple[str, ...], str] = {}
    for name, res in wanted.items():
        members = [n for n in alive if all(float(n.get("Resources", {}).get(k, 0.0)) > 0 for k in res)]
        if not members:
            need = ", ".join(f'"{k}": 1' for k in res)
            raise ClusterError(f"placement=auto: no node of the cluster offers group {name!r} ({need}); start one with "
                               f"`ray start --address=<head> --resources='{{{need}}}'`")  # fmt: skip
        key = tuple(sorted(n["NodeID"] for n in members))
        if key in seen and name != ROBOTS:
            continue  # the same nodes under another name: one site
        seen.setdefault(key, name)
        res_of = lambda n, k: float(n.get("Resources", {}).get(k, 0.0))  # noqa: E731
        sites[name] = Site(name, res, members[0]["NodeID"], len(members), sum(res_of(n, "CPU") for n in members),
                           res_of(members[0], "CPU"), int(res_of(members[0], "GPU")))  # fmt: skip
    return sites


def spans_nodes(sites: dict[str, Site]) -> bool:
    """More than one machine to choose between (else the one-machine plan applies)."""
    return len({s.node for s in sites.values()}) > 1


def _probe_class():
    import ray

    @ray.remote
    class GroupProbe:
        """Profiles the roles on its node (:class:`~.profile.Profiler`, helpers pinned here) and
        serves and fetches the blobs that time the link."""

        def __init__(self, cfg):
            self.cfg = cfg
            self.sizes: dict[str, int] = {}

        def profile(self, seconds: float) -> tuple[dict, dict, dict]:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            from rlinf_user.runtime.planning.profile import Profiler

            node = ray.get_runtime_context().get_node_id()
            prof = Profiler(self.cfg, seconds, pin={"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)},
                            replicas=False)  # fmt: skip
            costs, pipe = prof._run(time.perf_counter() + seconds)
            self.sizes = dict(prof.sizes)
            return costs.to_dict(), dict(pipe.__dict__), self.sizes

        def blobs(self, sizes: dict[str, int]) -> list:
            import numpy as np

            return [{k: ray.put(np.ones(max(1, int(n)), np.uint8))} for k, n in sizes.items()]  # refs, not values

        def fetch(self, wrapped: list) -> dict[str, float]:
            out = {}
            for item in wrapped:
                (k, ref), = item.items()
                t0 = time.perf_counter()
                ray.get(ref)
                out[k] = time.perf_counter() - t0
            return out

    return GroupProbe


def profile_cluster(cfg, sites: dict[str, Site], budget_s: float, progress=None) -> tuple[ClusterCosts, Pipeline]:
    """Every site profiled on its own node at once, then the link between every two sites."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    progress = progress or (lambda what, share: None)
    probe_cls = _probe_class()
    probes = {name: probe_cls.options(num_cpus=0, num_gpus=min(1, s.gpus),
                                      scheduling_strategy=NodeAffinitySchedulingStrategy(s.node, soft=False)).remote(cfg)
              for name, s in sites.items()}  # fmt: skip
    progress("node groups " + ", ".join(sites), 0.1)
    calls = {name: p.profile.remote(float(budget_s)) for name, p in probes.items()}
    costs, pipe, sizes = {}, None, {}
    try:
        for name, call in calls.items():
            try:
                c, pipe_d, sz = ray.get(call)
            except Exception as err:  # the site and its error (the profile's own message where it has one)
                cause = getattr(err, "cause", None) or err
                raise ProfileError(f"profiling node group {name!r} failed: {cause}") from err
            c = Costs.from_dict(c)
            c.cores, c.gpus = int(round(sites[name].cores)), sites[name].gpus  # Ray's view, not os.cpu_count()
            costs[name] = c
            pipe = Pipeline(**pipe_d)
            for k, v in sz.items():
                sizes[k] = max(sizes.get(k, 0), v)
        progress("the link between node groups", 0.9)
        link = {}
        for a in sites:
            for b in sites:
                if a == b or sites[a].node == sites[b].node:
                    continue
                runs = [ray.get(probes[b].fetch.remote(ray.get(probes[a].blobs.remote(sizes)))) for _ in range(LINK_REPEATS)]
                link[f"{a}->{b}"] = {f"{k}_s": statistics.median(r[k] for r in runs) for k in ("chunk", "weights") if k in sizes}
                link[f"{a}->{b}"].update({f"{k}_bytes": float(n) for k, n in sizes.items()})
    finally:
        for p in probes.values():
            ray.kill(p)
    progress("done", 1.0)
    return ClusterCosts(sites, costs, link), pipe


def view(cc: ClusterCosts, workers: str, learner: str, server: str | None = None) -> tuple[Costs, Sites | None]:
    """The model's inputs for workers on site ``workers``, the learner on ``learner`` and the
    rollout server on ``server``: the workers' node's costs with the learner's own curves,
    and the :class:`~.model.Sites` between them (None: one node)."""
    w, lc = cc.costs[workers], cc.costs[learner]
    out = replace(w, update=dict(lc.update), sampling=lc.sampling, sample_transfer=lc.sample_transfer, store=lc.store,
                  dp_overhead={}, replica_start_s={}, publish_s=lc.publish_s, gpus=max(w.gpus, lc.gpus),
                  act={**(cc.costs[server].act if server else {}), **w.act})  # fmt: skip
    if cc.sites[workers].node == cc.sites[learner].node:
        return out, None
    fwd, back = cc.link.get(f"{workers}->{learner}", {}), cc.link.get(f"{learner}->{workers}", {})
    return out, Sites(learner_cores=cc.sites[learner].node_cores, rollout_with_learner=server == learner,
                      link_rows_s=float(fwd.get("chunk_s", 0.0)), link_weights_s=float(back.get("weights_s", 0.0)),
                      rollout_act=dict(cc.costs[server].act) if server else None)  # fmt: skip


ASKS = {"learner": 1.0, "env_worker": 1.0, "buffer": 0.5, "eval_worker": 1.0, "rollout": 1.0}
WEIGHT_STORE_CPUS = 0.1  # the weight store's ask, beside the learner (placement.make_plan)


def asks_of(cfg) -> dict[str, float]:
    """The CPUs each role asks Ray for (``placement.<role>.num_cpus``)."""
    return {role: float(cfg.placement[role].get("num_cpus", default)) for role, default in ASKS.items()}


def fits(cc: ClusterCosts, c: Candidate, asks: dict[str, float] | None = None) -> bool:
    """Whether the roles' CPU asks fit the CPUs Ray reports on the nodes the candidate puts
    them on (groups on one machine share its CPUs): the learner, its weight store and (apart)
    its buffer; the workers and, on a simulator, the evaluation worker; the rollout server."""
    asks = asks or ASKS
    need: dict[str, float] = {}
    cores: dict[str, float] = {}

    def add(site: str, cpus: float) -> None:
        s = cc.sites[site]
        need[s.node] = need.get(s.node, 0.0) + cpus
        cores[s.node] = s.cores

    add(c.learner_group, asks["learner"] + WEIGHT_STORE_CPUS + (asks["buffer"] if c.mode == "disaggregated" else 0.0))
    if c.worker_group:
        add(c.worker_group, c.workers * asks["env_worker"] + asks["eval_worker"])
    if c.rollout and c.rollout_group:
        add(c.rollout_group, asks["rollout"])
    return all(need[n] <= cores[n] + 1e-9 for n in need)


def rank_cluster(cc: ClusterCosts, pipe: Pipeline, *, served: bool = True, asks: dict[str, float] | None = None) -> list[Prediction]:
    """Every placement over the sites that fits their CPUs (:func:`fits`), best first
    (:func:`~.model.rank`'s order): the learner on any node group, the workers on any (a
    robot run's: on its robots), the rollout server beside either."""
    groups = [n for n in cc.sites if n != ROBOTS]
    worker_sites = [ROBOTS] if ROBOTS in cc.sites else groups
    preds = []
    for L in groups:
        for W in worker_sites:
            for R in dict.fromkeys([x for x in (W, L) if x != ROBOTS]):
                costs, sites = view(cc, W, L, R)
                for c in candidates(costs, pipe, served=served):
                    if not c.rollout and R != (W if W != ROBOTS else L):
                        continue  # one copy of each unserved candidate
                    if c.rollout and c.act_device not in cc.costs[R].act:
                        continue
                    placed = replace(c, learner_replicas=1, learner_group=L, worker_group="" if W == ROBOTS else W,
                                     rollout_group=R if c.rollout else "")  # fmt: skip
                    if fits(cc, placed, asks):
                        preds.append(predict(costs, pipe, placed, sites))
    if not preds:
        cpus = ", ".join(f"{n}: {s.cores:g}" for n, s in cc.sites.items())
        raise ClusterError(f"placement=auto: no placement of the roles fits the CPUs the node groups offer ({cpus}); "
                           f"the learner asks {(asks or ASKS)['learner']:g} and each env worker "
                           f"{(asks or ASKS)['env_worker']:g}: add CPUs (`ray start --num-cpus`) or lower the asks "
                           "(placement.<role>.num_cpus)")  # fmt: skip
    return rank(cc.costs[worker_sites[0]], pipe, preds=preds)


def chosen_costs(cc: ClusterCosts, c: Candidate) -> Costs:
    """The one-machine costs of the chosen candidate's workers' site (what a re-plan and the
    drift watch read)."""
    return cc.costs[c.worker_group or ROBOTS]

