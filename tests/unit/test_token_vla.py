"""``policy=token_vla`` (OpenVLA's action tokens on SmolLM2's real weights): the bin scheme,
the log-prob the learner recomputes equals the one sampled, padding changes nothing,
``policy.finetune`` decides what trains, BC teaches instruction-conditioned chunks and PPO
moves the tokens toward higher advantage."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_user.config.compose import compose_config  # noqa: E402
from rlinf_user.env.spec import Col, EnvSpec, obs_to_torch  # noqa: E402
from rlinf_user.policies.base import CAPABILITIES, build_policy  # noqa: E402
from rlinf_user.policies.token_vla import action_bins, bin_centres, token_ids  # noqa: E402

SPEC = EnvSpec(state_dim=6, cameras={"front": (32, 32)}, instruction=True, active_dims=(0, 1, 2))
PROMPTS = ["reach the red target", "reach the blue target", "go"]


def obs(b=3, seed=0, prompts=PROMPTS):
    rng = np.random.default_rng(seed)
    return obs_to_torch({
        "state": rng.normal(size=(b, 6)).astype(np.float32),
        "images": {"front": rng.integers(0, 255, (b, 32, 32, 3), dtype=np.uint8)},
        "instruction": np.array(prompts[:b]),
    })  # fmt: skip


def policy(*extra, spec=SPEC):
    torch.manual_seed(0)
    return build_policy(compose_config(["policy=token_vla", "policy.vlm_layers=1", *extra]).policy, spec)


def test_actions_map_to_the_last_256_ids_in_reverse_and_decode_to_bin_centres():
    a = torch.tensor([-1.0, -0.999, 0.0, 0.5, 0.999, 1.0])
    b = action_bins(a, 256)
    assert b.tolist()[0] == 0 and b.tolist()[-1] == 255 and b.tolist()[2] == 128
    assert (bin_centres(b, 256) - a).abs().max() <= 1.0 / 256 + 1e-6  # within half a bin
    assert token_ids(torch.tensor([0, 255]), 49152).tolist() == [49151, 48896]
    p = policy()
    rows = token_ids(torch.arange(256), p.vlm.config.vocab_size)
    torch.testing.assert_close(p.action_emb.detach(), p.vlm.embed_tokens.weight[rows])  # starts as the LM's rows


def test_the_learner_recomputes_the_sampled_token_log_probs_and_padding_changes_nothing():
    p = policy()
    assert all(
        isinstance(p, CAPABILITIES[c])
        for c in ("log-prob of recorded samples", "a value function", "behaviour cloning")
    )
    o = obs()
    torch.manual_seed(3)
    out = p.act(o)
    idx = out.extras["sample"]
    assert idx.shape == out.extras["log_prob"].shape == (3, 4 * 3)
    torch.testing.assert_close(out.actions, bin_centres(idx, 256).view(3, 4, 3))
    logp, ent = p.log_prob(o, idx)
    torch.testing.assert_close(logp, out.extras["log_prob"], rtol=1e-4, atol=1e-4)
    assert (ent > 0).all() and (logp <= 0).all()
    # the short prompt ("go") alone, unpadded, scores its tokens and values exactly as in the batch
    alone = {"state": o["state"][2:], "images": {"front": o["images"]["front"][2:]}, "instruction": ["go"]}
    torch.testing.assert_close(p.log_prob(alone, idx[2:])[0], logp[2:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(p.value(alone), p.value(o)[2:], rtol=1e-4, atol=1e-4)
    # the layer-by-layer pass is transformers' own Llama forward (real tokens; padding skipped)
    with torch.no_grad():
        emb, pad = p.prefix_embeddings(o)
        ours = p.run(emb, pad)[0]
        pos = (torch.cumsum(pad.long(), 1) - 1).clamp_min(0)
        ref = p.vlm(inputs_embeds=emb, attention_mask=pad.long(), position_ids=pos).last_hidden_state
    torch.testing.assert_close(ours[pad], ref[pad], rtol=1e-4, atol=1e-4)
    # greedy decoding is deterministic and a bin centre
    d1, d2 = p.act(o, deterministic=True).actions, p.act(o, deterministic=True).actions
    torch.testing.assert_close(d1, d2)


@pytest.mark.parametrize("finetune", ["heads", "lora", "full"])
def test_gradients_reach_only_what_finetune_trains(finetune):
    p = policy(f"policy.finetune={finetune}")
    o = obs()
    idx = p.act(o).extras["sample"]
    (p.log_prob(o, idx)[0].mean() + p.value(o).mean() + p.bc_loss(o, torch.zeros(3, 4, 3))).backward()
    grads = {n for n, q in p.named_parameters() if q.grad is not None and q.grad.abs().sum() > 0}
    lm = {n for n in grads if n.startswith("vlm.") and "lora_" not in n}
    assert {"action_emb", "image_proj.weight", "state_proj.weight"} <= grads and any(
        n.startswith("value_head.") for n in grads
    )
    assert not any(n.startswith("vision.") for n in grads)  # ImageNet weights stay
    assert bool(lm) == (finetune == "full"), sorted(lm)[:4]
    assert any("lora_" in n for n in grads) == (finetune == "lora")


def test_bc_teaches_instruction_conditioned_chunks():
    """Two instructions, same image and state, opposite target chunks: after BC the greedy
    tokens decode to each instruction's own chunk (to the bin)."""
    spec = EnvSpec(state_dim=2, instruction=True, active_dims=(0, 1))
    p = policy("policy.horizon=2", spec=spec)  # LoRA, the default
    o = {"state": torch.zeros(2, 2), "images": {}, "instruction": ["push left", "push right"]}
    target = torch.tensor([[[-0.6, 0.2], [-0.6, 0.4]], [[0.6, -0.2], [0.6, -0.4]]])
    opt = torch.optim.Adam([q for q in p.parameters() if q.requires_grad], lr=3e-3)
    for _ in range(60):
        opt.zero_grad()
        p.bc_loss(o, target).backward()
        opt.step()
    got = p.act(o, deterministic=True).actions
    torch.testing.assert_close(got, bin_centres(action_bins(target, 256), 256))


