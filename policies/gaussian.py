"""The tanh-squashed Gaussian policy of the SAC family (``policy=mlp`` / ``policy=cnn``):
an observation encoder and a :class:`~rlinf_user.policies.actor_critic.TanhGaussianActor`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.actor_critic import TanhGaussianActor
from rlinf_user.policies.base import Policy, PolicyOutput
from rlinf_user.policies.encoders import EncoderConfig, build_encoder


@dataclass
class GaussianPolicyConfig(EncoderConfig):
    """``policy=mlp`` (state) or ``policy=cnn`` (cameras): a tanh-Gaussian actor on an encoder."""

    name: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    log_std_min: float = -5.0
    log_std_max: float = 2.0


class GaussianPolicy(Policy):
    """Reparameterised (SAC), BC-trainable. State-dict keys: ``encoder.*``, ``actor.*``."""

    config = GaussianPolicyConfig

    def __init__(self, spec: EnvSpec, encoder, hidden, log_std_min: float = -5.0, log_std_max: float = 2.0):
        super().__init__(spec)
        self.encoder = encoder
        self.hidden = list(hidden)
        self.actor = TanhGaussianActor(encoder.out_dim, spec.action_dim, hidden, log_std_min, log_std_max)

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> GaussianPolicy:
        return cls(spec, build_encoder(policy_cfg, spec), list(policy_cfg.hidden), policy_cfg.log_std_min, policy_cfg.log_std_max)

    @property
    def feature_dim(self) -> int:
        return self.encoder.out_dim

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        feats = self.encoder(obs)
        if deterministic:
            return PolicyOutput(torch.tanh(self.actor(feats)[0]).unsqueeze(1))
        action, log_prob = self.actor.sample(feats)
        return PolicyOutput(action.unsqueeze(1), {Col.LOG_PROB: log_prob})

    def sample_features(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor.sample(feats)

    def log_prob_features(self, feats: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Log-probability of given actions (advantage-weighted actor losses)."""
        return self.actor.log_prob_of(feats, action)

    def fit_features(self, feats: torch.Tensor, action: torch.Tensor, min_std: float | None = 0.0,
                     std_head_only: bool = False) -> torch.Tensor:  # fmt: skip
        """Per-row regression loss toward given actions (advantage-weighted actors), the std
        held at ``min_std`` or more (None: the deterministic action's squared error alone):
        :meth:`~rlinf_user.policies.actor_critic.TanhGaussianActor.fit_loss`."""
        return self.actor.fit_loss(feats, action, min_std=min_std, std_head_only=std_head_only)

    def bc_loss(self, obs: dict[str, Any], target: torch.Tensor) -> torch.Tensor:
        """MSE between the deterministic action and the label, in the tanh space, plus a
        pull of the log-std toward its floor (a confident policy)."""
        mean, log_std = self.actor(self.encoder(obs))
        return F.mse_loss(torch.tanh(mean), target.clamp(-0.999, 0.999)) + 1e-3 * (log_std - self.actor.log_std_min).mean()

    def fit_normalizer(self, states: torch.Tensor) -> None:
        self.encoder.norm.fit(states)
