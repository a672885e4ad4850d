"""``rlinf-user doctor [--robot franka KEY=VALUE ...]``: environment and robot PC checks."""

from __future__ import annotations

from rich.table import Table

STYLE = {"ok": "green", "missing": "yellow", "warn": "yellow", "error": "bold red", "fail": "bold red"}


def _table(title: str, checks, first: str) -> Table:
    table = Table(title=title)
    table.add_column(first)
    table.add_column("status")
    table.add_column("found")
    table.add_column("fix")
    for c in checks:
        table.add_row(c.name, f"[{STYLE.get(c.status, 'white')}]{c.status}[/]", c.detail, c.fix)
    return table


def run_doctor(args, console) -> int:
    from rlinf_user.doctor import has_failures, run_checks
    from rlinf_user.doctor_robot import run_robot_checks

    overrides = list(getattr(args, "overrides", None) or [])
    if overrides and not args.robot:
        console.print("[bold red]error:[/] KEY=VALUE overrides apply to the robot checks: "
                      "rlinf-user doctor --robot franka robot.ip=...")  # fmt: skip
        return 2
    checks = run_checks()
    console.print(_table("rlinf-user doctor", checks, "component"))
    if args.robot:
        robot_checks = run_robot_checks(args.robot, overrides)
        console.print(_table(f"robot PC: {args.robot}", robot_checks, "check"))
        checks = checks + robot_checks
    failed = has_failures(checks)
    if failed:
        console.print("[bold red]doctor: some checks failed[/] (see the fix column)")
    return 1 if failed else 0
