"""``rlinf-user plan``: profile the run's roles here and rank the placements, without training."""

from __future__ import annotations

import json
import logging
from pathlib import Path

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
    cols = ("", "mode", "workers x envs", "rollout server", "learner", "env steps/s", "updates/s", "limited by",
            "learner busy", "CPU busy")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right" if col.endswith(("/s", "busy")) else "left", no_wrap=True)
    for p in preds[:top]:
        c = p.candidate
        mark = "→" if chosen is not None and c == chosen else ""
        t.add_row(mark, c.mode, f"{c.workers} x {c.envs_per_worker}", c.act_device if c.rollout else "-",
                  c.learner_device, f"{p.env_steps_per_s:.1f}", f"{p.updates_per_s:.1f}", p.bottleneck,
                  f"{p.usage.get('learner', 0):.0%}", f"{p.usage.get('cpu', 0):.0%}")  # fmt: skip
    return t


def run_plan(args, console) -> int:
    from rlinf_user.runtime.planning.model import rank

    cfg = compose_config(args.overrides, sim=args.sim, robot=args.robot)
    validate(cfg)
    costs, pipe = profile_with_progress(cfg, console, args.budget)
    if pipe.on_policy and not costs.update:
        log.warning("the learner's on-policy update was not profiled (a robot is not stepped for rows): its rounds are predicted from collection alone")
    preds = rank(costs, pipe)
    console.print(plan_table(preds, args.top, preds[0].candidate))
    best = preds[0]
    console.print(f"chosen: [bold]{best.candidate.label()}[/] (predicted {best.env_steps_per_s:.1f} env steps/s, "
                  f"limited by {best.bottleneck}); as overrides:")  # fmt: skip
    console.print("  " + " ".join(overrides_of(best.candidate)), soft_wrap=True)
    if args.out:
        out = {"costs": costs.to_dict(), "pipeline": pipe.__dict__, "ranking": [p.row() for p in preds],
               "chosen": best.candidate.placement(), "predicted": best.row()}  # fmt: skip
        Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")
        console.print(f"written: {args.out}")
    return 0


def choose_placement(cfg, console) -> dict:
    """``placement=auto``: profile, rank, set the best candidate's values in ``cfg.placement``
    (so the run directory's config.yaml holds them) and return the plan to keep beside it."""
    from rlinf_user.runtime.planning.model import rank

    costs, pipe = profile_with_progress(cfg, console, float(cfg.placement.get("profile_s", 30.0)))
    preds = rank(costs, pipe)
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
    console.print(f"placement=auto chose [bold]{best.candidate.label()}[/]: predicted {best.env_steps_per_s:.1f} env "
                  f"steps/s and {best.updates_per_s:.1f} updates/s, limited by {best.bottleneck}")  # fmt: skip
    return {"costs": costs.to_dict(), "pipeline": pipe.__dict__, "ranking": [q.row() for q in preds],
            "chosen": p, "predicted": best.row()}  # fmt: skip


def overrides_of(c) -> list[str]:
    """The command-line overrides that set candidate ``c``."""
    return c.overrides()
