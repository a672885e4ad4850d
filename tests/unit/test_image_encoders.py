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


def sac_pair(*overrides):
    """Two SAC learners from one seed over the frozen encoder, and an update's batch."""
    from rlinf_user.algorithms.base import build_algorithm

    cfg = compose_config(["policy=cnn", "policy.encoder=efficientnet", "algo=sac", "algo.actor_update_every=1",
                          "algo.critic_warmup_updates=0", *overrides], sim="reach")  # fmt: skip
    algos = []
    for _ in range(2):
        torch.manual_seed(0)
        algos.append(build_algorithm(cfg.algo, cfg.policy, spec()))
    g = torch.Generator().manual_seed(3)
    batch = {"obs": obs(4, seed=1), "next_obs": obs(4, seed=2), "action": torch.rand(4, 4, generator=g) * 2 - 1,
             "reward": torch.rand(4, generator=g), "terminated": torch.zeros(4)}  # fmt: skip
    return algos, batch


@pytest.mark.parametrize("shared", [True, False])
def test_a_frozen_backbone_runs_once_per_update_and_learns_the_same(monkeypatch, shared):
    """One SAC update reads its observation and the next through the critics', the
    target's and the actor's encoders; a frozen backbone's maps are computed once per
    frame size for all of them (two sizes here: two passes, not eight or more), and the
    update is the one the per-encoder passes give."""
    (fast, slow), batch = sac_pair(f"algo.shared_encoder={str(shared).lower()}")
    calls = []
    for algo in (fast, slow):
        for enc in {id(e): e for e in (algo.policy.encoder, algo.critic_encoder, algo.target_encoder)}.values():
            enc.net.register_forward_hook(lambda m, i, o: calls.append(len(i[0])))
    torch.manual_seed(5)
    got = fast.update(batch)
    assert sorted(calls) == [8, 8], "one pass per frame size over obs and next_obs (4 rows each)"
    calls.clear()
    monkeypatch.setattr(type(slow.policy.encoder), "with_maps", lambda self, *o: o)
    torch.manual_seed(5)
    want = slow.update(batch)
    assert len(calls) >= 8, "without the shared maps each encoder runs the backbone itself"
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) <= 1e-5 * (1 + abs(want[k])) for k in got)
    # the convolutions over 8 frames and over 4 round differently in the last bits; Adam's
    # step (3e-4) turns that into at most a few 1e-5 on weights whose gradient is near 0
    for (name, a), b in zip(fast.policy.state_dict().items(), slow.policy.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-4), name
    for a, b in zip(fast.critic.parameters(), slow.critic.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("kind", ["cnn", "efficientnet"])
def test_image_autocast_runs_the_trunk_in_bfloat16_on_a_gpu_only(device, kind):
    """``policy.image_autocast``: on a GPU the trunk runs in bfloat16 and the features stay
    float32 and close to the float32 trunk's; on a CPU it changes nothing."""
    over = [] if kind == "cnn" else ["policy.encoder=efficientnet", "policy.encoder_finetune=true"]
    cfg = compose_config(["policy=cnn", *over], sim="reach")
    torch.manual_seed(0)
    plain = build_policy(cfg.policy, spec()).to(device)
    cast = build_policy(compose_config(["policy=cnn", *over, "policy.image_autocast=true"], sim="reach").policy, spec())
    cast.load_state_dict(plain.state_dict())
    cast.to(device).eval()
    plain.eval()
    assert cast.encoder.autocast and not plain.encoder.autocast
    x = {k: (v.to(device) if torch.is_tensor(v) else {c: t.to(device) for c, t in v.items()}) for k, v in obs(4).items()}
    with torch.no_grad():
        a, b = plain.encoder(x), cast.encoder(x)
    assert b.dtype == torch.float32
    if device == "cpu":
        assert torch.equal(a, b)
    else:
        assert not torch.equal(a, b) and torch.allclose(a, b, atol=0.1)
