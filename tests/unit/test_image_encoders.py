"""The pretrained image encoder: real EfficientNet-Lite0 ImageNet weights, frozen or
fine-tuned, its frozen part kept out of the published state, wrong weights refused."""

import pytest
import torch

from rlinf_user.config.compose import compose_config
from rlinf_user.env.spec import EnvSpec
from rlinf_user.policies.base import build_policy

pytest.importorskip("efficientnet_lite_pytorch")


def spec():
    return EnvSpec(state_dim=5, cameras={"front": (96, 128), "wrist": (64, 64)}, active_dims=(0, 1, 2, 6))


def obs(batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"state": torch.randn(batch, 5, generator=g),
            "images": {"front": torch.randint(0, 255, (batch, 96, 128, 3), generator=g, dtype=torch.uint8),
                       "wrist": torch.randint(0, 255, (batch, 64, 64, 3), generator=g, dtype=torch.uint8)}}  # fmt: skip


def policy(*overrides):
    cfg = compose_config(["policy=cnn", "policy.encoder=efficientnet", *overrides], sim="reach")
    return build_policy(cfg.policy, spec())


def test_frozen_encoder_learns_only_its_heads_and_publishes_no_backbone():
    p = policy()
    enc = p.encoder
    state = p.state_dict()
    assert not any(k.startswith("encoder.") and ("backbone" in k or "blocks" in k) for k in state), "frozen: unpublished"
    assert any(k.startswith("encoder.embed.front") for k in state)
    before = [t.clone() for t in enc.net.parameters()]
    p.train()
    assert not enc.net.training  # frozen BatchNorm statistics stay ImageNet's
    opt = torch.optim.Adam([q for q in p.parameters() if q.requires_grad], lr=1e-3)
    feats = enc(obs())
    assert feats.shape == (2, 5 + 64 * 2)
    feats.sum().backward()
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, enc.net.parameters(), strict=True))
    assert enc.embed["front"].kernel.grad is not None
    # the pretrained features tell two different frames apart (real weights, not noise)
    with torch.no_grad():
        f = enc.features(obs(batch=2)["images"]["front"])
    assert f.shape == (2, 320, 3, 4) and (f[0] - f[1]).abs().mean() > 1e-3


def test_finetuned_encoder_trains_the_backbone_and_publishes_it():
    p = policy("policy.encoder_finetune=true")
    assert any("encoder.backbone." in k for k in p.state_dict())
    x = obs()
    p.encoder(x).pow(2).sum().backward()
    assert p.encoder.net.stem.weight.grad is not None


def test_weights_of_another_architecture_are_refused(tmp_path):
    bad = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, bad)
    with pytest.raises(ValueError, match="is not an EfficientNet-Lite0 state dict"):
        policy(f"policy.vision_weights={bad}")
