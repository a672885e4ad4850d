"""The pi0-style VLA at a tiny size: its layers agree with transformers' own Gemma, the
cached prefix equals openpi's joint two-stream pass, flow matching fits a chunk, and
checkpoints in openpi's and LeRobot's layouts load back (or are refused naming the key)."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_user.policies.pi0_checkpoint import (  # noqa: E402
    CheckpointMismatch,
    NormStats,
    load_norm_stats,
    load_pi0,
    model_key_to_file,
    save_openpi,
)
from rlinf_user.policies.pi0_model import Pi0Config, Pi0Model, _additive, _layer_step, attention_2d  # noqa: E402


def inputs(b=3, seed=0, cfg=None):
    cfg = cfg or Pi0Config.tiny()
    g = torch.Generator().manual_seed(seed)
    size = 32
    images = [torch.rand(b, 3, size, size, generator=g) * 2 - 1 for _ in range(cfg.num_cameras)]
    masks = [torch.ones(b, dtype=torch.bool), torch.tensor([True, False, True][:b])]
    tokens = torch.randint(0, cfg.vocab_size - 1, (b, cfg.max_token_len), generator=g)
    token_mask = torch.arange(cfg.max_token_len)[None].expand(b, -1) < torch.tensor([5, 8, 12][:b])[:, None]
    state = torch.randn(b, cfg.state_dim, generator=g)
    noise = torch.randn(b, cfg.horizon, cfg.action_dim, generator=g)
    return images, masks, tokens, token_mask, state, noise


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Pi0Model(Pi0Config.tiny()).eval()


def test_prefix_layers_match_transformers_gemma(model):
    images, masks, tokens, token_mask, *_ = inputs()
    emb, pad = model.embed_prefix(images, masks, tokens, token_mask)
    assert emb.shape[1] == 2 * 16 + 48 and pad.sum(1).tolist() == [16 * 2 + 5, 16 + 8, 16 * 2 + 12]
    lm = model.paligemma_with_expert.language_model
    pos = torch.cumsum(pad.long(), 1) - 1
    mask = _additive(attention_2d(pad, torch.zeros_like(pad)), emb.dtype)
    cos, sin = lm.rotary_emb(emb, pos)
    x = emb
    for layer in lm.layers:
        x, _ = _layer_step(layer, x, cos, sin, mask, None)
    ours = lm.norm(x)
    ref = lm(inputs_embeds=emb, attention_mask=mask, position_ids=pos).last_hidden_state
    torch.testing.assert_close(ours[pad], ref[pad], rtol=1e-5, atol=1e-5)


def joint_velocity(model, images, masks, tokens, token_mask, state, x_t, t):
    """openpi's formulation: both streams in one attention per layer over the whole
    sequence, with the block mask (written out here independently of the cache path)."""
    from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb, eager_attention_forward

    pw = model.paligemma_with_expert
    vlm, exp = pw.language_model, pw.gemma_expert.model
    pre, pre_pad = model.embed_prefix(images, masks, tokens, token_mask)
    suf = model.embed_suffix(state, x_t, t)
    b, lp, ls = pre.shape[0], pre.shape[1], suf.shape[1]
    pad = torch.cat([pre_pad, torch.ones(b, ls, dtype=torch.bool)], 1)
    att = torch.cat([torch.zeros(b, lp, dtype=torch.long), torch.tensor([[1, 1] + [0] * (ls - 2)]).expand(b, -1)], 1)
    cum = att.cumsum(1)
    allowed = (cum[:, None, :] <= cum[:, :, None]) & pad[:, None, :] & pad[:, :, None]
    mask = torch.where(allowed[:, None], 0.0, -2.3819763e38)
    cos, sin = vlm.rotary_emb(pre, pad.long().cumsum(1) - 1)
    xs = [pre, suf]
    for lv, le in zip(vlm.layers, exp.layers):
        qs, ks, vs, hs = [], [], [], []
        for layer, x in zip((lv, le), xs):
            h = layer.input_layernorm(x)
            a = layer.self_attn
            shape = (b, x.shape[1], -1, a.head_dim)
            qs.append(a.q_proj(h).view(shape).transpose(1, 2))
            ks.append(a.k_proj(h).view(shape).transpose(1, 2))
            vs.append(a.v_proj(h).view(shape).transpose(1, 2))
        q, k = apply_rotary_pos_emb(torch.cat(qs, 2), torch.cat(ks, 2), cos, sin)
        out, _ = eager_attention_forward(lv.self_attn, q, k, torch.cat(vs, 2), mask, scaling=lv.self_attn.scaling)
        out = out.reshape(b, lp + ls, -1)
        for layer, x, o in zip((lv, le), xs, (out[:, :lp], out[:, lp:])):
            x = x + layer.self_attn.o_proj(o)
            hs.append(x + layer.mlp(layer.post_attention_layernorm(x)))
        xs = hs
    return model.action_out_proj(exp.norm(xs[1])[:, -model.cfg.horizon :])


def test_cached_prefix_equals_the_joint_two_stream_pass(model):
    images, masks, tokens, token_mask, state, noise = inputs()
    t = torch.tensor([0.9, 0.5, 0.1])
    emb, pad = model.embed_prefix(images, masks, tokens, token_mask)
    cached = model.velocity(model.encode_prefix(emb, pad), pad, state, noise, t)
    joint = joint_velocity(model, images, masks, tokens, token_mask, state, noise, t)
    torch.testing.assert_close(cached, joint, rtol=1e-4, atol=1e-5)
    # a padded camera and padded tokens are invisible: changing them changes nothing
    images2 = [images[0], images[1].clone()]
    images2[1][1] = 0.0  # sample 1's second camera is masked out
    tokens2 = tokens.clone()
    tokens2[0, 5:] = 7  # sample 0's tokens past its length
    emb2, pad2 = model.embed_prefix(images2, masks, tokens2, token_mask)
    torch.testing.assert_close(model.velocity(model.encode_prefix(emb2, pad2), pad2, state, noise, t), cached)


def test_flow_matching_fits_an_action_chunk_per_instruction():
    """Trained on two (instruction, chunk) pairs, sampling from fresh noise returns each
    instruction's chunk: language conditioning and the Euler sampler work end to end."""
    torch.manual_seed(1)
    cfg = Pi0Config.tiny(action_dim=8, state_dim=8)
    m = Pi0Model(cfg)
    images, masks, tokens, token_mask, state, _ = inputs(2, cfg=cfg)
    images = [torch.zeros_like(images[0]).expand(2, -1, -1, -1)] * 2  # same scene
    state = torch.zeros(2, cfg.state_dim)
    target = torch.stack([torch.linspace(-0.8, 0.8, cfg.horizon * 8).view(cfg.horizon, 8), torch.full((cfg.horizon, 8), 0.5)])
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for _ in range(300):
        idx = torch.randint(0, 2, (16,))
        loss = m.flow_loss([i[idx] for i in images], [k[idx] for k in masks], tokens[idx], token_mask[idx], state[idx], target[idx]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    acts, chain = m.sample_actions(images, masks, tokens, token_mask, state, num_steps=10)
    assert chain.shape == (11, 2, cfg.horizon, 8) and torch.equal(chain[-1], acts)
    err = (acts - target).abs().mean(dim=(1, 2))
    assert err.max() < 0.1, err  # each instruction gets its own chunk (they differ by ~0.6)


def stats(dim=32):
    rng = np.random.default_rng(0)
    s = lambda: NormStats(rng.normal(size=dim).astype(np.float32), rng.uniform(0.5, 2, dim).astype(np.float32),  # noqa: E731
                          -np.ones(dim, np.float32), np.ones(dim, np.float32))  # fmt: skip
    return {"state": s(), "actions": s()}


def test_openpi_layout_round_trip(model, tmp_path):
    folder = save_openpi(model, tmp_path / "ckpt", stats(), asset_id="droid")
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "paligemma_with_expert.paligemma.lm_head.weight" in keys  # the tied embedding, stored once
    assert not any("embed_tokens" in k for k in keys)
    assert any(k.startswith("paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0") for k in keys)
    assert "paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj.weight" in keys and "state_proj.weight" in keys
    assert json.loads((folder / "config.json").read_text())["action_horizon"] == model.cfg.horizon
    loaded, norm = load_pi0(folder)
    images, masks, tokens, token_mask, state, noise = inputs()
    a0, _ = model.sample_actions(images, masks, tokens, token_mask, state, noise=noise)
    a1, _ = loaded.eval().sample_actions(images, masks, tokens, token_mask, state, noise=noise)
    torch.testing.assert_close(a0, a1, rtol=0, atol=0)
    x = np.random.default_rng(1).normal(size=(4, 7)).astype(np.float32)
    np.testing.assert_allclose(norm["actions"].unnormalize(norm["actions"].normalize(x)), x, rtol=1e-5, atol=1e-5)
    with pytest.raises(FileNotFoundError, match="assets/libero/norm_stats.json.*droid"):
        load_norm_stats(folder, asset_id="libero")


def test_lerobot_layout_loads_the_same_weights(model, tmp_path):
    from safetensors.numpy import save_file as save_np
    from safetensors.torch import save_file

    folder = tmp_path / "lerobot"
    folder.mkdir()
    sd = {"model." + model_key_to_file(k): v.contiguous() for k, v in model.state_dict().items() if "embed_tokens" not in k}
    save_file(sd, str(folder / "model.safetensors"))
    cfg = model.cfg
    (folder / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": cfg.horizon, "max_action_dim": 32, "max_state_dim": 32,
        "paligemma_variant": cfg.vlm, "action_expert_variant": cfg.expert, "num_inference_steps": cfg.num_steps,
        "tokenizer_max_length": cfg.max_token_len, "rlinf_user": {"vision": "tiny", "vocab_size": cfg.vocab_size, "num_cameras": 2}}))  # fmt: skip
    state_file = "policy_preprocessor_step_6_normalizer_processor.safetensors"
    (folder / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {}},
        {"registry_name": "normalizer_processor", "config": {}, "state_file": state_file}]}))  # fmt: skip
    s = stats()
    save_np({"observation.state.mean": s["state"].mean, "observation.state.std": s["state"].std,
             "action.mean": s["actions"].mean, "action.std": s["actions"].std}, str(folder / state_file))  # fmt: skip
    loaded, norm = load_pi0(folder)
    images, masks, tokens, token_mask, state, noise = inputs()
    torch.testing.assert_close(loaded.eval().sample_actions(images, masks, tokens, token_mask, state, noise=noise)[0],
                               model.sample_actions(images, masks, tokens, token_mask, state, noise=noise)[0], rtol=0, atol=0)  # fmt: skip
    np.testing.assert_array_equal(norm["actions"].std, s["actions"].std)


