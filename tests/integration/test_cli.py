"""The command line as a user types it: real subprocesses, real run directories."""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "rlinf_user.cli.main"]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}


def run(*args, timeout=600, cwd=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)


@pytest.mark.parametrize("sub", [[], ["train"], ["eval"], ["doctor"], ["teleop"], ["hg-dagger"], ["edge"]])
def test_help_everywhere(sub):
    r = run(*sub, "--help")
    assert r.returncode == 0 and "usage: rlinf-user" in r.stdout


def test_dry_run_prints_resolved_config():
    r = run("train", "--sim", "maniskill", "--dry-run", "env.task=PushCube-v1", "seed=3", "algo=crossq")
    assert r.returncode == 0, r.stderr
    assert "task: PushCube-v1" in r.stdout and "seed: 3" in r.stdout and "name: crossq" in r.stdout


def test_missing_robot_host_fails_before_starting(tmp_path):
    r = run("train", "--robot", "franka", f"run_root={tmp_path}")
    assert r.returncode == 2
    assert "env.edge.host" in r.stderr
    assert not any(tmp_path.iterdir())  # nothing was started or written


def test_hg_dagger_without_its_device_says_so_and_creates_nothing(tmp_path):
    r = run("hg-dagger", "--sim", "gym_hil", f"demos={tmp_path / 'demos'}", "teleop=keyboard",
            f"teleop.path={tmp_path / 'event99'}", f"run_root={tmp_path / 'runs'}")  # fmt: skip
    assert r.returncode == 1
    assert "event99" in r.stderr and "input" in r.stderr  # which device, and the usual cause
    assert not (tmp_path / "runs").exists()


def test_unknown_simulator_and_bad_key():
    r = run("train", "--sim", "isaacgym")
    assert r.returncode == 2 and "unknown simulator" in r.stderr
    r = run("train", "--sim", "maniskill", "algo.gama=0.9", "--dry-run")
    assert r.returncode == 2 and "algo.gama" in r.stderr