def test_ppo_moves_token_chunks_toward_higher_advantage():
    from rlinf_user.algorithms.base import build_algorithm

    torch.manual_seed(0)
    spec = EnvSpec(state_dim=3, active_dims=(0, 1, 2))
    cfg = compose_config(["algo=ppo", "policy=token_vla", "policy.vlm_layers=1", "policy.horizon=1", "policy.finetune=heads",
                          "algo.lr=3e-4", "algo.norm_obs=false", "algo.num_minibatches=2", "algo.target_kl=null"], sim="reach")  # fmt: skip
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    p, target = algo.policy, torch.tensor([0.5, -0.5, 0.3])
    o = {"state": torch.zeros(64, 3), "images": {}}

    def reward(actions):
        return -((actions - target) ** 2).sum(-1).mean(-1)

    before = float(reward(p.act(o).actions).mean())
    clipped = []
    for _ in range(4):
        out = p.act(o)
        r = reward(out.actions)
        batch = {"obs/state": o["state"].numpy(), Col.SAMPLE: out.extras["sample"].numpy(),
                 Col.LOG_PROB: out.extras["log_prob"].numpy(), Col.VALUE: out.extras["value"].numpy(),
                 "advantage": ((r - r.mean()) / (r.std() + 1e-6)).numpy(), "return": r.numpy()}  # fmt: skip
        metrics = algo.update(batch)
        clipped.append(metrics["clipfrac"])
    assert np.isfinite(metrics["policy_loss"]) and max(clipped) > 0
    after = float(reward(p.act(o).actions).mean())
    assert after > before + 0.5, (before, after)  # mean squared error from ~1.8 to ~0.7
