"""Behaviour cloning of the deterministic policy (the same ``PolicyModule`` SAC acts with),
on (observation, human action) pairs: HG-DAgger's learner and a warm start for RL."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlinf_user.algorithms.sac import PolicyModule


def bc_loss(policy: PolicyModule, obs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """MSE between the policy's deterministic action and the label, in the tanh space,
    plus a pull of the Gaussian's log-std towards its floor (a confident policy)."""
    mean, log_std = policy.actor(policy.encoder(obs))
    action = torch.tanh(mean)
    return F.mse_loss(action, target) + 1e-3 * (log_std - policy.actor.log_std_min).mean()


class BC:
    def __init__(self, policy: PolicyModule, lr: float = 1e-3, weight_decay: float = 1e-5):
        self.policy = policy
        self.opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=weight_decay)
        self.num_updates = 0

    def update(self, obs: dict[str, torch.Tensor], target: torch.Tensor) -> float:
        loss = bc_loss(self.policy, obs, target.clamp(-0.999, 0.999))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.num_updates += 1
        return float(loss.detach())
