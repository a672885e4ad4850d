"""The joint-attention flow-matching core shared by every flow VLA here (pi0, lite_vla).

A VLA of this family is a vision-language model (the *prefix* stream: camera tokens, then
the instruction's tokens, attending bidirectionally among themselves) and a smaller
transformer, the *action expert* (the *suffix* stream: one state token, then H noisy action
tokens fused with the flow time). In every layer the expert's queries attend to the VLM's
keys and values of that layer; the prefix never attends to the suffix. The joint pass is
therefore a prefix pass whose per-layer keys/values are kept (the KV cache), then suffix
passes over that cache: sampling runs the prefix once and the K denoising steps over it.

:class:`JointFlowModel` holds everything that does not depend on which VLM it is: the
suffix, the cached prefix, flow matching (openpi's convention: ``x_t = t * noise + (1 - t)
* actions``, the network predicts ``noise - actions``, Beta(1.5, 1) training times, Euler
steps from t = 1 to 0) and the stochastic chain RL fine-tuning needs (Flow-Noise, piRL,
arXiv 2510.25889: every denoising step is a Gaussian transition around the Euler step,
its std from a small head over the expert's output, so the chain has a log-density).

A subclass provides ``embed_prefix`` and the two decoder stacks (``vlm_stack``,
``expert_stack``) of any transformers model whose layers follow the Llama/Gemma layout
(``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``, ``mlp``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def attend(attn, q, k, v, mask, sdpa: bool = True) -> torch.Tensor:
    """Attention of queries (B, heads, N, d) over keys/values (B, kv_heads, L, d) with an
    additive mask (B, 1, N, L) -> (B, N, heads, d). ``sdpa``: one fused
    ``scaled_dot_product_attention`` (flash / memory-efficient kernels on a GPU), the keys
    and values repeated for grouped queries; else transformers' eager Gemma attention
    (matmul, float32 softmax, matmul), which it equals within float tolerance."""
    if not sdpa:
        from transformers.models.gemma.modeling_gemma import eager_attention_forward

        return eager_attention_forward(attn, q, k, v, mask, scaling=attn.scaling)[0]
    if k.shape[1] != q.shape[1]:  # grouped queries: each kv head serves heads/kv_heads queries
        rep = q.shape[1] // k.shape[1]
        k = k[:, :, None].expand(-1, -1, rep, -1, -1).reshape(k.shape[0], -1, *k.shape[2:])
        v = v[:, :, None].expand(-1, -1, rep, -1, -1).reshape(v.shape[0], -1, *v.shape[2:])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
    return out.transpose(1, 2)


def layer_step(layer, x, cos, sin, mask, past: tuple[torch.Tensor, torch.Tensor] | None, sdpa: bool = True):
    """One decoder layer on one stream; returns its output and its keys/values after RoPE
    (with ``past``, the other stream's keys/values of this layer are attended too)."""
    from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

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
    out = attend(attn, q, k, v, mask, sdpa)
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


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(mask[:, None], torch.zeros((), dtype=dtype), torch.full((), torch.finfo(dtype).min, dtype=dtype))


def time_embedding(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """Sinusoidal embedding of the flow time, periods geometric in [min, max] (float64 math)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    arg = t.double()[:, None] * (2 * math.pi / period)[None]
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=-1).float()


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def normal_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """A Gaussian's log-density, elementwise (``torch.distributions.Normal`` checks its
    arguments on the host, a synchronisation a captured chunk cannot hold)."""
    return -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - _HALF_LOG_2PI


INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class JointFlowModel(nn.Module):
    """Base class. Subclasses set ``self.cfg`` (``horizon``, ``action_dim``, ``state_dim``,
    ``num_steps``, ``min_period``, ``max_period``), call :meth:`build_suffix` with the
    expert's width, and implement ``embed_prefix``, ``vlm_stack`` and ``expert_stack``."""

    cfg: Any
    _compiled_velocity: Any = None  # set by compile_denoising: the step acting uses
    sdpa: bool = True  # fused attention (False: transformers' eager attention, the reference)

    def compile_denoising(self, how: str | None) -> None:
        """``torch.compile`` the denoising step (the expert over the cached prefix), which a
        chunk runs K times with the same shapes: ``how`` is an inductor mode (``default``,
        ``reduce-overhead``: CUDA graphs on a GPU, ``max-autotune``) or a dynamo backend
        (``aot_eager``, ``cudagraphs``). The whole step is one graph (``fullgraph``); each
        new batch size or prompt length compiles once. Only acting uses it: the learner's
        passes, which need gradients, run the eager step. ``None``: eager again."""
        if how is None:
            self._compiled_velocity = None
            return
        if how not in INDUCTOR_MODES:
            backends = torch._dynamo.list_backends(exclude_tags=())
            if how not in backends:
                raise ValueError(f"policy.compile={how!r}: an inductor mode ({', '.join(INDUCTOR_MODES)}) or a "
                                 f"torch.compile backend ({', '.join(backends)})")  # fmt: skip
        kw = {"mode": how} if how in INDUCTOR_MODES else {"backend": how}
        self._compiled_velocity = torch.compile(self.velocity, fullgraph=True, dynamic=False, **kw)

    def _step(self):
        """The velocity function for this pass: compiled when acting without gradients."""
        if self._compiled_velocity is not None and not torch.is_grad_enabled():
            return self._compiled_velocity
        return self.velocity

    def build_suffix(self, width: int) -> None:
        cfg = self.cfg
        self.action_in_proj = nn.Linear(cfg.action_dim, width)
        self.action_out_proj = nn.Linear(width, cfg.action_dim)
        self.state_proj = nn.Linear(cfg.state_dim, width)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)

    def embed_prefix(self, images, image_masks, tokens, token_mask) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        """Embeddings (B, Lp, W) and pad mask (B, Lp) of the cameras then the instruction."""
        raise NotImplementedError

    def vlm_stack(self) -> tuple[list[nn.Module], nn.Module]:  # pragma: no cover
        """The VLM's decoder layers (those the prefix runs through) and its rotary embedding."""
        raise NotImplementedError

    def expert_stack(self) -> tuple[list[nn.Module], nn.Module]:  # pragma: no cover
        """The expert's decoder layers (one per VLM layer) and its final norm."""
        raise NotImplementedError

    # -- prefix ---------------------------------------------------------------------------
    def encode_prefix(self, emb: torch.Tensor, pad: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Runs the VLM over the prefix; returns each layer's keys and values (the cache)."""
        layers, rotary = self.vlm_stack()
        pos = torch.cumsum(pad.long(), dim=1) - 1
        cos, sin = rotary(emb, pos)
        mask = additive(attention_2d(pad, torch.zeros_like(pad)), emb.dtype)
        cache, x = [], emb
        for layer in layers:
            x, kv = layer_step(layer, x, cos, sin, mask, None, self.sdpa)
            cache.append(kv)
        return cache

    def prefix(self, images, image_masks, tokens, token_mask):
        """The prefix cache and pad mask of one batch of inputs."""
        emb, pad = self.embed_prefix(images, image_masks, tokens, token_mask)
        return self.encode_prefix(emb, pad), pad

    # -- suffix ---------------------------------------------------------------------------
    def embed_suffix(self, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        dtype = self.state_proj.weight.dtype  # float32 inputs into a bfloat16 model
        s = self.state_proj(state.to(dtype))[:, None]
        a = self.action_in_proj(x_t.to(dtype))
        te = time_embedding(t, a.shape[-1], cfg.min_period, cfg.max_period).to(a.dtype)
        at = torch.cat([a, te[:, None].expand_as(a)], dim=-1)
        at = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(at)))
        return torch.cat([s, at], dim=1)

    def _run_expert(self, cache, prefix_pad: torch.Tensor, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        layers, norm = self.expert_stack()
        _, rotary = self.vlm_stack()
        b, ls = x.shape[:2]
        pad = torch.cat([prefix_pad, torch.ones(b, ls, dtype=torch.bool, device=x.device)], dim=1)
        full_att = torch.cat([torch.zeros_like(prefix_pad, dtype=torch.long), att], dim=1)
        mask = additive(attention_2d(pad, full_att)[:, prefix_pad.shape[1] :], x.dtype)
        pos = prefix_pad.long().sum(dim=1, keepdim=True) + torch.arange(ls, device=x.device)[None]
        cos, sin = rotary(x, pos)
        for layer, past in zip(layers, cache):
            x, _ = layer_step(layer, x, cos, sin, mask, past, self.sdpa)
        return norm(x)

    def velocity(self, cache, prefix_pad, state, x_t, t, features: bool = False):
        """The expert's predicted velocity (B, H, action_dim) for noisy actions ``x_t`` at
        time ``t``, attending to the cached prefix; with ``features``, also the expert's
        output at the action tokens (B, H, width)."""
        x = self.embed_suffix(state, x_t, t)
        att = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        att[:, :2] = 1  # the state token, then the action block
        out = self._run_expert(cache, prefix_pad, x, att)[:, -self.cfg.horizon :]
        v = self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float()
        return (v, out) if features else v

    def state_features(self, cache, prefix_pad, state) -> torch.Tensor:
        """The expert's output at the state token (B, width): it sees the prefix and the
        state, never the noisy actions, so it is the same at every denoising step (the
        input of a value head)."""
        x = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None]
        att = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
        return self._run_expert(cache, prefix_pad, x, att)[:, 0]

    # -- flow matching --------------------------------------------------------------------
    def sample_time(self, b: int, device) -> torch.Tensor:
        beta = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0))
        return (beta.sample((b,)) * 0.999 + 0.001).to(device)

    def flow_loss(self, images, image_masks, tokens, token_mask, state, actions, noise=None, t=None,
                  prefix_grad: bool = True) -> torch.Tensor:  # fmt: skip
        """Per-element flow-matching loss (B, H, action_dim) on normalised, padded actions
        (``prefix_grad=False``: the prefix runs without gradients, a frozen VLM)."""
        b = actions.shape[0]
        noise = torch.randn_like(actions) if noise is None else noise
        t = self.sample_time(b, actions.device) if t is None else t
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * actions
        with torch.set_grad_enabled(prefix_grad and torch.is_grad_enabled()):
            cache, pad = self.prefix(images, image_masks, tokens, token_mask)
        v = self.velocity(cache, pad, state, x_t, t)
        return F.mse_loss(v, noise - actions, reduction="none")

    @torch.no_grad()
    def sample_actions(self, images, image_masks, tokens, token_mask, state, noise=None, num_steps: int | None = None):
        """Euler integration from noise (t = 1) to actions (t = 0): (B, H, action_dim).
        Returns the actions and the chain of intermediate ``x_t`` (K + 1, B, H, A)."""
        b = state.shape[0]
        if noise is None:
            noise = torch.randn(b, self.cfg.horizon, self.cfg.action_dim, device=state.device)
        cache, pad = self.prefix(images, image_masks, tokens, token_mask)
        chain = self.denoise(cache, pad, state, noise, num_steps)
        return chain[-1], chain

    def denoise(self, cache, pad, state, noise, num_steps: int | None = None, noise_head=None):
        """The chain (K + 1, B, H, A) from ``noise`` by Euler steps. With ``noise_head`` (a
        map from the expert's action features to a per-element std, :class:`NoiseHead`)
        every step adds Gaussian noise, and the chain's per-element log-density over the
        head's active dims (B, H, active), summed over the K transitions, comes back too."""
        k = int(num_steps or self.cfg.num_steps)
        x, chain = noise, [noise]
        logp = None if noise_head is None else torch.zeros_like(noise[..., : noise_head.active])
        for i in range(k):
            if noise_head is None:
                t = torch.full((state.shape[0],), 1.0 + i * (-1.0 / k), device=state.device)
                x = x + (-1.0 / k) * self._step()(cache, pad, state, x, t)
            else:
                mean, std = self._transition(cache, pad, state, x, i, k, noise_head)
                x = mean + std * torch.randn_like(x)
                n = noise_head.active
                logp = logp + normal_log_prob(x[..., :n], mean[..., :n], std[..., :n])
            chain.append(x)
        chain = torch.stack(chain)
        return chain if noise_head is None else (chain, logp)

    def _transition(self, cache, pad, state, x, i: int, k: int, noise_head) -> tuple[torch.Tensor, torch.Tensor]:
        """Flow-Noise's Gaussian step ``i`` of ``k`` from ``x``: the Euler step as its mean
        and the noise head's std (0 on padded dims), both over every dim."""
        dt = -1.0 / k
        t = torch.full((state.shape[0],), 1.0 + i * dt, device=state.device)
        v, feats = self._step()(cache, pad, state, x, t, features=True)
        return x + dt * v, noise_head(feats)

    def chain_log_prob(self, cache, pad, state, chain: torch.Tensor, noise_head: NoiseHead) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-element log-density (B, H, active) of a recorded chain (K + 1, B, H, A),
        summed over its K Gaussian transitions, and the per-element entropy of those
        transitions averaged over the steps (only the dims the noise head makes stochastic)."""
        k, n = chain.shape[0] - 1, noise_head.active
        logp = torch.zeros_like(chain[0][..., :n])
        ent = torch.zeros_like(logp)
        for i in range(k):
            mean, std = self._transition(cache, pad, state, chain[i], i, k, noise_head)
            logp = logp + normal_log_prob(chain[i + 1][..., :n], mean[..., :n], std[..., :n])
            ent = ent + (0.5 + _HALF_LOG_2PI + torch.log(std[..., :n])) / k
        return logp, ent


class NoiseHead(nn.Module):
    """Flow-Noise's learned exploration noise: the expert's action features -> a per-element
    std in [min_std, max_std] (tanh mapped onto log-variance, as piRL's noise network).
    Dims past ``active`` (the padding of a model wider than the env's actions) get none, so
    they follow the ODE and the chain's density is the density of what the env executes."""

    def __init__(self, width: int, action_dim: int, active: int, min_std: float = 0.08, max_std: float = 0.16,
                 hidden: tuple[int, ...] = (128, 64)):  # fmt: skip
        super().__init__()
        if not 0 < min_std <= max_std:
            raise ValueError(f"noise std bounds [{min_std}, {max_std}]: need 0 < min <= max")
        layers: list[nn.Module] = []
        d = width
        for h in hidden:
            layers += [nn.Linear(d, h), nn.Tanh()]
            d = h
        layers.append(nn.Linear(d, active))
        self.net = nn.Sequential(*layers)
        self.action_dim, self.active = int(action_dim), int(active)
        self.lo, self.hi = 2 * math.log(min_std), 2 * math.log(max_std)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        h = self.net(feats.to(next(self.net.parameters()).dtype)).float()
        logvar = self.lo + (torch.tanh(h) + 1) * 0.5 * (self.hi - self.lo)
        std = torch.exp(0.5 * logvar)
        return F.pad(std, (0, self.action_dim - self.active))  # padded dims: no noise


def value_mlp(width: int, hidden: tuple[int, ...] = (256, 128), out: int = 1) -> nn.Sequential:
    """A value head over the expert's state-token features (small last layer, ReLU);
    ``out`` > 1: one value per action of a chunk (action-level credit)."""
    layers: list[nn.Module] = []
    d = width
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    last = nn.Linear(d, out)
    nn.init.normal_(last.weight, std=1e-3)
    nn.init.zeros_(last.bias)
    return nn.Sequential(*layers, last)


def value_out(head_output: torch.Tensor) -> torch.Tensor:
    """A value head's output: (B,) for one value per state, (B, H) for one per action."""
    return head_output.squeeze(-1) if head_output.shape[-1] == 1 else head_output
