"""Live training display (rich) for the CLI."""

from __future__ import annotations

from rich.live import Live
from rich.table import Table

from rlinf_user.runtime.orchestration.run_record import RECENT_EPISODES, Progress, describe_fall


def progress_table(p: Progress, total_steps: int, title: str) -> Table:
    t = Table(title=title, show_header=False, expand=False, min_width=60)
    t.add_column(style="bold cyan")
    t.add_column(justify="right")
    pct = 100.0 * p.env_steps / max(1, total_steps)
    t.add_row("env steps", f"{p.env_steps:,} / {total_steps:,} ({pct:.0f}%)")
    t.add_row("episodes", f"{p.episodes:,}")
    t.add_row(f"success (last {RECENT_EPISODES} episodes)", f"{p.recent_success:.0%}")
    t.add_row("eval success (latest)", p.eval_detail or "-")
    t.add_row("eval success (best)", "-" if p.eval_success is None else f"{p.best_eval_success:.0%}")
    if p.eval_fall:
        t.add_row("[yellow]eval fell from its best[/]", f"[yellow]{describe_fall(p.eval_fall)}; checkpoints/best.pt kept[/]")
    if p.recent_fall:
        t.add_row("[yellow]training success fell from its best[/]", f"[yellow]{describe_fall(p.recent_fall)}[/]")
    t.add_row("env steps/s", f"{p.env_steps_per_s:,.0f}")
    t.add_row("updates (updates/s)", f"{p.updates:,} ({p.updates_per_s:,.0f}/s)")
    t.add_row("policy version", f"{p.version}")
    t.add_row("wall time", f"{p.wall / 60:.1f} min")
    if len(p.members) > 1:
        for name, m in sorted(p.members.items()):
            recent = list(m["recent"])
            rate = f"{sum(e['success'] for e in recent) / len(recent):.0%}" if recent else "-"
            t.add_row(f"  {name}", f"{m['env_steps']:,} steps, {m['episodes']:,} episodes, success {rate}")
    if p.intervention_rate is not None:
        t.add_row("human intervention (last 20 supervised episodes)", f"{p.intervention_rate:.0%}")
    if p.supervisor_lost:
        t.add_row("teleop device", f"[red]lost: {p.supervisor_lost}[/]")
    if p.learner_restarts:
        t.add_row("learner restarts", f"[yellow]{p.learner_restarts}[/]")
    if p.worker_restarts:
        t.add_row("env worker restarts", f"[yellow]{p.worker_restarts}[/]")
    return t


class LiveProgress:
    def __init__(self, console, total_steps: int, title: str, enabled: bool = True):
        self.total, self.title = total_steps, title
        self.live = Live(console=console, refresh_per_second=2, transient=False) if enabled else None

    def __enter__(self):
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)

    def __call__(self, p: Progress) -> None:
        if self.live is not None:
            self.live.update(progress_table(p, self.total, self.title))
