"""The side environments (robosuite's virtualenv, LeRobot's oracle packages, openpi's client) that
``scripts/run_tests.sh`` installs in the background while the test lanes start.

``.side-envs/installing`` holds the installer's process id while it runs and
``.side-envs/status`` its exit status afterwards. A test that uses a side environment
waits for the installer to finish (whatever that takes: no test races it), and fails with
the install log if the install failed. Without an installer (pytest run directly), the
test proceeds at once and sees whatever is installed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".side-envs"


def _installer_running() -> bool:
    marker = STATE / "installing"
    try:
        pid = int(marker.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except OSError:  # gone without clearing its marker (killed): nothing to wait for
        return False
    return True


def wait_for_side_envs(poll_s: float = 2.0) -> None:
    while _installer_running():
        time.sleep(poll_s)
    status = STATE / "status"
    if status.exists() and status.read_text().strip() != "0":
        log = STATE / "install.log"
        tail = log.read_text()[-4000:] if log.exists() else "(no log)"
        pytest.fail(f"installing the side environments failed (status {status.read_text().strip()}):\n{tail}")
