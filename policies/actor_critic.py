"""Tanh-Gaussian actor and critic ensembles for the SAC family."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rlinf_user.policies.layers import BatchRenorm, EnsembleLinear


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, layer_norm: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers.append(nn.Linear(d, h))
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(nn.ReLU())
        d = h
    layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


class TanhGaussianActor(nn.Module):
    """Maps encoder features to a tanh-squashed Gaussian over actions in [-1, 1]."""

    def __init__(
        self,
        feature_dim: int,
        action_dim: int,
        hidden: Sequence[int],
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
    ):
        super().__init__()
        self.net = mlp(feature_dim, hidden, 2 * action_dim)
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, feats: torch.Tensor):
        mean, log_std = self.net(feats).chunk(2, dim=-1)
        return mean, self._squash(log_std)

    def _squash(self, raw: torch.Tensor) -> torch.Tensor:
        return self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (torch.tanh(raw) + 1)

    def _std_by_head(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward``'s mean and log-std, the log-std's gradient kept to the last layer's
        std rows: a loss on the std alone then moves neither the mean nor the layers it shares."""
        hidden = self.net[:-1](feats)
        last, half = self.net[-1], self.net[-1].out_features // 2
        mean = F.linear(hidden, last.weight[:half], last.bias[:half])
        raw = F.linear(hidden.detach(), last.weight[half:], last.bias[half:])
        return mean, self._squash(raw)

    def sample(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample and its log-probability (with the tanh correction)."""
        mean, log_std = self(feats)
        std = log_std.exp()
        noise = torch.randn_like(mean)
        pre = mean + std * noise
        action = torch.tanh(pre)
        log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * torch.log(torch.tensor(2 * torch.pi))).sum(-1)
        log_prob = log_prob - (2 * (torch.log(torch.tensor(2.0)) - pre - F.softplus(-2 * pre))).sum(-1)
        return action, log_prob

    def log_prob_of(self, feats: torch.Tensor, action: torch.Tensor, bound: float = 0.999) -> torch.Tensor:
        """Log-probability of given actions (a dataset's, say); actions at the edge of [-1, 1]
        (a gripper's +-1) are read at +-``bound``, where the tanh is still invertible."""
        mean, log_std = self(feats)
        pre = torch.atanh(action.clamp(-bound, bound))
        noise = (pre - mean) / log_std.exp()
        log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * torch.log(torch.tensor(2 * torch.pi))).sum(-1)
        return log_prob - (2 * (torch.log(torch.tensor(2.0)) - pre - F.softplus(-2 * pre))).sum(-1)

    def fit_loss(self, feats: torch.Tensor, action: torch.Tensor, bound: float = 0.999, min_std: float | None = 0.0,
                 std_head_only: bool = False) -> torch.Tensor:  # fmt: skip
        """Per-row loss toward given actions: the squared error of the deterministic action
        ``tanh(mean)`` (what evaluation takes), plus the Gaussian negative log-likelihood of
        the standard deviation around that action, the mean held fixed (what exploration
        samples). A likelihood that trains both lets the std grow on the rows the mean fits
        worst instead of fitting them: on 20 pick demonstrations it left the deterministic
        action 5-100x further from the demonstrated one than the squared error does.
        ``min_std``: the likelihood's optimum is ``std^2 = residual^2 + min_std^2`` (an
        exploration floor that leaves the deterministic action alone). ``min_std=None``: the
        squared error alone, the std left to the loss's other terms (the likelihood's gradient
        in the std, through the layers the mean shares, moves the mean of a policy whose std
        sits far below its residual, as a BC warm start leaves it). ``std_head_only``: the
        likelihood's gradient reaches the last layer's std rows alone (:meth:`_std_by_head`),
        so a std far below its residual rises to it without moving the mean."""
        mean, log_std = self._std_by_head(feats) if std_head_only else self(feats)
        target = action.clamp(-bound, bound)
        det = torch.tanh(mean)
        if min_std is None:
            return (det - target).square().sum(-1)
        spread2 = ((target - det.detach()).square() + float(min_std) ** 2) / (2 * log_std).exp()
        return ((det - target).square() + 0.5 * spread2 + log_std).sum(-1)

    @torch.no_grad()
    def act(self, feats: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return torch.tanh(self(feats)[0])
        return self.sample(feats)[0]


class CriticEnsemble(nn.Module):
    """``num_critics`` Q-functions evaluated in one batched pass; returns ``(E, B)``."""

    def __init__(
        self,
        feature_dim: int,
        action_dim: int,
        hidden: Sequence[int],
        num_critics: int = 2,
        layer_norm: bool = False,
        batch_norm: bool = False,
    ):
        super().__init__()
        self.num_critics = num_critics
        layers: list[nn.Module] = []
        d = feature_dim + action_dim
        if batch_norm:
            layers.append(BatchRenorm(d, leading=()))
        for h in hidden:
            layers.append(EnsembleLinear(num_critics, d, h))
            if batch_norm:
                layers.append(BatchRenorm(h, leading=(num_critics,)))
            elif layer_norm:
                layers.append(nn.LayerNorm(h, elementwise_affine=False))
            layers.append(nn.ReLU())
            d = h
        layers.append(EnsembleLinear(num_critics, d, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, feats: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([feats, action], dim=-1)).squeeze(-1)
