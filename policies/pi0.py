"""``policy=pi0``: the pi0-style flow VLA (:mod:`rlinf_user.policies.pi0_model`) behind the
policy interface.

It acts on contract observations: each env camera (uint8 HxWx3) is resized with padding to
the model's image size and scaled to [-1, 1] (openpi's ``resize_with_pad``), model image
slots the env has no camera for are masked out; the state is normalised with the
checkpoint's statistics and zero-padded to the model's state width; the observation's
``instruction`` (or ``policy.prompt``) is tokenised (:mod:`rlinf_user.policies.vla_text`).
Acting, the RL extras (Flow-Noise chain, log-prob, value) and the fine-tuning modes are
:class:`rlinf_user.policies.flow_vla.FlowVLAPolicy`'s.

``policy.checkpoint=<folder>`` loads an openpi or LeRobot pi0 folder (its config decides the
sizes); without one, ``policy.size`` (``tiny`` | ``small`` | ``pi0``) builds a randomly initialised model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rlinf_user.env.spec import EnvSpec
from rlinf_user.policies.flow_vla import FlowVLAPolicy, FlowVLAPolicyConfig, cfg_getter
from rlinf_user.policies.pi0_checkpoint import NormStats, load_pi0
from rlinf_user.policies.pi0_model import Pi0Config, Pi0Model
from rlinf_user.policies.vla_text import PromptTokenizer, open_tokenizer


def resize_with_pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, size, size) in [-1, 1]: the aspect ratio kept, the
    short side centred and padded with -1 (black)."""
    x = images.permute(0, 3, 1, 2).float() / 127.5 - 1.0
    h, w = x.shape[-2:]
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    if (nh, nw) != (h, w):
        x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)
    top, left = (size - nh) // 2, (size - nw) // 2
    return F.pad(x, (left, size - nw - left, top, size - nh - top), value=-1.0)


def identity_stats(dim: int) -> NormStats:
    return NormStats(np.zeros(dim, np.float32), np.ones(dim, np.float32) - 1e-6)


@dataclass
class Pi0PolicyConfig(FlowVLAPolicyConfig):
    """``policy=pi0``: an openpi or LeRobot pi0 checkpoint, or a fresh model of ``size``."""

    name: str = "pi0"
    checkpoint: str | None = None  # an openpi or LeRobot pi0 folder; its config decides the sizes
    asset_id: str | None = None  # openpi: which assets/<asset_id>/norm_stats.json (when there are several)
    size: str = "tiny"  # without a checkpoint: tiny (tests) | small (~50M, CPU) | pi0 (about 3.3B parameters)
    tokenizer: str | None = None  # a tokenizer folder (PaliGemma's for real pi0 weights); None: UTF-8 bytes


class Pi0Policy(FlowVLAPolicy):
    config = Pi0PolicyConfig

    def __init__(self, spec: EnvSpec, model: Pi0Model, norm: dict[str, NormStats], prompt: PromptTokenizer,
                 cameras: list[str], default_prompt: str = "", **kw):  # fmt: skip
        vis = model.paligemma_with_expert.paligemma.config.vision_config
        self.image_size = vis.image_size
        _, exp, _ = model.cfg.sizes()
        super().__init__(spec, model, norm, prompt, cameras, default_prompt, num_cameras=model.cfg.num_cameras,
                         expert_width=exp.width, **kw)  # fmt: skip

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> Pi0Policy:
        get = cfg_getter(policy_cfg)
        over = {k: int(get(k)) for k in ("horizon", "num_steps") if get(k) is not None}
        if get("checkpoint"):
            model, norm = load_pi0(get("checkpoint"), get("asset_id"), **over)
        else:
            size = str(get("size") or "tiny")
            if size not in ("tiny", "small", "pi0"):
                raise ValueError(f"policy.size={size!r}: tiny, small or pi0 (or set policy.checkpoint=<folder>)")
            # a fresh model's state projection is as wide as the env needs (a checkpoint's is
            # its own: real pi0 reads 32 dims)
            cfg = getattr(Pi0Config, size)(state_dim=max(Pi0Config.state_dim, spec.state_dim), **over)
            model = Pi0Model(cfg)
            norm = {"state": identity_stats(cfg.state_dim), "actions": identity_stats(cfg.action_dim)}
        cameras = list(get("cameras") or sorted(spec.cameras))[: model.cfg.num_cameras]
        prompt = PromptTokenizer(open_tokenizer(get("tokenizer")), model.cfg.max_token_len)
        return cls(spec, model, norm, prompt, cameras, str(get("prompt") or ""), **cls.common_kwargs(policy_cfg))

    def frozen_modules(self):
        return [self.model.paligemma_with_expert.paligemma]

    def lora_targets(self):
        return self.model.paligemma_with_expert.paligemma.model.language_model

    def preprocess(self, frames: torch.Tensor) -> torch.Tensor:
        return resize_with_pad(frames, self.image_size)
