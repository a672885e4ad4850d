"""A flow-matching policy (``policy=flow``) trainable by SAC (``algo=sac_flow``) and by BC.

Actions come from integrating a velocity field over ``K`` Euler steps from Gaussian noise
and squashing with tanh. Following SAC-Flow (Zhang et al., arXiv 2509.25756):

* **Flow-G velocity**: the K-step rollout is a residual recurrence, so the velocity is
  gated like a GRU to keep its gradients stable:
  ``v = z * (c - a_k)`` with gate ``z = sigmoid(G([f, a_k, emb(t_k)]))`` (initialised open,
  bias 5) and candidate ``c = C([f, a_k, emb(t_k)])``.
* **Noise-augmented rollout**: ``a_0 ~ N(0, I)``; each step is a Gaussian transition
  ``a_{k+1} = a_k + dt * v + sigma(s) * eps_k`` with a learned, state-dependent ``sigma``.
  The chain's log-probability is ``log N(a_0; 0, I) + sum_k log N(a_{k+1}; mu_k, sigma^2)``
  plus the tanh correction of the final squash; every step is reparameterised, so SAC's
  actor loss differentiates through the whole rollout.
* Deterministic actions (evaluation) integrate from ``a_0 = 0`` without noise.

Behaviour cloning uses the flow-matching loss on the pre-squash action: for
``x_1 = atanh(target)``, ``x_0 ~ N(0, I)``, ``t ~ U(0, 1)``, the velocity at
``(1 - t) x_0 + t x_1`` regresses onto ``x_1 - x_0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.actor_critic import mlp
from rlinf_user.policies.base import Policy, PolicyOutput
from rlinf_user.policies.encoders import EncoderConfig, build_encoder

LOG_2PI = math.log(2 * math.pi)


class TimeEmbedding(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.register_buffer("freqs", torch.exp(torch.linspace(0.0, math.log(100.0), dim // 2)))
        self.proj = nn.Sequential(nn.Linear(dim, 32), nn.SiLU(), nn.Linear(32, 16))
        self.out_dim = 16

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        x = t[:, None] * self.freqs[None]
        return self.proj(torch.cat([x.sin(), x.cos()], dim=-1))


class GatedVelocity(nn.Module):
    """Flow-G: ``v = z * (c - a)``, ``z = sigmoid(G(x))`` (open at init), ``c = C(x)``."""

    def __init__(self, feature_dim: int, action_dim: int, hidden):
        super().__init__()
        self.time = TimeEmbedding()
        d = feature_dim + action_dim + self.time.out_dim
        self.gate = mlp(d, hidden[:1], action_dim)
        self.candidate = mlp(d, hidden, action_dim)
        nn.init.zeros_(self.gate[-1].weight)
        nn.init.constant_(self.gate[-1].bias, 5.0)

    def forward(self, feats: torch.Tensor, a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = torch.cat([feats, a, self.time(t)], dim=-1)
        return torch.sigmoid(self.gate(x)) * (self.candidate(x) - a)


@dataclass
class FlowPolicyConfig(EncoderConfig):
    """``policy=flow``: a few Euler steps of a learned velocity field (SAC-Flow)."""

    name: str = "flow"
    encoder: str | None = "mlp"
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    flow_steps: int = 4  # Euler steps of the velocity field (K)
    log_std_min: float = -5.0
    log_std_max: float = 2.0


class FlowPolicy(Policy):
    """Reparameterised with log-prob (SAC-Flow), BC-trainable (flow matching)."""

    config = FlowPolicyConfig

    def __init__(self, spec: EnvSpec, encoder, hidden, steps: int = 4, log_std_min: float = -5.0, log_std_max: float = 2.0):
        super().__init__(spec)
        if steps < 1:
            raise ValueError(f"policy.flow_steps={steps}: a flow needs at least one step")
        self.encoder = encoder
        self.hidden = list(hidden)
        self.steps = int(steps)
        self.velocity = GatedVelocity(encoder.out_dim, spec.action_dim, self.hidden)
        self.log_sigma = mlp(encoder.out_dim, self.hidden[:1], spec.action_dim)
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> FlowPolicy:
        return cls(spec, build_encoder(policy_cfg, spec), list(policy_cfg.hidden), int(policy_cfg.flow_steps),
                   policy_cfg.log_std_min, policy_cfg.log_std_max)  # fmt: skip

    def sigma(self, feats: torch.Tensor) -> torch.Tensor:
        raw = torch.tanh(self.log_sigma(feats))
        return (self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (raw + 1)).exp()

    def rollout(self, feats: torch.Tensor, noise: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Squashed actions and the chain's log-probability (zeros without noise)."""
        b, dim = feats.shape[0], self.spec.action_dim
        dt = 1.0 / self.steps
        if not noise:
            a = feats.new_zeros(b, dim)
            for k in range(self.steps):
                a = a + dt * self.velocity(feats, a, feats.new_full((b,), k * dt))
            return torch.tanh(a), feats.new_zeros(b)
        sigma = self.sigma(feats)
        a = torch.randn(b, dim, device=feats.device)
        log_prob = (-0.5 * a.pow(2) - 0.5 * LOG_2PI).sum(-1)
        for k in range(self.steps):
            eps = torch.randn_like(a)
            a = a + dt * self.velocity(feats, a, feats.new_full((b,), k * dt)) + sigma * eps
            log_prob = log_prob + (-0.5 * eps.pow(2) - sigma.log() - 0.5 * LOG_2PI).sum(-1)
        y = torch.tanh(a)
        log_prob = log_prob - torch.log(1 - y.pow(2) + 1e-6).sum(-1)
        return y, log_prob

    def sample_features(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rollout(feats, noise=True)

    @property
    def noise_shape(self) -> tuple[int, int]:
        """One row's initial noise: ``(1, action_dim)`` (steered by ``algo=dsrl``)."""
        return (1, self.spec.action_dim)

    @torch.no_grad()
    def act_from_noise(self, obs: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
        """The deterministic flow from the given initial noise ``(B, 1, action_dim)``."""
        feats = self.encoder(obs)
        a, dt = noise[:, 0].to(feats.dtype), 1.0 / self.steps
        for k in range(self.steps):
            a = a + dt * self.velocity(feats, a, feats.new_full((a.shape[0],), k * dt))
        return torch.tanh(a).unsqueeze(1)

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        action, log_prob = self.rollout(self.encoder(obs), noise=not deterministic)
        return PolicyOutput(action.unsqueeze(1), {} if deterministic else {Col.LOG_PROB: log_prob})

    def bc_loss(self, obs: dict[str, Any], target: torch.Tensor) -> torch.Tensor:
        feats = self.encoder(obs)
        x1 = torch.atanh(target.clamp(-0.999, 0.999))
        x0 = torch.randn_like(x1)
        t = torch.rand(x1.shape[0], device=x1.device)
        xt = (1 - t[:, None]) * x0 + t[:, None] * x1
        return (self.velocity(feats, xt, t) - (x1 - x0)).pow(2).mean()

    def fit_normalizer(self, states: torch.Tensor) -> None:
        self.encoder.norm.fit(states)
