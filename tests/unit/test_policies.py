"""The policy registry: every policy acts on a batch and returns chunks; capabilities are
what algorithms check; PPO learns a bandit through the on-policy store; SAC-Flow's flow."""

import numpy as np
import pytest
import torch

from rlinf_user.algorithms.base import build_algorithm
from rlinf_user.algorithms.ppo.credit import OnPolicyStore
from rlinf_user.config.compose import compose_config
from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.base import POLICIES, BCTrainable, HasValue, Reparameterised, ScoresActions, build_policy

SPEC = EnvSpec(state_dim=4, active_dims=(0, 1, 2))
CAPS = {
    "mlp": {Reparameterised, BCTrainable},
    "gaussian_ac": {ScoresActions, HasValue, BCTrainable},
    "flow": {Reparameterised, BCTrainable},
}


@pytest.mark.parametrize("name", ["mlp", "gaussian_ac", "flow"])
def test_every_policy_acts_in_chunks_with_its_capabilities(name):
    torch.manual_seed(0)
    policy = build_policy(compose_config([f"policy={name}", "policy.hidden=[32,32]"]).policy, SPEC)
    obs = {"state": torch.randn(5, 4), "images": {}}
    for deterministic in (True, False):
        out = policy.act(obs, deterministic=deterministic)
        assert out.actions.shape == (5, policy.horizon, 3) and out.actions.abs().max() <= 1.0
        assert all(v.shape[0] == 5 for v in out.extras.values())
    det = [policy.act(obs, deterministic=True).actions for _ in range(2)]
    assert torch.equal(*det)  # deterministic means deterministic
    have = {c for c in (Reparameterised, ScoresActions, HasValue, BCTrainable) if isinstance(policy, c)}
    assert have == CAPS[name]
    assert set(POLICIES.names()) >= set(CAPS)


