"""The same weights, inputs and noise give the same pi0 actions in LeRobot's own
implementation and in rlinf-user's: LeRobot builds and samples a tiny pi0 and saves it in
its checkpoint layout, rlinf-user loads that folder and samples again.

LeRobot's pi0 needs openpi's patched transformers 4.53.2, which is not on PyPI (a git
branch), so this oracle runs only where one is installed in a folder of its own:
``RLINF_USER_PI0_TRANSFORMERS=<folder>`` (``pip install --no-deps --target <folder>
"transformers @ git+https://github.com/huggingface/transformers.git@fix/lerobot_openpi"
tokenizers==0.21.4``). Elsewhere it is skipped.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / ".lerobot-pkgs"
FORK = os.environ.get("RLINF_USER_PI0_TRANSFORMERS")

pytestmark = pytest.mark.skipif(
    not FORK or not (PKGS / "lerobot" / "policies" / "pi0").is_dir(),
    reason="LeRobot's pi0 oracle needs RLINF_USER_PI0_TRANSFORMERS (openpi's patched transformers) and .lerobot-pkgs",
)


def test_lerobot_pi0_and_rlinf_user_pi0_sample_the_same_chunk(tmp_path, monkeypatch):
    from rlinf_user.policies import pi0_model as pm
    from rlinf_user.policies.pi0_checkpoint import detect_layout, load_weights

    env = {
        **os.environ,
        "PYTHONPATH": f"{FORK}{os.pathsep}{PKGS}",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "oracles" / "lerobot_pi0.py"), str(tmp_path / "ck")],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(json.loads(proc.stdout.strip().splitlines()[-1]))
    folder = tmp_path / "ck"
    assert detect_layout(folder) == "lerobot"
    monkeypatch.setitem(pm.GEMMA_SIZES, "oracle_vlm", pm.GemmaSize(64, 2, 128, 8, 1, 16))
    monkeypatch.setitem(pm.GEMMA_SIZES, "oracle_expert", pm.GemmaSize(32, 2, 128, 8, 1, 16))
    cfg = pm.Pi0Config(vlm="oracle_vlm", expert="oracle_expert", vision="tiny", vocab_size=257152, action_dim=8,
                       state_dim=8, horizon=4, num_steps=3, num_cameras=1)  # fmt: skip
    model = pm.Pi0Model(cfg).eval()
    load_weights(model, folder)
    d = torch.load(folder / "io.pt")
    with torch.no_grad():
        ours, _ = model.sample_actions(
            d["images"], d["masks"], d["tokens"], d["token_mask"], d["state"], noise=d["noise"]
        )
    torch.testing.assert_close(ours, d["actions"], rtol=1e-5, atol=1e-5)
