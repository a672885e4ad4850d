"""The command line's refusals: a known error is one `error:` line and an exit code, a bug
still raises, and naming the errors imports nothing a command did not (the robot PC's edge
daemon starts without torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlinf_user.cli.main import _refusal, main


def test_known_errors_map_to_their_label_and_exit_code():
    from rlinf_user.calibration.board import BoardNotFound
    from rlinf_user.config.compose import ConfigError
    from rlinf_user.edge.daemon import EdgeStartError

    assert _refusal(ConfigError("x")) == ("error:", 2)
    assert _refusal(FileNotFoundError("x")) == ("error:", 2)
    assert _refusal(EdgeStartError("x")) == ("error:", 1)
    assert _refusal(BoardNotFound("x")) == ("calibration refused:", 1)
    assert _refusal(RuntimeError("a bug")) is None
    assert _refusal(KeyError("a bug")) is None


def test_a_refusal_is_one_line_and_a_bug_still_raises(monkeypatch, capsys):
    from rlinf_user.cli import doctor as doctor_cli
    from rlinf_user.config.compose import ConfigError

    def refuse(args, console):
        raise ConfigError("robot.ip is missing")

    monkeypatch.setattr(doctor_cli, "run_doctor", refuse)
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "robot.ip is missing" in err and "Traceback" not in err

    def crash(args, console):
        raise RuntimeError("a bug")

    monkeypatch.setattr(doctor_cli, "run_doctor", crash)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["doctor"])


def test_the_edge_command_starts_without_torch():
    """A refused edge start goes through the whole error path; torch stays out of the
    process (it used to be imported to name the trainer's and policies' errors)."""
    code = ("import sys; from rlinf_user.cli.main import main; rc = main(['edge']); "
            "print(rc, 'torch' in sys.modules, 'ray' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False", "False"], (out.stdout, out.stderr)
    assert "give one of --robot NAME or --sim NAME" in out.stderr