def test_flow_policy_is_reparameterised_and_clones_a_multimodal_target():
    torch.manual_seed(0)
    policy = build_policy(compose_config(["policy=flow", "policy.hidden=[64,64]"]).policy, SPEC)
    feats = policy.encoder({"state": torch.randn(64, 4), "images": {}})
    a, logp = policy.sample_features(feats)
    assert torch.isfinite(logp).all() and a.abs().max() < 1.0
    (a.sum() + logp.sum()).backward()  # SAC's actor loss reaches the velocity and noise nets
    assert policy.velocity.candidate[0].weight.grad.abs().sum() > 0 and policy.log_sigma[0].weight.grad.abs().sum() > 0
    # BC (flow matching) on a bimodal target: half the labels +0.6, half -0.6 in dim 0
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    state = torch.zeros(256, 4)
    target = torch.zeros(256, 3)
    target[:, 0] = torch.where(torch.arange(256) % 2 == 0, 0.6, -0.6)
    for _ in range(600):
        loss = policy.bc_loss({"state": state, "images": {}}, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        feats = policy.encoder({"state": torch.zeros(2000, 4), "images": {}})
        x = torch.randn(2000, 3)  # integrate the learned field from noise (no added noise)
        dt = 1.0 / policy.steps
        for k in range(policy.steps):
            x = x + dt * policy.velocity(feats, x, torch.full((2000,), k * dt))
        a0 = torch.tanh(x)[:, 0]
    near = ((a0 - 0.6).abs() < 0.2) | ((a0 + 0.6).abs() < 0.2)
    assert near.float().mean() > 0.8 and (a0 > 0).float().mean() > 0.25 and (a0 < 0).float().mean() > 0.25  # both modes


def test_ppo_learns_a_bandit_through_the_on_policy_store():
    """One-step episodes, reward -(a - 0.5)^2 per dim: the mean action moves to 0.5."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    cfg = compose_config(["algo=ppo", "policy=gaussian_ac", "policy.hidden=[32,32]", "algo.lr=3e-3",
                          "algo.num_minibatches=4", "algo.target_kl=null"])  # fmt: skip
    algo = build_algorithm(cfg.algo, cfg.policy, SPEC)
    store = OnPolicyStore(cfg.algo.gamma, cfg.algo.gae_lambda)
    step = 0
    for version in range(40):
        state = rng.normal(size=(64, 4)).astype(np.float32)
        out = algo.policy.act({"state": torch.as_tensor(state), "images": {}})
        a = out.actions[:, 0].numpy()
        reward = -((a - 0.5) ** 2).sum(-1)
        store.add({
            "obs/state": state, "next_obs/state": state, Col.ACTION: a, Col.REWARD: reward.astype(np.float32),
            Col.TERMINATED: np.ones(64, np.float32), Col.TRUNCATED: np.zeros(64, np.float32),
            Col.ENV_ID: np.arange(64), Col.STEP: np.full(64, step), Col.POLICY_VERSION: np.full(64, version),
            Col.LOG_PROB: out.extras["log_prob"].numpy(), Col.VALUE: out.extras["value"].numpy(),
            Col.SAMPLE: out.extras["sample"].numpy(),
        })  # fmt: skip
        step += 1
        m = algo.update(store.take(algo.values, version))
        assert np.isfinite(m["policy_loss"])
    mean = algo.policy.act({"state": torch.zeros(1, 4), "images": {}}, deterministic=True).actions[0, 0]
    assert (mean - 0.5).abs().max() < 0.15, mean
    assert algo.num_updates == 40


def test_a_nan_loss_stops_ppo_with_the_batch_statistics():
    from rlinf_user.algorithms.base import NonFiniteLoss

    cfg = compose_config(["algo=ppo", "policy=gaussian_ac", "policy.hidden=[8]"])
    algo = build_algorithm(cfg.algo, cfg.policy, SPEC)
    n = 8
    batch = {"obs/state": np.zeros((n, 4), np.float32), Col.SAMPLE: np.zeros((n, 1, 3), np.float32),
             Col.LOG_PROB: np.full(n, np.nan, np.float32), Col.VALUE: np.zeros(n, np.float32),
             "advantage": np.ones(n, np.float32), "return": np.ones(n, np.float32)}  # fmt: skip
    before = {k: v.clone() for k, v in algo.policy.state_dict().items()}
    with pytest.raises(NonFiniteLoss, match="update 0.*log-prob"):
        algo.update(batch)
    assert all(torch.equal(before[k], v) for k, v in algo.policy.state_dict().items())  # nothing was applied


def test_running_state_statistics_match_the_whole_stream_and_travel_in_the_state_dict():
    from rlinf_user.policies.encoders import StateNormalizer

    rng = np.random.default_rng(1)
    batches = [rng.normal(loc=[0.5, -3.0], scale=[0.02, 4.0], size=(n, 2)).astype(np.float32) for n in (7, 50, 300)]
    norm = StateNormalizer(2)
    for b in batches:
        norm.update(torch.as_tensor(b))
    whole = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), whole.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(norm.std.numpy(), np.maximum(whole.std(0), 1e-2), rtol=1e-3)
    assert float(norm.count) == len(whole)
    again = StateNormalizer(2)
    state = {k: v for k, v in norm.state_dict().items() if k != "count"}  # a checkpoint from before the count
    again.load_state_dict(state)
    assert float(again.count) == 0 and torch.equal(again.mean, norm.mean)


def test_ppo_refines_the_state_statistics_after_each_update_not_during_it():
    """The rows of a round were acted with the statistics the learner trains with (the
    log-prob ratio starts at exactly 1); the update then folds the round's states in."""
    cfg = compose_config(["algo=ppo", "policy=gaussian_ac", "policy.hidden=[8]"])
    algo = build_algorithm(cfg.algo, cfg.policy, SPEC)
    n = 16
    state = np.random.default_rng(0).normal(5.0, 2.0, size=(n, 4)).astype(np.float32)
    out = algo.policy.act({"state": torch.as_tensor(state), "images": {}})
    batch = {"obs/state": state, Col.SAMPLE: out.extras["sample"].numpy(), Col.LOG_PROB: out.extras["log_prob"].numpy(),
             Col.VALUE: out.extras["value"].numpy(), "advantage": np.linspace(-1, 1, n, dtype=np.float32),
             "return": np.ones(n, np.float32)}  # fmt: skip
    m = algo.update(batch)
    assert m["start_kl"] == pytest.approx(0.0, abs=1e-6)
    norm = algo.policy.encoder.norm
    assert float(norm.count) == n and np.allclose(norm.mean.numpy(), state.mean(0), atol=1e-5)
    off = compose_config(["algo=ppo", "policy=gaussian_ac", "policy.hidden=[8]", "algo.norm_obs=false"])
    plain = build_algorithm(off.algo, off.policy, SPEC)
    plain.update(batch)
    assert float(plain.policy.encoder.norm.count) == 0


def test_on_an_env_with_instructions_the_encoder_reads_them():
    """A policy that does not read language itself (mlp, cnn) gets the instruction in its
    features: the same state under two instructions encodes differently, the same
    instruction the same, copies (SAC's critic encoder) agree, and a batch without the
    instruction is refused. A critic trained on it separates two goals named in words."""
    import copy

    spec = EnvSpec(state_dim=3, cameras={}, instruction=True)
    policy = build_policy(compose_config(["policy=mlp", "policy.hidden=[32,32]"], sim="reach").policy, spec)
    state = torch.zeros(4, 3)
    texts = ["reach the red target", "reach the blue target", "reach the red target", "Reach  the RED target"]
    feats = policy.encoder({Col.STATE: state, Col.IMAGES: {}, Col.INSTRUCTION: texts})
    assert feats.shape == (4, policy.encoder.out_dim) and policy.encoder.out_dim > 3
    assert torch.equal(feats[0], feats[2]) and torch.equal(feats[0], feats[3]) and not torch.equal(feats[0], feats[1])
    twin = copy.deepcopy(policy.encoder)
    assert torch.equal(twin({Col.STATE: state, Col.IMAGES: {}, Col.INSTRUCTION: texts}), feats)
    assert policy.encoder.norm is policy.encoder.inner.norm  # the inner encoder's parts, as before
    with pytest.raises(ValueError, match="instruction"):
        policy.encoder({Col.STATE: state, Col.IMAGES: {}})
    # a head on these features learns a value that only the words tell apart
    head = torch.nn.Linear(policy.encoder.out_dim, 1)
    opt = torch.optim.Adam([*policy.encoder.parameters(), *head.parameters()], lr=0.05)
    obs = {Col.STATE: torch.zeros(2, 3), Col.IMAGES: {}, Col.INSTRUCTION: texts[:2]}
    target = torch.tensor([[1.0], [-1.0]])
    for _ in range(100):
        loss = torch.nn.functional.mse_loss(head(policy.encoder(obs)), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 1e-3
