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

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


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


def _layer_step(layer, x, cos, sin, mask, past: tuple[torch.Tensor, torch.Tensor] | None):
    """One Gemma decoder layer on one stream, its keys/values after RoPE returned (and,
    with ``past``, the other stream's keys/values of this layer prepended)."""
    from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb, eager_attention_forward

    attn = layer.self_attn
    b, n = x.shape[:2]
    h = layer.input_layernorm(x)
    shape = (b, n, -1, attn.head_dim)
    q = attn.q_proj(h).view(shape).transpose(1, 2)
    k = attn.k_proj(h).view(shape).transpose(1, 2)
    v = attn.v_proj(h).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    kv = (k, v)
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    out, _ = eager_attention_forward(attn, q, k, v, mask, scaling=attn.scaling)
    x = x + attn.o_proj(out.reshape(b, n, -1))
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x, kv


def attention_2d(pad: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """big_vision's block mask: token q sees token k iff ``cumsum(att)[k] <= cumsum(att)[q]``
    and both are real (not padding). (B, L) bools/ints -> (B, L, L) bool."""
    cum = torch.cumsum(att.long(), dim=1)
    allowed = cum[:, None, :] <= cum[:, :, None]
    valid = pad[:, None, :].bool() & pad[:, :, None].bool()
    return allowed & valid


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(mask[:, None], torch.zeros((), dtype=dtype), torch.full((), torch.finfo(dtype).min, dtype=dtype))


def time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """Sinusoidal embedding of the flow time, periods geometric in [min, max] (float64 math)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    arg = t.double()[:, None] * (2 * math.pi / period)[None]
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=-1).float()


class Pi0Model(nn.Module):
    def __init__(self, cfg: Pi0Config):
        super().__init__()
        self.cfg = cfg
        _, exp, _ = cfg.sizes()
        self.paligemma_with_expert = PaliGemmaWithExpert(cfg)
        self.action_in_proj = nn.Linear(cfg.action_dim, exp.width)
        self.action_out_proj = nn.Linear(exp.width, cfg.action_dim)
        self.state_proj = nn.Linear(cfg.state_dim, exp.width)
        self.action_time_mlp_in = nn.Linear(2 * exp.width, exp.width)
        self.action_time_mlp_out = nn.Linear(exp.width, exp.width)

    # -- prefix ---------------------------------------------------------------------------
    def embed_prefix(self, images: list[torch.Tensor], image_masks: list[torch.Tensor], tokens: torch.Tensor,
                     token_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Embeddings (B, Lp, W) and pad mask (B, Lp) of cameras then instruction tokens."""
        pw = self.paligemma_with_expert
        embs, pads = [], []
        for img, m in zip(images, image_masks):
            e = pw.embed_image(img)
            embs.append(e)
            pads.append(m.bool()[:, None].expand(-1, e.shape[1]))
        embs.append(pw.embed_language(tokens))
        pads.append(token_mask.bool())
        return torch.cat(embs, dim=1), torch.cat(pads, dim=1)

    def encode_prefix(self, emb: torch.Tensor, pad: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Runs the VLM over the prefix; returns each layer's keys and values (the cache)."""
        lm = self.paligemma_with_expert.language_model
        pos = torch.cumsum(pad.long(), dim=1) - 1
        cos, sin = lm.rotary_emb(emb, pos)
        mask = _additive(attention_2d(pad, torch.zeros_like(pad)), emb.dtype)
        cache, x = [], emb
        for layer in lm.layers:
            x, kv = _layer_step(layer, x, cos, sin, mask, None)
            cache.append(kv)
        return cache

    # -- suffix ---------------------------------------------------------------------------
    def embed_suffix(self, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        s = self.state_proj(state)[:, None]
        a = self.action_in_proj(x_t)
        te = time_embedding(t, a.shape[-1], cfg.min_period, cfg.max_period).to(a.dtype)
        at = torch.cat([a, te[:, None].expand_as(a)], dim=-1)
        at = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(at)))
        return torch.cat([s, at], dim=1)

    def velocity(self, cache, prefix_pad: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The expert's predicted velocity (B, H, action_dim) for noisy actions ``x_t`` at
        time ``t``, attending to the cached prefix."""
        expert = self.paligemma_with_expert.gemma_expert.model
        lm = self.paligemma_with_expert.language_model
        x = self.embed_suffix(state, x_t, t)
        b, ls = x.shape[:2]
        suffix_att = torch.zeros(b, ls, dtype=torch.long, device=x.device)
        suffix_att[:, :2] = 1  # the state token, then the action block
        pad = torch.cat([prefix_pad, torch.ones(b, ls, dtype=torch.bool, device=x.device)], dim=1)
        att = torch.cat([torch.zeros_like(prefix_pad, dtype=torch.long), suffix_att], dim=1)
        mask = _additive(attention_2d(pad, att)[:, prefix_pad.shape[1] :], x.dtype)
        pos = prefix_pad.long().sum(dim=1, keepdim=True) + torch.arange(ls, device=x.device)[None]
        cos, sin = lm.rotary_emb(x, pos)
        for layer, past in zip(expert.layers, cache):
            x, _ = _layer_step(layer, x, cos, sin, mask, past)
        x = expert.norm(x)
        return self.action_out_proj(x[:, -self.cfg.horizon :].float())

    # -- training and sampling ------------------------------------------------------------
    def sample_time(self, b: int, device) -> torch.Tensor:
        beta = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0))
        return (beta.sample((b,)) * 0.999 + 0.001).to(device)

    def flow_loss(self, images, image_masks, tokens, token_mask, state, actions, noise=None, t=None) -> torch.Tensor:
        """Per-element flow-matching loss (B, H, action_dim) on normalised, padded actions."""
        b = actions.shape[0]
        noise = torch.randn_like(actions) if noise is None else noise
        t = self.sample_time(b, actions.device) if t is None else t
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
        emb, pad = self.embed_prefix(images, image_masks, tokens, token_mask)
        v = self.velocity(self.encode_prefix(emb, pad), pad, state, x_t, t)
        return F.mse_loss(v, noise - actions, reduction="none")

    @torch.no_grad()
    def sample_actions(self, images, image_masks, tokens, token_mask, state, noise=None, num_steps: int | None = None):
        """Euler integration from noise (t = 1) to actions (t = 0): (B, H, action_dim).
        Returns the actions and the chain of intermediate ``x_t`` (K + 1, B, H, A)."""
        k = int(num_steps or self.cfg.num_steps)
        b = state.shape[0]
        if noise is None:
            noise = torch.randn(b, self.cfg.horizon, self.cfg.action_dim, device=state.device)
        emb, pad = self.embed_prefix(images, image_masks, tokens, token_mask)
        cache = self.encode_prefix(emb, pad)
        dt = -1.0 / k
        x, chain = noise, [noise]
        for i in range(k):
            t = torch.full((b,), 1.0 + i * dt, device=state.device)
            x = x + dt * self.velocity(cache, pad, state, x, t)
            chain.append(x)
        return x, torch.stack(chain)
