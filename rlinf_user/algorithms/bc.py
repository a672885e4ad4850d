"""Behaviour cloning of any BC-trainable policy on (observation, target action) pairs:
HG-DAgger's learner, the warm start of RL (``algo.bc_warmup_updates``) and, as
``algo=bc``, a learner that trains on the demonstrations alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlinf_user.algorithms.base import Algorithm, ReplayPlan
from rlinf_user.env.spec import Col, EnvSpec


@dataclass
class BCConfig:
    """Behaviour cloning on the demonstrations (``demos=``), for any policy that can be
    trained by BC; env workers only evaluate it."""

    name: str = "bc"
    lr: float = 1e-3
    weight_decay: float = 1e-5
    batch_size: int = 256
    updates_per_step: float = 1.0  # updates per env step of evaluation (bounds the pace)


class BC(Algorithm):
    config = BCConfig
    requires = ("behaviour cloning",)

    @classmethod
    def data_plan(cls, algo_cfg) -> ReplayPlan:
        return ReplayPlan(batch_size=int(algo_cfg.batch_size), demo_ratio=1.0, utd_ratio=float(algo_cfg.updates_per_step))

    @classmethod
    def run_problems(cls, cfg) -> list[str]:
        hg = cfg.get("hg_dagger")
        if not cfg.demos and not (hg is not None and hg.get("synthetic_human")):
            return [f"algo={cfg.algo.name} trains on demonstrations: give demos=<dataset>"]
        return []

    def __init__(self, cfg, policy, spec: EnvSpec, device="cpu"):
        super().__init__(cfg if cfg is not None else BCConfig(), policy, spec, device)
        self.policy.to(self.device)
        self.opt = torch.optim.AdamW(policy.parameters(), lr=float(self.cfg.lr), weight_decay=float(self.cfg.weight_decay))

    @classmethod
    def for_policy(cls, policy, lr: float = 1e-3, weight_decay: float = 1e-5) -> BC:
        """A BC trainer on an existing policy (warm starts, HG-DAgger)."""
        return cls(BCConfig(lr=lr, weight_decay=weight_decay), policy, policy.spec, next(policy.parameters()).device)

    def step(self, obs: dict[str, Any], target: torch.Tensor, valid: torch.Tensor | None = None) -> float:
        """One update toward ``target`` actions ``(B, A)``, or chunks ``(B, H, A)`` with the
        steps that carry a label marked in ``valid`` ``(B, H)`` (chunk policies)."""
        loss = self.policy.bc_loss(obs, target) if valid is None else self.policy.bc_loss(obs, target, valid)
        self.opt.zero_grad(set_to_none=True)
        self.backward(loss, self.opt)
        self.opt.step()
        self.num_updates += 1
        return float(loss.detach())

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        return {"bc_loss": self.step(batch[Col.OBS], batch[Col.ACTION])}
