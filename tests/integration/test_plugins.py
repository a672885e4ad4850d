"""A lab's package adds an algorithm and an env backend through entry points: installed
with pip beside rlinf-user (``tests/plugins/lab_plugin``), found by name, trained with."""

import json
import os
import subprocess
import sys
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "lab_plugin"
CLI = [sys.executable, "-m", "rlinf_user.cli.main"]


def test_an_installed_plugin_algorithm_and_env_backend_train(tmp_path):
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(PLUGIN)]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": path}
    r = subprocess.run(
        [*CLI, "train", "--sim", "reach", "algo=lab_sac", "env.backend=lab_reach", "total_env_steps=400",
         "algo.learning_starts=100", "algo.batch_size=32", "policy.hidden=[32,32]", "eval_every_steps=400",
         "eval_episodes=2", f"run_root={tmp_path}", "run_name=plugin", "progress=false"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "plugin"
    cfg = (run_dir / "config.yaml").read_text()
    assert "name: lab_sac" in cfg and "num_critics: 3" in cfg and "backend: lab_reach" in cfg
    assert "gamma: 0.9" in cfg  # the sim's algo_tuning for the SAC family reached the plugin's config
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["algo"] == "lab_sac" and summary["updates"] > 0
    # without the package installed the name is unknown, and the message lists what is
    r = subprocess.run([*CLI, "train", "--sim", "reach", "algo=lab_sac", "--dry-run"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled"})  # fmt: skip
    assert r.returncode != 0 and "lab_sac" in r.stderr and "rlpd" in r.stderr
