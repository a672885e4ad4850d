"""Sample efficiency on gym_hil's randomised pick (state), recipe against its ablations.

Each seed records its own scripted demonstrations (``teleop=synthetic``, on block
positions from that seed), then trains every variant until evaluation success reaches
``--target`` on ``--eval-episodes`` held-out block positions, or ``--max-steps`` env steps,
or ``--minutes``. Every result carries the person's cost: the demonstration steps and
the supervisor's steps and take-overs (a take-over is a stretch of supervisor-driven
steps). Writes ``results/<name>.json`` and ``results/<name>_curve.png`` (success against
env steps and against wall-clock, mean and range over seeds).

    python benchmarks/bench_pick_random.py --seeds 0 1 2 --variants recipe
    python benchmarks/bench_pick_random.py --name pick_random_variants --seeds 0 1 2 --max-steps 10000 \
        --minutes 5 --variants recipe crossq utd2 ten_critics one_step no_bc sac
    python benchmarks/bench_pick_random.py --sim gym_hil_pixels --seeds 0 --target 0.8 \
        --eval-episodes 20 --eval-every 4000 --final-eval 50 --name pick_pixels

``dsrl``/``dsrl_na``: a flow policy is first cloned on the seed's demos (``algo=bc
policy=flow``) and frozen; ``algo=dsrl`` steers its noise (its first evaluation is the clone's
zero-noise policy):

    python benchmarks/bench_pick_random.py --name dsrl_pick --variants dsrl flow --seeds 0 1 2 --jobs 3 \
        --max-steps 10000 --target 0.98 --final-eval 50

``--sim gym_hil_pixels``: the same pick seen through the front and wrist cameras (frozen
EfficientNet-Lite0 features, no block position in the state). ``--final-eval N``: the kept
(best) policy once more on N block positions that neither training nor the evaluations
that chose it used.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from holding import holding, holding_table, training_success
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
ENV: list[str] = []  # configs/sim/gym_hil_random.yaml: random block, sparse reward, 50 held-out positions
SIM = ["gym_hil_random"]  # --sim
DEMO_EPISODES = 20
# the default job's recipe: configs/sim/gym_hil_random.yaml's tuning for rlpd, with the demos
RECIPE = ["algo=rlpd", "demos={demos}"]
SAME_TUNING = ["algo.demo_ratio=0.5", "demos={demos}", "algo.n_step=3", "algo.backup_entropy=false",
               "algo.init_temperature=0.03", "algo.autotune_temperature=false", "algo.final_temperature=0.005",
               "algo.temperature_decay_updates=20000", "algo.bc_warmup_updates=3000",
               "algo.critic_warmup_updates=2000",
               "algo.bc_weight=1.0", "algo.learning_starts=0", "algo.paced=true"]  # fmt: skip
IQL_BASE = ["algo=iql", "demos={demos}", "algo.paced=true", "algo.explore_std=0"]
VARIANTS: dict[str, list[str]] = {
    "recipe": RECIPE,
    # the recipe without one of its parts
    "one_step": [*RECIPE, "algo.n_step=1"],
    "no_bc": [*RECIPE, "algo.bc_warmup_updates=0", "algo.critic_warmup_updates=0", "algo.bc_weight=0"],
    "entropy_backup": [*RECIPE, "algo.backup_entropy=true"],
    # the temperature tuned to SAC's default target entropy (-2 here), as the recipe had it
    # before its decline past 10,000 env steps was traced to it
    "autotuned": [*RECIPE, "algo.autotune_temperature=true", "algo.init_temperature=0.01",
                  "algo.final_temperature=null"],  # fmt: skip
    # ... or held at 0.01 throughout
    "fixed_temperature": [*RECIPE, "algo.init_temperature=0.01", "algo.final_temperature=null"],
    # ... acting and evaluated through a moving average of the actor (1,000 updates)
    "ema": [*RECIPE, "algo.policy_ema=0.999"],
    # ... or with the actor's learning rate falling 10x over the temperature's 20,000 updates
    # (the recipe's since it held 3 seeds for 30 minutes; the variant stays for the results
    # that name it), or held at 3e-4 as before
    "lr_decay": [*RECIPE, "algo.final_actor_lr=3e-5", "algo.actor_lr_decay_updates=20000"],
    "constant_actor_lr": [*RECIPE, "algo.final_actor_lr=null"],
    # ... or with the temperature falling on to 0.001 by 40,000 updates (to 20,000 about the
    # recipe's schedule, 0.0055 there against its 0.005; then five times lower)
    "settle": [*RECIPE, "algo.final_temperature=0.001", "algo.temperature_decay_updates=40000"],
    # ... or the state recipe's temperature schedule where a sim's tuning differs (pixels)
    "scheduled": [*RECIPE, "algo.autotune_temperature=false", "algo.init_temperature=0.03",
                  "algo.final_temperature=0.005", "algo.temperature_decay_updates=20000"],  # fmt: skip
    # ... or with more of something
    "ten_critics": [*RECIPE, "algo.num_critics=10"],
    "utd2": [*RECIPE, "algo.utd_ratio=2"],
    # ... or changed: critics with their own image encoder; a sharper policy (target entropy)
    "separate_encoders": [*RECIPE, "algo.shared_encoder=false"],
    "sharp": [*RECIPE, "algo.autotune_temperature=true", "algo.final_temperature=null", "algo.target_entropy=-8"],
    # the actor weights the actions it saw by their advantage instead of following the
    # critic's action-gradient (AWAC)
    "awac": [*RECIPE, "algo.actor_loss=awac"],
    # ... and the actor's encoder its own (trained by the actor's loss and the BC warm start):
    # the shared one, trained by the critic's TD loss from the first update, moved the
    # features under a cloned actor held still by the critic's warm-up
    "awac_own_encoder": [*RECIPE, "algo.actor_loss=awac", "algo.shared_encoder=false"],
    # ... and AWAC's std fitted by its weighted likelihood (the mean held), the entropy term all
    # but off: left to the entropy term, the std from pixels grew to ~0.4 a dimension on the
    # policy's own states and sank its training episodes. A floor of 0.05 adds to the spread of
    # the policy's own samples, so it compounds; without one the fit only follows that spread
    "awac_std": [*RECIPE, "algo.awac_min_std=0.05", "algo.autotune_temperature=false", "algo.init_temperature=1e-4"],
    "awac_std_zero": [*RECIPE, "algo.awac_min_std=0", "algo.autotune_temperature=false", "algo.init_temperature=1e-4"],
    "crossq": ["algo=crossq", *SAME_TUNING],
    # the flow policy (SAC-Flow: the actor a few Euler steps of a learned velocity field),
    # with the recipe's demo tuning and LayerNorm critics
    "flow": ["algo=sac_flow", "policy=flow", *SAME_TUNING, "algo.critic_layer_norm=true"],
    # no demonstrations: the scripted supervisor takes over when the pick stalls (HIL-SERL
    # style); its steps are drawn on the demo side of each batch and pull the actor (bc_weight)
    "supervisor": ["algo=rlpd", "algo.bc_warmup_updates=0", "algo.critic_warmup_updates=0",
                   "intervention.enabled=true", "intervention.synthetic_human=true"],  # fmt: skip
    # ... the same supervisor, more patient: it waits 2 s (20 steps) without progress, not 0.5 s
    "supervisor_patient": ["algo=rlpd", "algo.bc_warmup_updates=0", "algo.critic_warmup_updates=0",
                           "intervention.enabled=true", "intervention.synthetic_human=true",
                           "intervention.patience=20"],  # fmt: skip
    # HIL-SERL's recipe: the demonstrations first, the supervisor's take-overs on top
    "demos_supervisor": [*RECIPE, "intervention.enabled=true", "intervention.synthetic_human=true"],
    "demos_supervisor_patient": [*RECIPE, "intervention.enabled=true", "intervention.synthetic_human=true",
                                 "intervention.patience=20"],  # fmt: skip
    "sac": ["algo=sac"],  # from scratch: no demonstrations, no supervisor
    # IQL's earlier variants, as they were measured (no exploration floor; each names what it
    # sets, over the task's IQL tuning): offline on the demonstrations (its own losses,
    # algo.offline_updates), then online with half of every batch from them, AWR ...
    "iql": [*IQL_BASE, "algo.extraction=awr"],
    # ... its actor extracted online by DDPG+BC from the same in-sample critics
    "iql_ddpg_bc": [*IQL_BASE, "algo.extraction=ddpg_bc", "algo.bc_rows=all"],
    # ... its regression term on the demonstrated rows only (as the recipe's TD3+BC), or on
    # every row by its advantage weight
    "iql_bc_demos": [*IQL_BASE, "algo.extraction=ddpg_bc", "algo.bc_rows=demos"],
    "iql_bc_weighted": [*IQL_BASE, "algo.extraction=ddpg_bc", "algo.bc_rows=weighted"],
    # ... on the demonstrated rows, AWR for the first 2,500 online updates (the critics learn
    # the policy's own actions before their action-gradient moves it)
    "iql_bc_demos_warm": [*IQL_BASE, "algo.extraction=ddpg_bc", "algo.bc_rows=demos",
                          "algo.ddpg_bc_warmup_updates=2500"],  # fmt: skip
    # IQL's recipe for this task (configs/sim/gym_hil_random.yaml, algo_tuning.iql): DDPG+BC
    # online on the demonstrated rows, exploring with a std of 0.5 or more
    "iql_recipe": ["algo=iql", "demos={demos}"],
    # DSRL: SAC over the input noise of a flow policy cloned on the same demos ({clone}:
    # algo=bc policy=flow, CLONE_UPDATES updates), frozen; the clone's own success is the
    # run's first evaluation
    "dsrl": ["algo=dsrl", "policy=flow", "algo.base_checkpoint={clone}", "algo.paced=true"],
    # DSRL-NA: the same, its noise critic distilled from an action critic that also learns
    # from the demonstrations (a quarter of each batch)
    "dsrl_na": ["algo=dsrl", "policy=flow", "algo.base_checkpoint={clone}", "algo.paced=true",
                "algo.action_critic=true", "demos={demos}", "algo.demo_ratio=0.25"],
}
CLONE_UPDATES = 3000  # behaviour-cloning updates of the flow policy that dsrl steers


def record_demos(root: Path, seed: int, episodes: int = DEMO_EPISODES, spread: bool = False) -> int:
    from rlinf_user.cli.main import main

    info = root / "meta" / "info.json"
    if info.exists() and json.loads(info.read_text())["total_episodes"] == episodes:  # a rerun keeps its demos
        print(f"reusing the {episodes} demonstrations in {root}")
        return int(json.loads(info.read_text())["total_frames"])
    rc = main(["teleop", "--sim", SIM[0], "teleop=synthetic", *ENV, f"dataset.root={root}",
               f"dataset.episodes={episodes}", f"seed={seed}", f"teleop.spread={str(spread).lower()}"])  # fmt: skip
    if rc != 0:
        raise SystemExit(f"recording demonstrations exited {rc}")
    return int(json.loads((root / "meta" / "info.json").read_text())["total_frames"])


def clone_flow(work: Path, demos: Path, seed: int) -> Path:
    """The flow policy that DSRL steers: cloned on the seed's demonstrations (once per seed)."""
    from rlinf_user.cli.main import main

    run = work / f"clone_s{seed}"
    if not (run / "checkpoints" / "best.pt").exists():
        rc = main(["train", "--sim", SIM[0], *ENV, "algo=bc", "policy=flow", f"demos={demos}", f"seed={seed}",
                   f"total_env_steps={CLONE_UPDATES}", "eval_every_steps=1000000", "eval_at_start=false",
                   f"run_root={work}", f"run_name={run.name}", "progress=false"])  # fmt: skip
        if rc != 0:
            raise SystemExit(f"cloning the flow policy exited {rc}")
    return run


