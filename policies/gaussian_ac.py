"""A Gaussian actor-critic for on-policy learning (``policy=gaussian_ac``; PPO, GRPO).

The actor's mean comes from an MLP over the encoder's features, its log-std is a learned
state-independent vector (CleanRL's and ManiSkill's PPO baselines); the executed action is
the sample clipped to the action box, and the unclipped ``sample`` travels with the
transition so the learner scores exactly what was drawn. The critic is a separate MLP over
the same features. Orthogonal initialisation as in those baselines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.base import Policy, PolicyOutput
from rlinf_user.policies.encoders import EncoderConfig, build_encoder


def _ortho(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def tanh_mlp(in_dim: int, hidden, out_dim: int, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [_ortho(nn.Linear(d, h), math.sqrt(2)), nn.Tanh()]
        d = h
    layers.append(_ortho(nn.Linear(d, out_dim), out_gain))
    return nn.Sequential(*layers)


@dataclass
class GaussianACPolicyConfig(EncoderConfig):
    """``policy=gaussian_ac``: PPO's Gaussian actor with a value head."""

    name: str = "gaussian_ac"
    encoder: str | None = "mlp"
    hidden: list[int] = field(default_factory=lambda: [256, 256, 256])
    init_log_std: float = -0.5  # the learned state-independent log-std starts here


class GaussianActorCritic(Policy):
    """Scores recorded samples, has a value function, BC-trainable."""

    config = GaussianACPolicyConfig

    def __init__(self, spec: EnvSpec, encoder, hidden, init_log_std: float = -0.5, critic: bool = True):
        super().__init__(spec)
        self.encoder = encoder
        self.mean = tanh_mlp(encoder.out_dim, hidden, spec.action_dim, 0.01 * math.sqrt(2))
        self.log_std = nn.Parameter(torch.full((spec.action_dim,), float(init_log_std)))
        self.critic = tanh_mlp(encoder.out_dim, hidden, 1, 1.0) if critic else None

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> GaussianActorCritic:
        return cls(spec, build_encoder(policy_cfg, spec), list(policy_cfg.hidden), float(policy_cfg.init_log_std))

    def _dist(self, feats: torch.Tensor) -> torch.distributions.Normal:
        mean = self.mean(feats)
        return torch.distributions.Normal(mean, self.log_std.clamp(-5.0, 2.0).exp().expand_as(mean))

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        feats = self.encoder(obs)
        dist = self._dist(feats)
        sample = dist.mean if deterministic else dist.sample()
        extras = {Col.SAMPLE: sample.unsqueeze(1), Col.LOG_PROB: dist.log_prob(sample).sum(-1)}
        if self.critic is not None:
            extras[Col.VALUE] = self.critic(feats).squeeze(-1)
        return PolicyOutput(sample.clamp(-1.0, 1.0).unsqueeze(1), extras)

    def log_prob(self, obs: dict[str, Any], sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob of the recorded ``(B, H, A)`` (or ``(B, A)``) samples and the entropy."""
        dist = self._dist(self.encoder(obs))
        sample = sample[:, 0] if sample.dim() == 3 else sample
        return dist.log_prob(sample).sum(-1), dist.entropy().sum(-1)

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        if self.critic is None:
            raise RuntimeError("this actor-critic was built without a critic")
        return self.critic(self.encoder(obs)).squeeze(-1)

    def bc_loss(self, obs: dict[str, Any], target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.mean(self.encoder(obs)), target)

    def fit_normalizer(self, states: torch.Tensor) -> None:
        self.encoder.norm.fit(states)

    def update_normalizer(self, states: torch.Tensor) -> None:
        """Merge states into the encoder's running statistics (``algo.norm_obs``)."""
        self.encoder.norm.update(states)
