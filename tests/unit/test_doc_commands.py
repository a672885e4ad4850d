"""Every ``rlinf-user ...`` command in the README and in docs/ still parses, and the ones
that build a configuration compose and validate it (what ``--dry-run`` does, without
starting anything), so no command a user copies from the docs has gone stale."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlinf_user.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL = ("bash", "sh", "shell")  # blocks of commands (a synopsis or YAML block is not one)
# commands that compose the run's configuration (and validate it, as they do before starting)
COMPOSED = {"train", "teleop", "hg-dagger", "plan"}
# values that name something the reader makes first (a dataset, a run, a trained classifier)
READER_MADE = ("no such file", "does not exist", "not found", "no calibration at")


def doc_commands(path: Path) -> list[tuple[int, str]]:
    """``(line, command)`` for every ``rlinf-user`` command in the file's code blocks
    (backslash continuations joined, comments dropped)."""
    out, in_block, shell, pending, start = [], False, False, "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(raw.strip())
        if fence:
            in_block, pending = not in_block, ""
            shell = in_block and fence.group(1) in SHELL
            continue
        if not shell:
            continue
        line = raw.strip()
        if pending:
            pending += " " + line
        elif line.startswith("rlinf-user "):
            pending, start = line, n
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        out.append((start, pending.strip().removesuffix("&").strip()))  # (started in the background)
        pending = ""
    return out


ALL = [(p, n, c) for p in DOCS for n, c in doc_commands(p)]


def test_the_docs_hold_commands():
    assert len(ALL) >= 30 and {p.name for p, _, _ in ALL} >= {"README.md", "real-robot.md", "results.md"}


def check(command: str) -> None:
    """Parse ``command`` as the CLI does; compose (and validate) what it would run."""
    from rlinf_user.config.compose import ConfigError, compose_config, validate

    argv = shlex.split(command, comments=True)[1:]
    args, extra = build_parser().parse_known_args(argv)
    if args.command == "calibrate":
        extra = [e for e in extra if e.startswith("-")]
    assert not extra, f"unrecognised {extra}"
    overrides = list(getattr(args, "overrides", []) or [])
    if args.command in COMPOSED and not any(o.startswith("resume=") for o in overrides):
        if args.command == "hg-dagger":
            overrides = ["algo=bc", *overrides]
        cfg = compose_config(overrides, sim=args.sim, robot=args.robot)
        try:
            validate(cfg)
        except ConfigError as err:
            if not any(s in str(err) for s in READER_MADE):
                raise
    elif args.command == "eval" and (args.sim or args.robot):  # its first override lands in `run`
        compose_config([args.run, *overrides] if args.run else overrides, sim=args.sim, robot=args.robot)
    elif args.command == "edge" and overrides[:1] != ["keygen"]:
        from rlinf_user.edge.config import compose_edge_config

        try:
            compose_edge_config(overrides, robot=args.robot, sim=args.sim)
        except ConfigError as err:
            if not any(s in str(err) for s in READER_MADE):
                raise


@pytest.mark.parametrize(("path", "line", "command"), ALL, ids=[f"{p.name}:{n}" for p, n, _ in ALL])
def test_a_documented_command_parses_and_composes(path, line, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths in the docs resolve to nothing here
    if any(a.startswith(("algo=lab_", "env.backend=lab_")) for a in shlex.split(command, comments=True)):
        pytest.skip("a plugin's names: tests/integration/test_plugins.py installs the plugin and runs this")
    try:
        check(command)
    except SystemExit as exc:
        pytest.fail(f"{path.name}:{line}: `{command}` does not parse ({exc})")


def test_a_stale_command_fails(tmp_path, monkeypatch):
    from rlinf_user.config.compose import ConfigError

    monkeypatch.chdir(tmp_path)
    for stale in ("rlinf-user train --sim reach algo.gama=0.9", "rlinf-user train --sim isaacgym",
                  "rlinf-user train --sim reach algo=ppo policy=mlp", "rlinf-user edge --robot franka robot.ipp=1"):
        with pytest.raises(ConfigError):
            check(stale)
    with pytest.raises(AssertionError, match="unrecognised"):
        check("rlinf-user eval runs/x --episodez 5")
