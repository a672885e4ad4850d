"""The RL side of flow VLAs (Flow-Noise, piRL): the chain a stochastic act samples has a
log-density the learner recomputes exactly, its gradient reaches what ``policy.finetune``
says trains (and nothing else), padded action dims stay deterministic, and the value head
reads the state but not the noisy actions."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_user.config.compose import compose_config  # noqa: E402
from rlinf_user.env.spec import EnvSpec, obs_to_torch  # noqa: E402
from rlinf_user.policies.base import CAPABILITIES, build_policy  # noqa: E402

SPEC = EnvSpec(state_dim=6, cameras={"front": (32, 32)}, instruction=True, active_dims=(0, 1, 2))


def obs(b=3, seed=0):
    rng = np.random.default_rng(seed)
    return obs_to_torch({
        "state": rng.normal(size=(b, 6)).astype(np.float32),
        "images": {"front": rng.integers(0, 255, (b, 32, 32, 3), dtype=np.uint8)},
        "instruction": np.array(["reach the red target", "reach the blue target", "go"][:b]),
    })  # fmt: skip


def policy(*extra):
    torch.manual_seed(0)
    return build_policy(compose_config(["policy=pi0", *extra]).policy, SPEC)


def test_the_learner_recomputes_the_rollout_log_prob_of_a_chain():
    p = policy()
    assert all(isinstance(p, CAPABILITIES[c]) for c in ("log-prob of recorded samples", "a value function", "behaviour cloning"))
    o = obs()
    out = p.act(o)
    logp, ent = p.log_prob(o, out.extras["sample"])
    torch.testing.assert_close(logp, out.extras["log_prob"], rtol=1e-4, atol=1e-4)
    assert logp.shape == ent.shape == (3, 4 * 3) and torch.isfinite(logp).all()
    # PPO's one-prefix call scores and values exactly as the two separate calls do
    both = p.log_prob_and_value(o, out.extras["sample"])
    for got, want in zip(both, (logp, ent, p.value(o))):
        torch.testing.assert_close(got, want)
    # the step noise of every executed element lies within the configured std bounds
    lo, hi = 0.5 * np.log(2 * np.pi * np.e * 0.08**2), 0.5 * np.log(2 * np.pi * np.e * 0.16**2)
    assert ent.min() >= lo - 1e-4 and ent.max() <= hi + 1e-4
    # another chain scores differently; padded dims (3..31) take Euler steps without noise
    other = p.act(o).extras["sample"]
    assert not torch.allclose(p.log_prob(o, other)[0], logp)
    chain = out.extras["sample"].transpose(0, 1)  # (K + 1, B, H, A)
    k = chain.shape[0] - 1
    with torch.no_grad():
        cache, pad, state = p.prefix(o)
        for i in range(k):
            t = torch.full((3,), 1.0 - i / k)
            euler = chain[i] + (-1.0 / k) * p.model.velocity(cache, pad, state, chain[i], t)
            torch.testing.assert_close(chain[i + 1][..., 3:], euler[..., 3:], rtol=1e-4, atol=1e-4)  # padded: no noise
            assert (chain[i + 1][..., :3] - euler[..., :3]).abs().max() > 1e-3  # executed dims: noise


@pytest.mark.parametrize("finetune", ["expert", "lora", "full"])
def test_gradients_reach_only_what_finetune_trains(finetune):
    p = policy(f"policy.finetune={finetune}")
    o = obs()
    sample = p.act(o).extras["sample"]
    logp, _ = p.log_prob(o, sample)
    (logp.mean() + p.value(o).mean() + p.bc_loss(o, torch.zeros(3, 4, 3))).backward()
    grads = {n for n, q in p.named_parameters() if q.grad is not None and q.grad.abs().sum() > 0}
    vlm = {n for n in grads if ".paligemma." in n and "lora_" not in n}
    assert any(n.startswith("noise_head.") for n in grads) and any(n.startswith("value_head.") for n in grads)
    assert any("gemma_expert" in n for n in grads) and "model.action_out_proj.weight" in grads
    if finetune == "full":
        assert any("vision_tower" in n for n in vlm) and any("language_model.layers" in n for n in vlm)
    else:
        assert not vlm, sorted(vlm)[:5]
        assert not any(q.requires_grad for n, q in p.named_parameters() if ".paligemma." in n and "lora_" not in n)
    assert any("lora_" in n for n in grads) == (finetune == "lora")


def test_the_value_sees_the_state_and_the_critic_input_is_detached():
    p = policy()
    o = obs()
    v = p.value(o)
    o2 = dict(o, state=o["state"] + 1.0)
    assert not torch.allclose(v, p.value(o2))
    p.value(o).sum().backward()
    assert all(q.grad is None for n, q in p.named_parameters() if "gemma_expert" in n)  # detached by default


def test_chunk_labels_with_a_mask_supervise_only_the_valid_steps():
    p = policy()
    o = obs()
    target = torch.zeros(3, 4, 3)
    valid = torch.tensor([[1, 1, 0, 0]] * 3, dtype=torch.bool)
    torch.manual_seed(1)
    a = p.bc_loss(o, target, valid)
    torch.manual_seed(1)
    far = target.clone()
    far[:, 2:] = 0.9  # labels on masked steps change nothing
    torch.testing.assert_close(p.bc_loss(o, far, valid), a)


def test_ppo_moves_a_flow_vla_toward_chunks_with_higher_advantage():
    """PPO through the Flow-Noise log-prob on a one-step bandit: rewarded chunks are the
    ones near a target; after a few updates the deterministic chunk is closer to it."""
    from rlinf_user.algorithms.base import build_algorithm
    from rlinf_user.env.spec import Col

    torch.manual_seed(0)
    spec = EnvSpec(state_dim=3, active_dims=(0, 1, 2))
    cfg = compose_config(["algo=ppo", "policy=pi0", "algo.lr=3e-4", "algo.norm_obs=false", "algo.num_minibatches=2",
                          "algo.target_kl=null"], sim="reach")  # fmt: skip
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    p, target = algo.policy, torch.tensor([0.5, -0.5, 0.3])
    obs = {"state": torch.zeros(64, 3), "images": {}}

    def error() -> float:
        return float(((p.act({"state": torch.zeros(1, 3), "images": {}}, deterministic=True).actions[0] - target) ** 2).sum(-1).mean())

    before = error()
    for _ in range(15):
        out = p.act(obs)
        r = -((out.actions - target) ** 2).sum(-1).mean(-1)
        batch = {"obs/state": obs["state"].numpy(), Col.SAMPLE: out.extras["sample"].numpy(),
                 Col.LOG_PROB: out.extras["log_prob"].numpy(), Col.VALUE: out.extras["value"].numpy(),
                 "advantage": ((r - r.mean()) / r.std()).numpy(), "return": r.numpy()}  # fmt: skip
        metrics = algo.update(batch)
    assert metrics["clipfrac"] > 0 and np.isfinite(metrics["policy_loss"])
    assert error() < 0.6 * before, (before, error())


def test_action_level_credit_gives_each_action_its_own_advantage():
    """algo.credit=action: the PPO gradient reaching an action's log-prob elements comes
    from that action's advantage alone, and none reaches an action that never ran; the
    value head has a value per action."""
    from rlinf_user.algorithms.base import build_algorithm
    from rlinf_user.env.spec import Col

    torch.manual_seed(0)
    spec = EnvSpec(state_dim=3, active_dims=(0, 1, 2))
    cfg = compose_config(["algo=ppo", "policy=pi0", "policy.horizon=2", "algo.credit=action", "algo.norm_obs=false",
                          "algo.norm_adv=false", "algo.num_minibatches=1", "algo.update_epochs=1"], sim="reach")  # fmt: skip
    assert cfg.policy.value_per_action
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    p = algo.policy
    obs = {"state": torch.randn(4, 3), "images": {}}
    out = p.act(obs)
    assert out.extras["value"].shape == (4, 2) and out.extras["log_prob"].shape == (4, 2 * 3)
    grads, order = [], []
    score = p.log_prob_and_value

    def watched(o, sample):
        logp, ent, v = score(o, sample)
        logp.register_hook(grads.append)
        # the minibatch's rows are shuffled: which batch row each one is
        order.append([int((sample[i] == out.extras["sample"]).flatten(1).all(1).nonzero()) for i in range(len(sample))])
        return logp, ent, v

    p.log_prob_and_value = watched
    # rows 0-1: only the first action has an advantage; rows 2-3: both do, but in row 3
    # the chunk was cut after its first action (the episode ended)
    adv = np.array([[1.0, 0.0], [-1.0, 0.0], [0.5, 2.0], [0.5, 2.0]], np.float32)
    batch = {"obs/state": obs["state"].numpy(), Col.SAMPLE: out.extras["sample"].numpy(),
             Col.LOG_PROB: out.extras["log_prob"].numpy(), Col.VALUE: out.extras["value"].numpy(),
             Col.CHUNK_STEPS: np.array([2, 2, 2, 1]), "advantage": adv, "return": np.zeros((4, 2), np.float32)}  # fmt: skip
    algo.update(batch)
    g = torch.zeros(4, 2, 3)
    g[order[0]] = grads[0].reshape(4, 2, 3)  # (rows, action, dim) in batch order
    assert (g[:2, 1] == 0).all() and (g[:2, 0] != 0).all()  # no advantage, no gradient
    assert (g[3, 1] == 0).all() and (g[2, 1] != 0).all()  # an action that never ran: none
    # at ratio 1 the gradient of -A * ratio on an element is -A / (number of weighted elements)
    weighted = 3 * (2 + 2 + 2 + 1)
    torch.testing.assert_close(g[0, 0], torch.full((3,), -1.0 / weighted))
    torch.testing.assert_close(g[2, 1], torch.full((3,), -2.0 / weighted))


def test_critic_warm_up_trains_the_value_head_alone_then_the_policy():
    from rlinf_user.algorithms.base import build_algorithm
    from rlinf_user.env.spec import Col

    torch.manual_seed(0)
    spec = EnvSpec(state_dim=3, active_dims=(0, 1, 2))
    cfg = compose_config(["algo=ppo", "policy=pi0", "algo.critic_warmup_updates=1", "algo.value_lr=1e-2",
                          "algo.norm_obs=false", "algo.num_minibatches=1", "algo.update_epochs=1"], sim="reach")  # fmt: skip
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    p = algo.policy
    obs = {"state": torch.randn(16, 3), "images": {}}
    out = p.act(obs)
    batch = {"obs/state": obs["state"].numpy(), Col.SAMPLE: out.extras["sample"].numpy(),
             Col.LOG_PROB: out.extras["log_prob"].numpy(), Col.VALUE: out.extras["value"].numpy(),
             "advantage": np.linspace(-1, 1, 16, dtype=np.float32), "return": np.ones(16, np.float32)}  # fmt: skip

    def snapshot():
        return {k: v.clone() for k, v in p.state_dict().items()}

    before = snapshot()
    assert algo.update(batch)["critic_warmup"] == 1.0
    after = snapshot()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("value_head.") for k in changed), sorted(changed)[:5]
    assert algo.update(batch)["critic_warmup"] == 0.0
    assert any(not torch.equal(after[k], v) for k, v in snapshot().items() if k.startswith("model."))
