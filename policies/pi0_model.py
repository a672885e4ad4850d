"""A pi0-style flow-matching VLA built from transformers' own classes.

The architecture of openpi's PyTorch pi0 (``PI0Pytorch``), on stock transformers 5.x:

* a PaliGemma (SigLIP vision tower + linear projector + Gemma language model) encodes the
  prefix: every camera's patches, then the tokenised instruction; the prefix attends
  bidirectionally within itself;
* a smaller Gemma, the *action expert*, encodes the suffix: one state token, then H noisy
  action tokens each fused with the flow time (sinusoidal embedding, an MLP);
* in every layer both streams attend jointly (the expert's queries see the VLM's keys and
  values of the same layer), each with its own norms, projections and MLP. The prefix
  never attends to the suffix, so the joint pass equals a prefix pass (its per-layer keys
  and values kept: the KV cache) followed by suffix passes over that cache. Sampling
  runs the prefix once and the K denoising steps over its cache.

Flow matching as openpi: ``x_t = t * noise + (1 - t) * actions``, the network predicts
``noise - actions``, training times from Beta(1.5, 1) scaled to [0.001, 1], sampling
integrates with Euler steps from t = 1 to 0.

Key names follow openpi's ``model.safetensors`` (``paligemma_with_expert.paligemma...``,
``paligemma_with_expert.gemma_expert.model...``, ``action_in_proj``, ...), so its
checkpoints load by name (:mod:`rlinf_user.policies.pi0_checkpoint`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from rlinf_user.policies.flow_core import JointFlowModel, additive, attention_2d, layer_step, time_embedding

_layer_step, _additive = layer_step, additive  # the names earlier code and tests use
__all__ = ["Pi0Config", "Pi0Model", "attention_2d", "time_embedding"]


@dataclass(frozen=True)
class GemmaSize:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class SiglipSize:
    hidden: int = 1152
    depth: int = 27
    mlp_dim: int = 4304
    num_heads: int = 16
    patch: int = 14
    image_size: int = 224


# openpi's variants (models/gemma.py); the experts must share depth, heads and head_dim
GEMMA_SIZES = {
    "gemma_2b": GemmaSize(2048, 18, 16384, 8, 1, 256),
    "gemma_300m": GemmaSize(1024, 18, 4096, 8, 1, 256),
    "small_vlm": GemmaSize(512, 6, 2048, 8, 1, 64),
    "small_expert": GemmaSize(256, 6, 1024, 8, 1, 64),
    "tiny_vlm": GemmaSize(64, 2, 128, 4, 1, 16),
    "tiny_expert": GemmaSize(32, 2, 64, 4, 1, 16),
}
SIGLIP_SIZES = {
    "so400m": SiglipSize(),
    "small": SiglipSize(hidden=384, depth=6, mlp_dim=1536, num_heads=6, patch=16, image_size=224),
    "tiny": SiglipSize(hidden=32, depth=2, mlp_dim=64, num_heads=2, patch=8, image_size=32),
}


@dataclass(frozen=True)
class Pi0Config:
    """Sizes and flow settings. ``pi0()`` is openpi's pi0 (about 3.3B parameters);
    ``small()`` the same graph at about 50M, ``tiny()`` at a few hundred thousand."""

    vlm: str = "gemma_2b"
    expert: str = "gemma_300m"
    vision: str = "so400m"
    vocab_size: int = 257152
    action_dim: int = 32  # padded action width (the robot's dims come first)
    state_dim: int = 32
    horizon: int = 50  # H: actions per chunk
    num_steps: int = 10  # K: Euler steps when sampling
    max_token_len: int = 48
    num_cameras: int = 3
    min_period: float = 4e-3
    max_period: float = 4.0
    extra: dict = field(default_factory=dict)

    @classmethod
    def pi0(cls, **kw) -> Pi0Config:
        return cls(**kw)

    @classmethod
    def small(cls, **kw) -> Pi0Config:
        """The same graph at about 50M parameters with 224x224 images: a VLA that runs on a CPU."""
        base = dict(vlm="small_vlm", expert="small_expert", vision="small", vocab_size=32000, num_cameras=2)
        return cls(**{**base, **kw})

    @classmethod
    def tiny(cls, **kw) -> Pi0Config:
        base = dict(vlm="tiny_vlm", expert="tiny_expert", vision="tiny", vocab_size=512, horizon=4, num_steps=3,
                    max_token_len=48, num_cameras=2)  # fmt: skip
        return cls(**{**base, **kw})

    def sizes(self) -> tuple[GemmaSize, GemmaSize, SiglipSize]:
        for name, table in ((self.vlm, GEMMA_SIZES), (self.expert, GEMMA_SIZES), (self.vision, SIGLIP_SIZES)):
            if name not in table:
                raise ValueError(f"unknown size {name!r}: available {', '.join(sorted(table))}")
        vlm, exp = GEMMA_SIZES[self.vlm], GEMMA_SIZES[self.expert]
        shared = ("depth", "num_heads", "num_kv_heads", "head_dim")
        if any(getattr(vlm, k) != getattr(exp, k) for k in shared):
            raise ValueError(f"the VLM ({self.vlm}) and the action expert ({self.expert}) attend jointly: {shared} must match")
        return vlm, exp, SIGLIP_SIZES[self.vision]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gemma_config(size: GemmaSize, vocab: int) -> dict[str, Any]:
    return dict(model_type="gemma", hidden_size=size.width, intermediate_size=size.mlp_dim, num_hidden_layers=size.depth,
                num_attention_heads=size.num_heads, num_key_value_heads=size.num_kv_heads, head_dim=size.head_dim,
                vocab_size=vocab, hidden_act="gelu_pytorch_tanh")  # fmt: skip


class _Expert(nn.Module):
    """Holds the action expert as ``.model`` (openpi's ``gemma_expert.model.*`` keys)."""

    def __init__(self, size: GemmaSize, vocab: int):
        super().__init__()
        from transformers import GemmaConfig, GemmaModel

        cfg = GemmaConfig(**{k: v for k, v in _gemma_config(size, vocab).items() if k != "model_type"})
        self.model = GemmaModel(cfg)
        self.model.embed_tokens = None  # the expert embeds no tokens


class PaliGemmaWithExpert(nn.Module):
    def __init__(self, cfg: Pi0Config):
        super().__init__()
        from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

        vlm, exp, vis = cfg.sizes()
        pcfg = PaliGemmaConfig(
            vision_config=dict(model_type="siglip_vision_model", hidden_size=vis.hidden, intermediate_size=vis.mlp_dim,
                               num_hidden_layers=vis.depth, num_attention_heads=vis.num_heads, patch_size=vis.patch,
                               image_size=vis.image_size, projection_dim=vlm.width, vision_use_head=False,
                               projector_hidden_act="gelu_fast"),
            text_config=_gemma_config(vlm, cfg.vocab_size),
            vocab_size=cfg.vocab_size, image_token_index=cfg.vocab_size - 1, projection_dim=vlm.width,
        )  # fmt: skip
        pcfg._attn_implementation = "eager"
        self.paligemma = PaliGemmaForConditionalGeneration(pcfg)
        self.gemma_expert = _Expert(exp, cfg.vocab_size)

    @property
    def language_model(self):
        return self.paligemma.model.language_model

    def embed_image(self, image: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) in [-1, 1] -> (B, patches, width): SigLIP then the projector."""
        return self.paligemma.model.get_image_features(image).pooler_output

    def embed_language(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.language_model.embed_tokens(tokens)  # scaled by sqrt(width) inside (transformers 5)


class Pi0Model(JointFlowModel):
    def __init__(self, cfg: Pi0Config):
        super().__init__()
        self.cfg = cfg
        _, exp, _ = cfg.sizes()
        self.paligemma_with_expert = PaliGemmaWithExpert(cfg)
        self.build_suffix(exp.width)

    def vlm_stack(self):
        lm = self.paligemma_with_expert.language_model
        return lm.layers, lm.rotary_emb

    def expert_stack(self):
        expert = self.paligemma_with_expert.gemma_expert.model
        return expert.layers, expert.norm

    def embed_prefix(self, images: list[torch.Tensor], image_masks: list[torch.Tensor], tokens: torch.Tensor,
                     token_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Embeddings (B, Lp, W) and pad mask (B, Lp) of cameras then instruction tokens."""
        pw = self.paligemma_with_expert
        embs, pads = [], []
        for img, m in zip(images, image_masks):
            if m is None:  # a slot the env has no camera for (its tokens would all be masked)
                continue
            e = pw.embed_image(img)
            embs.append(e)
            pads.append(m.bool()[:, None].expand(-1, e.shape[1]))
        embs.append(pw.embed_language(tokens))
        pads.append(token_mask.bool())
        return torch.cat(embs, dim=1), torch.cat(pads, dim=1)
