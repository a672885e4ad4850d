"""``rlinf-user doctor``."""

from __future__ import annotations

from rich.table import Table

STYLE = {"ok": "green", "missing": "yellow", "warn": "yellow", "error": "bold red"}


def run_doctor(args, console) -> int:
    from rlinf_user.doctor import run_checks

    checks = run_checks(args.robot)
    table = Table(title="rlinf-user doctor")
    table.add_column("component")
    table.add_column("status")
    table.add_column("found")
    table.add_column("fix")
    for c in checks:
        table.add_row(c.name, f"[{STYLE[c.status]}]{c.status}[/]", c.detail, c.fix)
    console.print(table)
    return 1 if any(c.status == "error" for c in checks) else 0
