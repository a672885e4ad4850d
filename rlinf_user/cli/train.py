"""``rlinf-user train``."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

from rich.table import Table

from rlinf_user.config.compose import compose_config, to_yaml, validate

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted (Ctrl-C)"


def run_train(args, console) -> int:
    from omegaconf import OmegaConf

    cfg = compose_config(args.overrides, sim=args.sim, robot=args.robot)
    if cfg.resume:
        cfg = _resume_config(cfg, args.overrides)
    validate(cfg)
    if args.dry_run:
        print(to_yaml(cfg), end="")
        return 0
    from rlinf_user.cli.progress import LiveProgress
    from rlinf_user.rundir import attach_log_file, create_run_dir
    from rlinf_user.runtime.orchestration.trainer import Trainer

    plan = None
    if str(cfg.placement.mode) == "auto":  # profiled and chosen here: config.yaml keeps the choice
        from rlinf_user.cli.plan import choose_placement

        plan = choose_placement(cfg, console)
    run_dir = create_run_dir(cfg)
    if plan is not None:
        import json

        (run_dir / "plan.json").write_text(json.dumps(plan, indent=2, default=str) + "\n")
    attach_log_file(run_dir)
    console.print(f"run directory: [bold]{run_dir}[/]")
    OmegaConf.set_readonly(cfg, True)
    title = f"{cfg.env.backend}:{cfg.env.task} · {cfg.algo.name} · {cfg.placement.mode}"
    trainer = Trainer(cfg, run_dir)
    try:
        with LiveProgress(console, cfg.total_env_steps, title, enabled=cfg.progress) as live, stop_on_ctrl_c(trainer, console):
            trainer.on_progress = live
            trainer.run()
    finally:
        trainer.close()
    print_summary(console, trainer.summary, run_dir)
    return 0


@contextlib.contextmanager
def stop_on_ctrl_c(trainer, console):
    """The first Ctrl-C ends the run as any end does (:meth:`Trainer.stop`: the checkpoint,
    the final evaluation, the summary); a second one interrupts at once. Ray's own processes
    block SIGINT, so only this process sees it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        if trainer.stop_requested == INTERRUPTED:
            raise KeyboardInterrupt
        trainer.stop(INTERRUPTED)
        console.print("[yellow]Ctrl-C: stopping at the next tick (checkpoint, final evaluation, summary); "
                      "Ctrl-C again to interrupt at once[/]")  # fmt: skip

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0%}"


def print_summary(console, s: dict, run_dir) -> None:
    """The end-of-run table: what stopped it, which policy is kept, how to evaluate it."""
    from rlinf_user.evaluation import describe_eval
    from rlinf_user.runtime.orchestration.run_record import describe_fall

    console.print()
    table = Table(title="training finished", show_header=False, expand=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("stopped", str(s["stop_reason"]))
    table.add_row("env steps / episodes / updates", f"{s['env_steps']:,} / {s['episodes']:,} / {s['updates']:,}")
    table.add_row("wall time", f"{s['wall_seconds'] / 60:.1f} min")
    table.add_row(f"success (last {s.get('recent_episodes', 50)} training episodes)", _pct(s.get("recent_success")))
    final = s.get("final_eval") or {}
    table.add_row(f"final eval, validation seeds (last policy, v{s['policy_version']})",
                  describe_eval(final) if final.get("episodes") else _pct(s["final_eval_success"]))
    best = s.get("best")
    if best:
        table.add_row("kept policy (best validation)",
                      f"{best['checkpoint']} (v{best['policy_version']}, validation success {best['eval_success']:.0%})")
    fell = s.get("fell_from_best") or {}
    for what, label in (("evaluation", "validation"), ("training", "training episodes")):
        if fell.get(what):
            table.add_row(f"[yellow]{label} success fell from its best[/]", f"[yellow]{describe_fall(fell[what])}[/]")
    test = s.get("test_eval")
    if test:
        table.add_row(f"[bold]kept policy on the test seeds[/] ({test['policy']}, v{test['policy_version']})",
                      describe_eval(test))
    drift = s.get("placement_drift") or {}
    if drift.get("windows"):
        table.add_row("placement=auto: measured / predicted throughput",
                      f"median {drift['median_ratio']:.2f} over {len(drift['windows'])} windows "
                      f"({drift['drifted_windows']} off by more than 20%)")  # fmt: skip
    for d in s.get("placement_replans") or []:
        restart = f"; a restart with {' '.join(d['restart']['overrides'])} is predicted faster" if d["restart"] else ""
        table.add_row(f"re-planned at {d['at_s']:.0f} s ({d['reason']})",
                      f"{d['workers']['from']} -> {d['workers']['to']} env workers, predicted "
                      f"{d['predicted']['env_steps_per_s']} env steps/s (limited by {d['predicted']['bottleneck']}){restart}")
    table.add_row("latest checkpoint", str(s["checkpoint"]))
    console.print(table)
    which = "best" if best else "latest"
    console.print(f"evaluate the {'kept' if best else 'latest'} policy on more test episodes:\n"
                  f"  [bold]rlinf-user eval {run_dir} --checkpoint {which} --episodes 100[/]", soft_wrap=True)


def _resume_config(cfg, overrides):
    """Continue a run: its saved config, with this command line's overrides on top."""
    from pathlib import Path

    from omegaconf import OmegaConf

    saved = Path(cfg.resume) / "config.yaml"
    if not saved.exists():
        raise FileNotFoundError(f"resume={cfg.resume}: no config.yaml there")
    from rlinf_user.config.compose import GROUPS
    from rlinf_user.config.schema import RunConfig

    base = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(saved))
    # Key overrides (total_env_steps=..., algo.utd_ratio=...) apply on top of the saved
    # config; group choices (algo=rlpd) cannot change what a run is and are ignored.
    keyed = [o for o in overrides if "=" in o and not o.startswith(("~", "+"))]
    ignored = [o for o in keyed if o.split("=", 1)[0] in GROUPS]
    if ignored:
        log.warning("resume: ignoring group overrides %s (a resumed run keeps its groups)", ignored)
    explicit = OmegaConf.from_dotlist([o for o in keyed if o not in ignored])
    merged = OmegaConf.merge(base, explicit)
    merged.resume = cfg.resume
    return merged