def test_a_checkpoint_that_does_not_fit_is_refused_naming_the_key(model, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_openpi(model, tmp_path / "ckpt", stats())
    with pytest.raises(CheckpointMismatch, match="action_in_proj.weight has shape .*expects"):
        load_pi0(folder, action_dim=16)
    sd = load_file(str(folder / "model.safetensors"))
    sd["time_mlp_in.weight"] = torch.zeros(32, 32)  # a pi0.5 head
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointMismatch, match="has time_mlp_in.weight, which the configured model does not"):
        load_pi0(folder)
    del sd["time_mlp_in.weight"], sd["state_proj.bias"]
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointMismatch, match="lacks state_proj.bias"):
        load_pi0(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_pi0(folder)


def test_sizes_are_checked_and_pi0_size_is_about_3b():
    with pytest.raises(ValueError, match="attend jointly"):
        Pi0Config(vlm="gemma_2b", expert="tiny_expert").sizes()
    with pytest.raises(ValueError, match="unknown size 'gemma_7b'"):
        Pi0Config(vlm="gemma_7b").sizes()
    with torch.device("meta"):  # no memory: count the parameters of the real configuration
        n = sum(p.numel() for p in Pi0Model(Pi0Config.pi0()).parameters())
    assert 3.0e9 < n < 3.6e9, n
