"""``algo=dsrl`` end to end: a flow policy cloned on 10 scripted reach demonstrations is
frozen, and SAC in its noise space (through the whole runtime: env worker, replay with the
noise column, learner, weight store) lifts its success on held-out goals; the base's weights
are never in a checkpoint or a replay row's action."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlinf_user.cli.main import main
from rlinf_user.config.compose import compose_config
from rlinf_user.env.registry import make_env

# seed 0, measured: the clone 24-32% (validation) / 28-40% (test); DSRL 84% at 3,000 env
# steps, 92% at 4,500, the kept policy 96% on 50 test goals (about 30 s of training). The run
# is paced but not bit-reproducible (which policy version acts depends on when its weights
# arrive): on a machine 2.5x slower one run peaked at 88% on validation over 9,000 env steps,
# its kept policy at 96% on the test goals. So the run stops at 85% on validation, and the
# claim is on the kept policy's held-out test goals: at least 80%, and 30 points above the clone.
TARGET = 0.85
TEST_TARGET = 0.8


@pytest.mark.slow
def test_dsrl_steers_a_cloned_flow_policy_past_its_clone(tmp_path):
    demos = tmp_path / "demos"
    assert main(["teleop", "--sim", "reach", "teleop=synthetic", f"dataset.root={demos}", "dataset.episodes=10",
                 "seed=0"]) == 0  # fmt: skip
    assert main(["train", "--sim", "reach", "algo=bc", "policy=flow", "policy.hidden=[64,64]", f"demos={demos}",
                 "total_env_steps=1500", "eval_every_steps=100000", "eval_episodes=50", "seed=0",
                 f"run_root={tmp_path}", "run_name=clone", "progress=false"]) == 0  # fmt: skip
    clone = json.loads((tmp_path / "clone" / "eval" / "summary.json").read_text())
    assert main(["train", "--sim", "reach", "algo=dsrl", "policy=flow", "policy.hidden=[64,64]",
                 f"algo.base_checkpoint={tmp_path / 'clone'}", "algo.noise_hidden=[64,64]", "algo.paced=true",
                 "total_env_steps=9000", "eval_every_steps=1500", "eval_episodes=50", f"target_success={TARGET}",
                 "seed=0", f"run_root={tmp_path}", "run_name=dsrl", "progress=false"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "dsrl" / "eval" / "summary.json").read_text())
    print("clone:", clone["final_eval_success"], "dsrl:", summary["best_eval_success"], summary["test_eval"])
    assert clone["final_eval_success"] <= 0.6, clone  # a policy that half works, not one that already does
    assert summary["best_eval_success"] >= TARGET, summary
    assert summary["test_eval"]["success_rate"] >= max(TEST_TARGET, clone["test_eval"]["success_rate"] + 0.3), (
        clone, summary)  # fmt: skip
    # the frozen base is in no checkpoint; every replay row carries the noise it acted from
    ckpts = tmp_path / "dsrl" / "checkpoints"
    state = torch.load(ckpts / (ckpts / "latest").read_text().strip(), weights_only=True)
    assert state["agent"]["model"] and not [k for k in state["agent"]["model"] if ".base." in k]
    from rlinf_user.data.record_log import RecordLog

    chunks = list(RecordLog(tmp_path / "dsrl" / "buffer").read_all())
    noise = np.concatenate([c["noise"] for c in chunks])
    assert noise.shape[1] == 3 and np.abs(noise).max() <= 1.0 and len(noise) >= summary["env_steps"] - 100


def tiny_pi0_base(run):
    """A tiny pi0 for reach acting in chunks of 4 (untrained), saved as ``run``'s best.pt."""
    pytest.importorskip("transformers")
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.policies.base import build_policy

    cfg = compose_config(["policy=pi0", "policy.horizon=4"], sim="reach")
    env = make_env(cfg.env, seed=0)
    spec = EnvSpec.of_env(env)
    env.close()
    torch.manual_seed(0)
    base = build_policy(cfg.policy, spec)
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"policy": base.state_dict(), "spec": spec.to_dict()}, run / "checkpoints" / "best.pt")
    return base


@pytest.mark.timeout(300)
def test_a_paced_chunk_policy_reaches_its_first_batch(tmp_path):
    """A chunk is one row, so a batch of 128 rows of chunks of 4 takes 512 env steps: pacing
    lets the workers collect it (it held them at about 150 env steps, waiting for updates
    that could not start, and the run crawled at under one env step a second)."""
    tiny_pi0_base(tmp_path / "base")
    assert main(["train", "--sim", "reach", "algo=dsrl", "policy=pi0", "policy.horizon=4",
                 f"algo.base_checkpoint={tmp_path / 'base'}", "algo.noise_hidden=[32,32]", "algo.batch_size=128",
                 "algo.paced=true", "total_env_steps=1200", "eval_every_steps=100000", "eval_at_start=false",
                 "eval_episodes=5", f"run_root={tmp_path}", "run_name=paced", "progress=false"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "paced" / "eval" / "summary.json").read_text())
    assert summary["env_steps"] >= 1200 and summary["updates"] >= 100, summary


@pytest.mark.timeout(300)
def test_the_base_embedding_reaches_a_replay_actor_and_updates(tmp_path):
    """``algo.noise_encoder.encoder=base`` with the replay in its own actor
    (``placement=disaggregated``): the acting policy sends ``obs/embedding`` with each row,
    the replay actor builds the base and adds ``next_obs/embedding``, nothing is rejected
    and the learner updates on them."""
    from rlinf_user.data.record_log import RecordLog

    base = tiny_pi0_base(tmp_path / "base")
    assert main(["train", "--sim", "reach", "algo=dsrl", "policy=pi0", "policy.horizon=4",
                 f"algo.base_checkpoint={tmp_path / 'base'}", "algo.noise_hidden=[32,32]", "algo.batch_size=32",
                 "algo.noise_encoder.encoder=base", "placement=disaggregated", "algo.paced=true",
                 "total_env_steps=600", "eval_every_steps=100000", "eval_at_start=false", "eval_episodes=2",
                 f"run_root={tmp_path}", "run_name=embedded", "progress=false"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "embedded" / "eval" / "summary.json").read_text())
    assert summary["updates"] >= 50 and summary["replay"]["rejected"] == 0, summary
    chunks = list(RecordLog(tmp_path / "embedded" / "buffer").read_all())
    emb = np.concatenate([c["obs/embedding"] for c in chunks])
    nxt = np.concatenate([c["next_obs/embedding"] for c in chunks])
    assert emb.shape[1] == base.embedding_dim and np.isfinite(nxt).all() and np.abs(nxt).sum(1).min() > 0