def supervisor_steps(run: Path) -> tuple[int, int]:
    """(supervisor-driven steps, take-overs) from the run's replay log."""
    from rlinf_user.data.record_log import RecordLog

    rows = [(int(e), int(s), bool(f)) for c in RecordLog(run / "buffer").read_all()
            for e, s, f in zip(c["env_id"], c["step"], c["intervention"])]  # fmt: skip
    steps = takeovers = 0
    last: dict[int, tuple[int, bool]] = {}
    for env, step, flag in sorted(rows):
        prev = last.get(env)
        if flag:
            steps += 1
            if prev is None or not prev[1] or prev[0] != step - 1:
                takeovers += 1
        last[env] = (step, flag)
    return steps, takeovers


def run_variant(name: str, seed: int, args, work: Path, demos: Path, demo_steps: int) -> dict:
    from rlinf_user.cli.main import main

    run_name = f"{name}_s{seed}"
    clone = clone_flow(work, demos, seed) if any("{clone}" in o for o in VARIANTS[name]) else None
    overrides = [o.format(demos=demos, clone=clone) for o in VARIANTS[name]]
    argv = [
        "train", "--sim", SIM[0], *ENV, f"seed={seed}", f"target_success={args.target}",
        f"max_wall_minutes={args.minutes}", f"total_env_steps={args.max_steps}", f"eval_every_steps={args.eval_every}",
        f"eval_episodes={args.eval_episodes}", "eval_at_start=true", f"run_root={work}", f"run_name={run_name}",
        "progress=false", *overrides,
    ]  # fmt: skip
    t0 = time.monotonic()
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"{name} seed {seed}: train exited {rc}")
    run = work / run_name
    with open(run / "eval" / "history.csv") as f:
        history = [{k: float(v) for k, v in h.items()} for h in csv.DictReader(f)]
    summary = json.loads((run / "eval" / "summary.json").read_text())
    reached = next((h for h in history if h["success_rate"] >= args.target), None)
    used_demos = clone is not None or any(o.startswith("demos=") for o in overrides)
    sup_steps, takeovers = supervisor_steps(run)
    env_steps = int(summary["env_steps"])
    human = (demo_steps if used_demos else 0) + sup_steps
    shutil.copy(run / "eval" / "history.csv", RESULTS / f"{args.name}_{run_name}_history.csv")
    final = None
    if args.final_eval:  # fresh positions: other episode seeds than the evaluations that chose the policy
        rc = main(["eval", str(run), "--checkpoint", "best", "--episodes", str(args.final_eval), "--video-episodes", "0",
                   "--out", str(run / "final"), "--episode-offset", "100000"])  # fmt: skip
        if rc == 0:
            final = {k: v for k, v in json.loads(next((run / "final").glob("eval-*.json")).read_text()).items()
                     if not isinstance(v, list | dict) or "ci95" in k}  # fmt: skip
    rolling = training_success(run)
    return {
        "variant": name,
        "seed": seed,
        "overrides": overrides,
        "holding": holding(history, rolling, args.hold_level, args.hold_floor, alone=args.jobs == 1),
        "training_success": rolling,
        "reached_target": reached is not None,
        "env_steps_to_target": int(reached["env_steps"]) if reached else None,
        "minutes_to_target": round(reached["wall_seconds"] / 60, 2) if reached else None,
        "success_at_target": [reached["success_rate"], reached["ci95_low"], reached["ci95_high"]] if reached else None,
        "best_eval_success": summary["best_eval_success"],
        "final_eval": summary.get("final_eval"),
        "test_eval": {k: v for k, v in (summary.get("test_eval") or {}).items() if not isinstance(v, list | dict) or "ci95" in k},
        "env_steps": env_steps,
        "wall_minutes": round((time.monotonic() - t0) / 60, 2),
        "demo_steps": demo_steps if used_demos else 0,
        "supervisor_steps": sup_steps,
        "takeovers": takeovers,
        "human_share": round(human / max(1, env_steps + (demo_steps if used_demos else 0)), 4),
        "final_eval_fresh_positions": final,
        "history": history,
    }


