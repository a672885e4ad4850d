"""ResNet-10, the frozen ImageNet encoder of SERL and HIL-SERL, loaded from a local file.

The module tree is that of the Hub model ``helper2424/resnet10`` (the one LeRobot's HIL-SERL
loads), so its ``model.safetensors`` loads with ``load_state_dict``, without the Hub's remote
code: ``embedder`` (7x7/2 conv, GroupNorm, ReLU, 3x3/2 max-pool), then four stages of one basic
block each (64, 128, 256, 512 channels; strides 1, 2, 2, 2), GroupNorm with 4 groups
everywhere, and TensorFlow/JAX "SAME" padding (the weights were trained in JAX), which pads
stride-2 layers asymmetrically. A 128x128 frame gives a (512, 4, 4) map. Inputs are uint8
frames scaled to [0, 1] and normalised with ImageNet's mean and std, as both SERL and LeRobot do.

Both key spellings of the Hub file are accepted (``...norm1.group_norm.weight`` and the older
``...norm1.weight``). No weights ship in any wheel: ``policy.vision_weights`` names the file
(``docs/resnet10_reference.md`` says where it comes from).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS = (64, 128, 256, 512)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _same_pad(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow "SAME": the output is ceil(size / stride); the odd pixel goes after."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class SameConv(nn.Module):
    """A bias-free conv with "SAME" padding (key ``conv.weight``)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1):
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, bottom = _same_pad(x.shape[-2], self.kernel, self.stride)
        left, right = _same_pad(x.shape[-1], self.kernel, self.stride)
        return self.conv(F.pad(x, (left, right, top, bottom)))


class GroupNorm4(nn.Module):
    """GroupNorm with 4 groups (key ``group_norm.weight``)."""

    def __init__(self, channels: int):
        super().__init__()
        self.group_norm = nn.GroupNorm(4, channels, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group_norm(x)


class SameMaxPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, bottom = _same_pad(x.shape[-2], 3, 2)
        left, right = _same_pad(x.shape[-1], 3, 2)
        return F.max_pool2d(F.pad(x, (left, right, top, bottom), value=float("-inf")), 3, 2)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1, self.norm1 = SameConv(c_in, c_out, 3, stride), GroupNorm4(c_out)
        self.conv2, self.norm2 = SameConv(c_out, c_out, 3), GroupNorm4(c_out)
        self.shortcut = nn.Sequential(SameConv(c_in, c_out, 1, stride), GroupNorm4(c_out)) if c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class Stages(nn.Module):
    def __init__(self):
        super().__init__()
        ins = (CHANNELS[0],) + CHANNELS[:-1]
        self.stages = nn.ModuleList(BasicBlock(i, o, 1 if n == 0 else 2) for n, (i, o) in enumerate(zip(ins, CHANNELS)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


class ResNet10(nn.Module):
    """(B, 3, H, W) normalised -> (B, 512, H/32, W/32)."""

    out_channels = CHANNELS[-1]

    def __init__(self):
        super().__init__()
        # the stem's 7x7/2 conv pads 3 on each side in the original too
        self.embedder = nn.Sequential(
            nn.Conv2d(3, CHANNELS[0], 7, 2, padding=3, bias=False), GroupNorm4(CHANNELS[0]), nn.ReLU(), SameMaxPool()
        )
        self.encoder = Stages()
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def preprocess(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> ImageNet-normalised (B, 3, H, W)."""
        return (image.permute(0, 3, 1, 2).float() / 255.0 - self.mean) / self.std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embedder(x))


_OLD_NORM = re.compile(r"((?:embedder\.1|norm[12]|shortcut\.1))\.(weight|bias)$")


def _canonical(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Hub file's keys in this module's spelling (older uploads lack ``.group_norm``;
    a ``model.`` or ``resnet.`` prefix from a wrapper is dropped)."""
    out = {}
    for key, value in state.items():
        for prefix in ("model.", "resnet."):
            if key.startswith(prefix):
                key = key[len(prefix):]
        out[_OLD_NORM.sub(r"\1.group_norm.\2", key)] = value
    return out


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


def resnet10(weights: str | os.PathLike | None) -> ResNet10:
    """ResNet-10 with the weights in ``weights`` (a ``model.safetensors`` or ``.pth`` state
    dict in helper2424/resnet10's layout). Refuses another architecture's file, naming the
    keys that do not fit."""
    if weights is None:
        raise ValueError(
            "policy.encoder=resnet10 needs its weights: set policy.vision_weights to a local copy of "
            "helper2424/resnet10's model.safetensors (see docs/resnet10_reference.md), or use "
            "policy.encoder=efficientnet, whose ImageNet weights ship with the vla extra"
        )
    path = Path(weights).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"policy.vision_weights={path}: no such file (ResNet-10 model.safetensors or .pth)")
    net = ResNet10()
    try:
        state = _canonical(read_state_dict(path))
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ValueError(f"policy.vision_weights={path} could not be read as a state dict ({err})") from None
    want = net.state_dict()
    missing = sorted(set(want) - set(state))
    unexpected = sorted(set(state) - set(want))
    wrong = sorted(k for k in set(want) & set(state) if tuple(state[k].shape) != tuple(want[k].shape))
    if missing or wrong:
        detail = "; ".join(
            part for part in (
                f"missing {len(missing)} key(s), e.g. {missing[:3]}" if missing else "",
                f"{len(wrong)} of another shape, e.g. {wrong[0]} {tuple(state[wrong[0]].shape)} != "
                f"{tuple(want[wrong[0]].shape)}" if wrong else "",
                f"{len(unexpected)} unknown, e.g. {unexpected[:3]}" if unexpected else "",
            ) if part
        )  # fmt: skip
        raise ValueError(
            f"policy.vision_weights={path} is not a ResNet-10 (helper2424/resnet10 layout) state dict: {detail}. "
            "Give that model's model.safetensors, or the encoder the file belongs to (policy.encoder=efficientnet "
            "for an EfficientNet-Lite0 .pth)"
        )
    net.load_state_dict({k: state[k].float() for k in want})
    return net
