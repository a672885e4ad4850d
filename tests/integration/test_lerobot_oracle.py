"""A dataset written by rlinf-user, loaded by LeRobot's own ``LeRobotDataset``.

LeRobot runs in a separate interpreter with its isolated package folder first on the
path (``scripts/install_lerobot_env.sh``, run by ``make test``); frames it returns are
compared with what was recorded.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from side_envs import wait_for_side_envs

from rlinf_user.data import lerobot_format as fmt
from rlinf_user.data.lerobot_reader import LeRobotReader
from rlinf_user.data.lerobot_writer import LeRobotWriter

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / ".lerobot-pkgs"
ORACLE = ROOT / "tests" / "oracles" / "lerobot_load.py"

pytestmark = pytest.mark.side_env


@pytest.fixture(autouse=True)
def _lerobot_installed():
    wait_for_side_envs()
    if not (PKGS / "lerobot").is_dir():
        pytest.skip("LeRobot oracle not installed (bash scripts/install_lerobot_env.sh)")


def load_with_lerobot(root: Path, tmp_path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    out = tmp_path / "lerobot.npz"
    env = {
        **os.environ,
        "PYTHONPATH": str(PKGS),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    proc = subprocess.run(
        [sys.executable, str(ORACLE), str(root), str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    with np.load(out) as d:
        return summary, {k: d[k] for k in d.files}


def test_lerobot_loads_what_rlinf_user_writes(tmp_path):
    root = tmp_path / "demos"
    feats = fmt.contract_features(5, {"front": (64, 80), "wrist": (32, 32)}, fps=15)
    w = LeRobotWriter(root, 15, feats, robot_type="franka")
    rng = np.random.default_rng(0)
    images = {"front": [], "wrist": []}
    states, actions, interventions = [], [], []
    for ep, n in enumerate((8, 11, 6)):
        for t in range(n):
            blocks = rng.integers(0, 256, (8, 10, 3), dtype=np.uint8)  # random 8x8-pixel colour blocks
            front = np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)
            front[:, :16] = 30 * ep
            wrist = np.full((32, 32, 3), 8 * t, np.uint8)
            s, a = rng.normal(size=5).astype(np.float32), rng.uniform(-1, 1, 7).astype(np.float32)
            iv = bool(t % 3 == 0)
            w.add_frame(
                {
                    "observation.state": s,
                    "action": a,
                    "next.reward": float(t == n - 1),
                    "next.done": t == n - 1,
                    "next.truncated": False,
                    "next.success": t == n - 1,
                    "intervention": iv,
                    "policy_version": 7,
                },
                {"front": front, "wrist": wrist},
            )
            images["front"].append(front)
            images["wrist"].append(wrist)
            states.append(s)
            actions.append(a)
            interventions.append(iv)
        w.save_episode("pick up the cube" if ep != 1 else "push the cube")
    w.close()

    summary, got = load_with_lerobot(root, tmp_path)
    assert summary["num_episodes"] == 3 and summary["num_frames"] == 25 and summary["fps"] == 15
    assert summary["camera_keys"] == ["observation.images.front", "observation.images.wrist"]
    assert {"intervention", "policy_version", "next.reward"} <= set(summary["features"])
    np.testing.assert_array_equal(got["observation.state"], np.stack(states))
    np.testing.assert_array_equal(got["action"], np.stack(actions))
    assert got["intervention"].astype(bool).tolist() == interventions
    assert set(got["policy_version"].tolist()) == {7}
    assert got["episode_index"].tolist() == [0] * 8 + [1] * 11 + [2] * 6
    assert got["task"].tolist() == ["pick up the cube"] * 8 + ["push the cube"] * 11 + ["pick up the cube"] * 6

    reader = LeRobotReader(root)
    for cam in ("front", "wrist"):
        # LeRobot returns float CHW in [0, 1]
        lerobot_frames = np.round(got[f"observation.images.{cam}"].transpose(0, 2, 3, 1) * 255).astype(np.uint8)
        ours = np.concatenate([reader.episode(i).images[cam] for i in range(3)])
        np.testing.assert_array_equal(lerobot_frames, ours)  # same frames, same decoder: bit-exact
        err = np.abs(lerobot_frames.astype(int) - np.stack(images[cam]).astype(int))
        assert err.mean() < 6.0, f"{cam}: mean abs error {err.mean():.2f} against the recorded frames"