def variants_of(rows: list[dict]) -> list[str]:
    """The variants present, in VARIANTS' order (the recipe first)."""
    return [v for v in VARIANTS if any(r["variant"] == v for r in rows)]


def plot(rows: list[dict], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rolling = any(r.get("training_success") for r in rows)
    fig, axes = plt.subplots(1, 3 if rolling else 2, figsize=(16 if rolling else 11, 4))
    ax_s, ax_t = axes[0], axes[1]
    for i, variant in enumerate(variants_of(rows)):
        runs = [r for r in rows if r["variant"] == variant]
        colour, style = f"C{i % 10}", "-" if i < 10 else "--"  # past 10 colours, dashed
        for key, ax, scale in (("env_steps", ax_s, 1e-3), ("wall_seconds", ax_t, 1 / 60)):
            grid = np.unique(np.concatenate([[h[key] * scale for h in r["history"]] for r in runs]))
            # each seed's success held from one evaluation to the next (a step function); a
            # run that stopped at its target keeps its last evaluation (it keeps that policy)
            curves = []
            for r in runs:
                xs = np.array([h[key] * scale for h in r["history"]])
                ys = np.array([h["success_rate"] for h in r["history"]])
                at = np.searchsorted(xs, grid, side="right") - 1
                curves.append(np.where(at >= 0, ys[np.clip(at, 0, None)], np.nan))
                ax.plot(xs, ys, color=colour, alpha=0.35, linewidth=0.8, drawstyle="steps-post")
            curves = np.array(curves)
            label = f"{variant} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
            with np.errstate(all="ignore"):
                ax.plot(grid, np.nanmean(curves, 0), color=colour, linestyle=style, label=label, drawstyle="steps-post")
                if len(runs) > 1:
                    ax.fill_between(grid, np.nanmin(curves, 0), np.nanmax(curves, 0), color=colour, alpha=0.15, step="post")
    if rolling:  # what a robot user sees: the last 50 training episodes
        for i, variant in enumerate(variants_of(rows)):
            for r in (r for r in rows if r["variant"] == variant and r.get("training_success")):
                pts = np.array(r["training_success"])
                axes[2].plot(pts[:, 0] * 1e-3, pts[:, 2], color=f"C{i % 10}", alpha=0.6, linewidth=0.9)
        axes[2].set_title("training episodes (last 50), each seed", fontsize=9)
    labels = [(ax_s, "env steps (thousands; 36k = 1 h at 10 Hz)", "evaluation success"),
              (ax_t, "wall-clock minutes (2 CPU cores)", "evaluation success")]
    if rolling:
        labels.append((axes[2], "env steps (thousands)", "training-episode success"))
    for ax, xl, yl in labels:
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_ylim(-0.02, 1.02)
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    ax_s.legend(fontsize=8, loc="lower right")
    n = rows[0]["history"][0].get("episodes", 0)
    seen = "front + wrist cameras" if SIM[0] == "gym_hil_pixels" else "state"
    fig.suptitle(f"gym_hil pick, random block ({seen}): mean (thick), range (band) and each seed (thin) over seeds; "
                 f"{int(n)} held-out positions per evaluation", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(rows: list[dict], target: float) -> str:
    """One markdown row per variant, over its seeds: how many reached the target, the median
    env steps and minutes to it (a seed that missed it counts as never), the best and the last
    evaluation, the person's share."""
    out = [f"| variant | seeds at >= {target:.0%} | env steps to it (median of all seeds; each seed) | wall-clock (median) "
           "| best evaluation (each seed) | last policy (each seed) | person's share (mean) |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for variant in variants_of(rows):
        runs = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["seed"])
        hit = [r for r in runs if r["reached_target"]]
        steps = ", ".join(f"{r['env_steps_to_target']:,}" if r["reached_target"] else f"not in {r['env_steps']:,}"
                          for r in runs)  # fmt: skip
        # medians over all seeds, a seed that never reached the target counting as never
        med = {k: np.median([r[k] if r["reached_target"] else np.inf for r in runs])
               for k in ("env_steps_to_target", "minutes_to_target")}  # fmt: skip
        med_steps = f"{int(med['env_steps_to_target']):,}" if np.isfinite(med["env_steps_to_target"]) else "-"
        med_min = f"{med['minutes_to_target']:.1f} min" if np.isfinite(med["minutes_to_target"]) else "-"
        best = ", ".join(f"{r['best_eval_success']:.0%}" for r in runs)
        last = ", ".join(f"{r['history'][-1]['success_rate']:.0%}" for r in runs)
        share = np.mean([r["human_share"] for r in runs])
        out.append(f"| {variant} | {len(hit)}/{len(runs)} | {med_steps} ({steps}) | {med_min} | {best} | {last} "
                   f"| {share:.1%} |")  # fmt: skip
    return "\n".join(out)


def replot(name: str, target: float, level: float, floor: float) -> None:
    """Redraw the curve and recount the holding from the stored histories (the file is
    rewritten with the recount)."""
    path = RESULTS / f"{name}.json"
    data = json.loads(path.read_text())
    SIM[0] = data.get("sim", SIM[0])
    for r in data["runs"]:
        if r.get("history") and r.get("training_success") is not None:
            r["holding"] = holding(r["history"], r["training_success"], level, floor,
                                   alone=r.get("side_by_side", 1) == 1)
    path.write_text(json.dumps(data, indent=2))
    plot(data["runs"], RESULTS / f"{name}_curve.png", target)
    print(table(data["runs"], target))
    print(holding_table(data["runs"], variants_of(data["runs"])))


def write(path: Path, rows: list[dict], args) -> None:
    out = {
        "task": "gym_hil PandaPickCube, random block position (20 x 30 cm), sparse reward, "
                + ("front + wrist cameras 128x128 and arm state (frozen EfficientNet-Lite0 features)"
                   if args.sim == "gym_hil_pixels" else "state observations"),
        "sim": args.sim,
        "machine": describe(),
        "target_success": args.target,
        "eval_episodes": args.eval_episodes,
        "demo_episodes": args.demos,
        "demos_spread": bool(args.spread),
        "date": time.strftime("%Y-%m-%d"),
        "runs": rows,
    }  # fmt: skip
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=["recipe"], choices=list(VARIANTS))
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--max-steps", type=int, default=30000)
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--eval-episodes", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=2500)
    ap.add_argument("--name", default="pick_random")
    ap.add_argument("--append", action="store_true", help="keep the results file's other runs")
    ap.add_argument("--keep", default=None, help="keep the demos and run folders (checkpoints) here instead of deleting them")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw the curve and recount the holding from the results file")
    ap.add_argument("--sim", default="gym_hil_random", help="gym_hil_random (state) or gym_hil_pixels (cameras)")
    ap.add_argument("--final-eval", type=int, default=0, help="episodes of a last evaluation of the kept policy")
    ap.add_argument("--hold-level", type=float, default=0.98, help="success that, once reached, ...")
    ap.add_argument("--hold-floor", type=float, default=0.95, help="... must not be left below from then on")
    ap.add_argument("--demos", type=int, default=DEMO_EPISODES, help="scripted demonstrations recorded per seed")
    ap.add_argument("--spread", action="store_true",
                    help="record the demonstrations with teleop.spread=true (block positions cover the box)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="seeds run side by side (each its own process; a paced run learns the same per env "
                         "step however slowly it runs, but its minutes stretch: compare minutes at --jobs 1)")
    args = ap.parse_args()
    SIM[0] = args.sim
    if args.replot:
        return replot(args.name, args.target, args.hold_level, args.hold_floor)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    rows = json.loads(path.read_text())["runs"] if args.append and path.exists() else []
    if args.jobs > 1 and len(args.seeds) > 1:
        return side_by_side(args, path, rows)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-pick-random-"))
    work.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        demos = work / f"demos_s{seed}"
        demo_steps = record_demos(demos, seed, args.demos, args.spread) if any(k in " ".join(VARIANTS[v]) for v in args.variants
                                                      for k in ("{demos}", "{clone}")) else 0
        for v in args.variants:
            run = run_variant(v, seed, args, work, demos, demo_steps)
            rows = [r for r in rows if (r["variant"], r["seed"]) != (v, seed)] + [run]  # a rerun replaces its row
            write(path, rows, args)  # after every run: a sweep that is stopped keeps the runs it finished
    report(rows, args)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def side_by_side(args, path: Path, rows: list[dict]) -> None:
    """Each seed in its own process (``--seeds S --name <name>.sS``), --jobs at a time; their
    rows merged into the results file."""
    import subprocess
    import sys

    argv = [a for a in sys.argv[1:]]
    base = []
    skip = False
    for a in argv:  # the other options as given, without --seeds/--jobs/--name/--append
        if skip and not a.startswith("--"):
            continue
        skip = a in ("--seeds", "--jobs", "--name")
        if not skip and a != "--append":
            base.append(a)
    pending, running = list(args.seeds), {}
    while pending or running:
        while pending and len(running) < args.jobs:
            seed = pending.pop(0)
            cmd = [sys.executable, __file__, *base, "--seeds", str(seed), "--name", f"{args.name}.s{seed}"]
            running[seed] = subprocess.Popen(cmd)
        for seed, proc in list(running.items()):
            if proc.poll() is not None:
                del running[seed]
                if proc.returncode != 0:
                    raise SystemExit(f"seed {seed} exited {proc.returncode}")
        time.sleep(2)
    for seed in args.seeds:
        part = RESULTS / f"{args.name}.s{seed}.json"
        got = json.loads(part.read_text())["runs"]
        for r in got:  # this sweep's rows only: an appended file keeps its other runs' own counts
            r["side_by_side"] = args.jobs
            if r.get("history"):  # its minutes were shared: no reading in minutes
                r["holding"] = holding(r["history"], r.get("training_success") or [], args.hold_level,
                                       args.hold_floor, alone=False)  # fmt: skip
        keys = {(r["variant"], r["seed"]) for r in got}
        rows = [r for r in rows if (r["variant"], r["seed"]) not in keys] + got
        part.unlink()
        (RESULTS / f"{args.name}.s{seed}_curve.png").unlink(missing_ok=True)
        for csv_path in RESULTS.glob(f"{args.name}.s{seed}_*_history.csv"):
            csv_path.replace(RESULTS / csv_path.name.replace(f"{args.name}.s{seed}_", f"{args.name}_"))
    write(path, rows, args)
    report(rows, args)


def report(rows: list[dict], args) -> None:
    plot(rows, RESULTS / f"{args.name}_curve.png", args.target)
    print(table(rows, args.target))
    print(holding_table(rows, variants_of(rows)))
    for r in rows:
        print(f"{r['variant']:<12} seed {r['seed']}: to {args.target:.0%}: {r['env_steps_to_target']} steps / "
              f"{r['minutes_to_target']} min; best {r['best_eval_success']:.0%}; human share {r['human_share']:.1%} "
              f"({r['demo_steps']} demo + {r['supervisor_steps']} supervisor steps, {r['takeovers']} take-overs)")  # fmt: skip
        h = r.get("holding")
        if h and h["reached"]:
            print(f"    {h['level']:.0%} at {h['env_steps']:,} steps ({h['minutes']} min); over the next "
                  f"{h['env_steps_after']:,} steps the lowest evaluation {h['lowest_eval_after']:.0%}, the lowest "
                  f"rolling training success {h['lowest_training_after']}")  # fmt: skip


if __name__ == "__main__":
    main()