def test_doctor_reports_components():
    r = run("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("torch", "ray", "mani_skill", "vulkan", "gym_hil", "franky"):
        assert name in r.stderr


def test_train_then_eval_writes_results_and_video(tmp_path):
    pytest.importorskip("mani_skill")
    r = run(
        "train", "--sim", "maniskill", "env.task=PushCube-v1", "total_env_steps=600",
        "algo.learning_starts=200", "algo.batch_size=64", "policy.hidden=[32,32]",
        "eval_every_steps=300", "eval_episodes=2", "checkpoint_every_steps=300",
        f"run_root={tmp_path}", "run_name=cli", "progress=false",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "cli"
    for p in ("config.yaml", "train.log", "checkpoints/latest", "eval/summary.json", "eval/history.csv"):
        assert (run_dir / p).exists(), p
    # every evaluation says how far to trust it: interval and distinct held-out states
    final = json.loads((run_dir / "eval" / "summary.json").read_text())["final_eval"]
    assert final["episodes"] == 2 and final["distinct_initial_states"] == 2 and not final["deterministic_reset"]
    assert final["success_ci95"][0] <= final["success_rate"] <= final["success_ci95"][1]
    with open(run_dir / "eval" / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["distinct_states"] == "2" and r["episodes"] == "2" for r in rows)
    assert re.search(r"final eval, validation seeds .*\d+% \(\d+%-\d+%\) over 2 distinct", r.stderr), r.stderr[-2000:]
    # the kept policy is reported on the test seeds, which no evaluation during training used
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    test = summary["test_eval"]
    assert test["split"] == "test" and test["episodes"] == 2 and final["split"] == "validation"
    assert re.search(r"kept policy on the test seeds.*over 2 distinct", r.stderr, re.S), r.stderr[-2000:]
    r = run("eval", str(run_dir), "--episodes", "2", "--video-episodes", "1", "--checkpoint", "latest")
    assert r.returncode == 0, r.stderr[-3000:]
    results = list((run_dir / "eval").glob("eval-ckpt-*.json"))
    assert len(results) == 1
    data = json.loads(results[0].read_text())
    assert data["episodes"] == 2 and 0.0 <= data["success_rate"] <= 1.0
    video = Path(data["video"])
    assert video.exists() and video.stat().st_size > 1000
    # given a run, eval takes the policy of its best evaluation (best.pt) when there is one
    import torch

    latest = torch.load(run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text(), weights_only=True)
    policy = {k[len("policy."):]: v for k, v in latest["agent"]["model"].items() if k.startswith("policy.")}
    torch.save({"policy": policy, "version": 12345, "env_steps": 300, "spec": latest["spec"], "eval_success": 0.5,
                "eval_episodes": 2}, run_dir / "checkpoints" / "best.pt")  # fmt: skip
    r = run("eval", str(run_dir), "--episodes", "1", "--video-episodes", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((run_dir / "eval" / "eval-best.json").read_text())["policy_version"] == 12345
    # the same run directory cannot be started twice by accident
    r = run("train", "--sim", "maniskill", f"run_root={tmp_path}", "run_name=cli", "progress=false")
    assert r.returncode == 2 and "resume=" in r.stderr


def test_eval_a_vla_folder_without_a_run(tmp_path):
    """``rlinf-user eval --sim reach policy=pi0 policy.checkpoint=<folder>``: a pretrained
    policy (here a tiny pi0 written in openpi's layout) evaluated in chunks of H actions."""
    pytest.importorskip("transformers")
    import numpy as np
    import torch

    from rlinf_user.policies.pi0_checkpoint import NormStats, save_openpi
    from rlinf_user.policies.pi0_model import Pi0Config, Pi0Model

    torch.manual_seed(0)
    stats = {k: NormStats(np.zeros(32, np.float32), np.ones(32, np.float32)) for k in ("state", "actions")}
    folder = save_openpi(Pi0Model(Pi0Config.tiny(horizon=5)), tmp_path / "pi0_folder", stats)
    r = run("eval", "--sim", "reach", "policy=pi0", f"policy.checkpoint={folder}", "--episodes", "2",
            "--video-episodes", "0", "--out", str(tmp_path / "out"))  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert data["episodes"] == 2 and data["horizon"] == 5 and data["checkpoint"] == str(folder)
    assert all(e["length"] == 50 for e in data["per_episode"])  # a random model reaches no goal
    r = run("eval", "--sim", "reach", "policy=pi0", f"policy.checkpoint={tmp_path / 'absent'}", "--episodes", "1")
    assert r.returncode == 2 and "absent: no model.safetensors" in " ".join(r.stderr.split())
    r = run("eval", "--sim", "reach", "policy=pi0", f"policy.checkpoint={folder}", "policy.cameras=[side]", "--episodes", "1")
    assert r.returncode == 2 and "policy=pi0: " in r.stderr and "Traceback" not in r.stderr
    r = run("eval", "--episodes", "1")
    assert r.returncode == 2 and "--sim/--robot with policy=" in " ".join(r.stderr.split())


@pytest.mark.parametrize("placement,holder", [("collocated", "the learner"), ("disaggregated", "the replay buffer")])
def test_a_replay_buffer_that_cannot_fit_is_refused_before_any_worker_runs(tmp_path, placement, holder):
    """An image env at a capacity no memory holds: one error naming a capacity that fits,
    given when the buffer is built, not after a worker's first chunk is refused and the
    worker restarted until the run gives up."""
    r = run("train", "--sim", "reach_color", "buffer.capacity=1000000000", "total_env_steps=200", f"placement={placement}",
            f"run_root={tmp_path}", "run_name=big", "progress=false", timeout=300)  # fmt: skip
    assert r.returncode != 0
    err = " ".join((r.stdout + r.stderr).split())  # the console wraps long lines
    assert re.search(rf"error: {holder} could not start: .*buffer\.capacity=1,000,000,000 .*obs/images/top 64x64x3.*"
                     r"set buffer\.capacity=[\d,]+", err), err[-3000:]  # fmt: skip
    assert "restart" not in err.lower(), err[-3000:]
    assert not list((tmp_path / "big").glob("buffer/seg-*.log")) or all(
        p.stat().st_size == 0 for p in (tmp_path / "big").glob("buffer/seg-*.log"))


def test_ctrl_c_ends_a_training_run_as_any_end_does(tmp_path):
    """The first Ctrl-C (SIGINT to the CLI's process) stops the run at its next tick with the
    checkpoint, the final evaluation and the summary written, and exits 0; Ray's processes
    do not see it."""
    import signal
    import time

    proc = subprocess.Popen(
        [*CLI, "train", "--sim", "reach", "total_env_steps=1000000", "checkpoint_every_steps=200", "eval_episodes=2",
         "eval_every_steps=1000000", f"run_root={tmp_path}", "run_name=r", "progress=false"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    try:
        latest, deadline = tmp_path / "r" / "checkpoints" / "latest", time.monotonic() + 240
        while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the training loop is running once its first checkpoint is written
        assert latest.exists(), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Ctrl-C: stopping at the next tick" in err
    summary = json.loads((tmp_path / "r" / "eval" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted (Ctrl-C)" and 0 < summary["env_steps"] < 1000000
    assert summary["final_eval_success"] is not None and summary["checkpoint"]
    assert Path(summary["checkpoint"]).exists()
