"""robosuite contract checks, run in robosuite's own virtualenv.

robosuite pins numpy<2, so it is installed into ``.venv-robosuite`` by
``bash scripts/install_robosuite_env.sh``. This test runs ``robosuite_checks.py`` there in
a subprocess (``.venv-robosuite/bin/python -m pytest``), or with the current interpreter
when robosuite is importable here; otherwise it is skipped.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from side_envs import wait_for_side_envs

REPO = Path(__file__).resolve().parents[2]
CHECKS = Path(__file__).with_name("robosuite_checks.py")
VENV_PYTHON = REPO / ".venv-robosuite" / "bin" / "python"


def _python() -> str | None:
    if VENV_PYTHON.exists():
        return str(VENV_PYTHON)
    if importlib.util.find_spec("robosuite") is not None:
        return sys.executable
    return None


@pytest.mark.side_env
def test_robosuite_contract() -> None:
    wait_for_side_envs()
    python = _python()
    if python is None:
        pytest.skip(
            "robosuite is not installed: .venv-robosuite does not exist "
            "(create it with `bash scripts/install_robosuite_env.sh`)"
        )
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", str(CHECKS)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    report = out.stdout[-6000:] + out.stderr[-3000:]
    assert out.returncode == 0, f"robosuite checks failed in {python}:\n{report}"
    summary = out.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary), report
    assert "skipped" not in summary or "1 skipped" in summary, report  # RoboCasa test only
