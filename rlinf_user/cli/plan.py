"""``rlinf-user plan``: profile the run's roles here and rank the placements, without training."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlinf_user.config.compose import compose_config, validate

log = logging.getLogger(__name__)


def profile_with_progress(cfg, console, budget_s: float):
    """The profile (:mod:`rlinf_user.runtime.planning.profile`) behind a progress bar."""
    from rlinf_user.runtime.planning.profile import Profiler

    with Progress(TextColumn("profiling [bold]{task.description}[/]"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:  # fmt: skip
        task = bar.add_task("env", total=1.0)
        return Profiler(cfg, budget_s, lambda what, share: bar.update(task, description=what, completed=share)).run()


def plan_table(preds, top: int, chosen=None) -> Table:
    t = Table(title="placements, best first (predicted from the profile)")
    grouped = any(p.candidate.learner_group for p in preds[:top])
    cols = ("", "mode", "workers x envs", "rollout server", "learner", *(("node groups",) if grouped else ()),
            "env steps/s", "updates/s", "limited by", "learner busy", "CPU busy")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right" if col.endswith(("/s", "busy")) else "left", no_wrap=True)
    for p in preds[:top]:
        c = p.candidate
        mark = "→" if chosen is not None and c == chosen else ""
        t.add_row(mark, c.mode, f"{c.workers} x {c.envs_per_worker}", c.act_device if c.rollout else "-",
                  c.learner_device, *((c.where().strip(" []"),) if grouped else ()),
                  f"{p.env_steps_per_s:.1f}", f"{p.updates_per_s:.1f}", p.bottleneck,
                  f"{p.usage.get('learner', 0):.0%}", f"{p.usage.get('cpu', 0):.0%}")  # fmt: skip
    return t


def profile_and_rank(cfg, console, budget_s: float) -> tuple[list, dict]:
    """The profile and the ranking, best first, and what ``plan.json`` keeps of them: on one
    machine, or on a Ray cluster's node groups (``placement.ray_address`` with nodes in more
    than one group; :mod:`rlinf_user.runtime.planning.cluster`)."""
    from rlinf_user.runtime.planning.model import rank

    sites = cluster_sites(cfg)
    if sites is None:
        costs, pipe = profile_with_progress(cfg, console, budget_s)
        return rank(costs, pipe), {"costs": costs.to_dict(), "pipeline": pipe.__dict__}
    import ray

    from rlinf_user.runtime.planning.cluster import asks_of, chosen_costs, profile_cluster, rank_cluster

    try:
        with Progress(TextColumn("profiling [bold]{task.description}[/]"), BarColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as bar:  # fmt: skip
            task = bar.add_task("node groups", total=1.0)
            cc, pipe = profile_cluster(cfg, sites, budget_s, lambda what, share: bar.update(task, description=what,
                                                                                           completed=share))  # fmt: skip
    finally:
        ray.shutdown()
    preds = rank_cluster(cc, pipe, asks=asks_of(cfg))
    return preds, {"costs": chosen_costs(cc, preds[0].candidate).to_dict(), "cluster": cc.to_dict(),
                   "pipeline": pipe.__dict__}  # fmt: skip


def cluster_sites(cfg):
    """The node groups to plan over (:func:`~rlinf_user.runtime.planning.cluster.find_sites`),
    or None where there is one machine to plan: no ``placement.ray_address``, or a cluster
    whose groups are all one machine. Connects to the cluster to look (and leaves it
    connected only when returning sites)."""
    if not cfg.placement.get("ray_address"):
        return None
    import ray

    from rlinf_user.runtime.planning.cluster import ClusterError, find_sites, spans_nodes
    from rlinf_user.runtime.ray_session import start_ray

    started = start_ray({"address": str(cfg.placement.ray_address), "log_to_driver": True})
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) > 1 and not cfg.placement.get("groups"):
            raise ClusterError(f"placement=auto on a cluster of {len(nodes)} nodes places its roles on node groups: name "
                               "them in placement.groups (e.g. +placement.groups.gpu_box='{gpu_box: 1}' +placement.groups.sims='{sims: 1}', "
                               "each a resource its nodes offer with `ray start --resources`)")  # fmt: skip
        sites = find_sites(cfg, nodes)
    except BaseException:
        if started:
            ray.shutdown()
        raise
    if spans_nodes(sites):
        return sites
    if started:
        ray.shutdown()
    return None


def run_plan(args, console) -> int:
    cfg = compose_config(args.overrides, sim=args.sim, robot=args.robot)
    validate(cfg)
    preds, kept = profile_and_rank(cfg, console, args.budget)
    pipe = kept["pipeline"]
    if pipe["on_policy"] and not kept["costs"]["update"]:
        log.warning("the learner's on-policy update was not profiled (a robot is not stepped for rows): its rounds are predicted from collection alone")
    console.print(plan_table(preds, args.top, preds[0].candidate))
    best = preds[0]
    console.print(f"chosen: [bold]{escape(best.candidate.label())}[/] (predicted {best.env_steps_per_s:.1f} env steps/s, "
                  f"limited by {best.bottleneck}); as overrides:")  # fmt: skip
    console.print("  " + " ".join(overrides_of(best.candidate)), soft_wrap=True)
    if args.out:
        out = {**kept, "ranking": [p.row() for p in preds], "chosen": best.candidate.placement(), "predicted": best.row()}
        Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
        console.print(f"written: {args.out}")
    return 0


def choose_placement(cfg, console) -> dict:
    """``placement=auto``: profile, rank, set the best candidate's values in ``cfg.placement``
    (so the run directory's config.yaml holds them) and return the plan to keep beside it."""
    preds, kept = profile_and_rank(cfg, console, float(cfg.placement.get("profile_s", 30.0)))
    best = preds[0]
    console.print(plan_table(preds, 5, best.candidate))
    p = best.candidate.placement()
    cfg.placement.mode = p["mode"]
    cfg.placement.num_env_workers = p["num_env_workers"]
    cfg.placement.envs_per_worker = p["envs_per_worker"]
    cfg.placement.rollout.enabled = p["rollout"]["enabled"]
    cfg.placement.rollout.device = p["rollout"]["device"]
    cfg.placement.learner_device = p["learner_device"]
    cfg.placement.learner_replicas = p["learner_replicas"]
    for role, group in p.get("groups", {}).items():
        cfg.placement[role].group = group
    console.print(f"placement=auto chose [bold]{escape(best.candidate.label())}[/]: predicted {best.env_steps_per_s:.1f} env "
                  f"steps/s and {best.updates_per_s:.1f} updates/s, limited by {best.bottleneck}")  # fmt: skip
    return {**kept, "ranking": [q.row() for q in preds], "chosen": p, "predicted": best.row()}


def overrides_of(c) -> list[str]:
    """The command-line overrides that set candidate ``c``."""
    return c.overrides()
