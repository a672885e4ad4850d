"""ResNet-10 from a local file in helper2424/resnet10's layout: both key spellings load, the
map has SERL's shape, a frozen policy uses it, and another network's file is refused."""

import pytest
import torch
from safetensors.torch import save_file

from rlinf_user.config.compose import compose_config
from rlinf_user.env.spec import EnvSpec
from rlinf_user.policies.base import build_policy
from rlinf_user.policies.resnet10 import ResNet10, _same_pad, resnet10


def hub_file(tmp_path, old_keys=False):
    """A ResNet-10 state dict saved as the Hub's model.safetensors (random weights: no
    weights ship in a wheel; the layout is what is under test)."""
    torch.manual_seed(0)
    state = ResNet10().state_dict()
    if old_keys:  # uploads before the norms were wrapped: no ".group_norm" in the key
        state = {k.replace(".group_norm.", "."): v for k, v in state.items()}
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path, state


def test_same_padding_puts_the_odd_pixel_after_as_jax_does():
    assert _same_pad(128, 3, 2) == (0, 1)
    assert _same_pad(32, 3, 1) == (1, 1)
    assert _same_pad(64, 1, 2) == (0, 0)


@pytest.mark.parametrize("old_keys", [False, True])
def test_the_hub_layout_loads_and_gives_a_4x4_map_of_a_128_frame(tmp_path, old_keys):
    path, state = hub_file(tmp_path, old_keys)
    net = resnet10(path)
    assert sum(p.numel() for p in net.parameters()) == 4_905_792  # the Hub model card's count
    key = "encoder.stages.3.norm2.group_norm.weight"
    torch.testing.assert_close(net.state_dict()[key], state[key.replace(".group_norm.", ".") if old_keys else key])
    frame = torch.randint(0, 255, (2, 128, 128, 3), dtype=torch.uint8)
    with torch.no_grad():
        out = net(net.preprocess(frame))
    assert out.shape == (2, 512, 4, 4) and (out[0] - out[1]).abs().mean() > 0


def test_a_frozen_policy_on_resnet10_learns_only_its_heads(tmp_path):
    path, _ = hub_file(tmp_path)
    cfg = compose_config(["policy=cnn", "policy.encoder=resnet10", f"policy.vision_weights={path}"], sim="reach")
    policy = build_policy(cfg.policy, EnvSpec(state_dim=3, cameras={"wrist": (128, 128)}, active_dims=(0, 1, 2, 6)))
    assert not any("stages" in k for k in policy.state_dict())  # the backbone is not published
    obs = {"state": torch.randn(2, 3), "images": {"wrist": torch.randint(0, 255, (2, 128, 128, 3), dtype=torch.uint8)}}
    feats = policy.encoder(obs)
    assert feats.shape == (2, 3 + 64)
    feats.sum().backward()
    assert policy.encoder.embed["wrist"].kernel.grad is not None
    assert all(p.grad is None for p in policy.encoder.net.parameters())


def test_missing_or_foreign_weights_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="needs its weights: set policy.vision_weights"):
        resnet10(None)
    with pytest.raises(FileNotFoundError, match="no such file"):
        resnet10(tmp_path / "absent.safetensors")
    other = tmp_path / "lite0.pth"
    torch.save({"_conv_stem.weight": torch.zeros(32, 3, 3, 3)}, other)
    with pytest.raises(ValueError, match=r"is not a ResNet-10 .* missing 36 key\(s\).* 1 unknown"):
        resnet10(other)
    path, state = hub_file(tmp_path)
    state["embedder.0.weight"] = torch.zeros(32, 3, 7, 7)  # a narrower network
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    with pytest.raises(ValueError, match=r"1 of another shape, e.g. embedder.0.weight \(32, 3, 7, 7\)"):
        resnet10(path)
    garbage = tmp_path / "notes.safetensors"
    garbage.write_text("not tensors")
    with pytest.raises(ValueError, match="could not be read"):
        resnet10(garbage)
