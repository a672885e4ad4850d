"""IQL (Kostrikov, Nair & Levine 2022): implicit Q-learning, offline then online.

The value ``V(s)`` is an upper expectile of the target critics' ``Q(s, a)`` over the actions
the data holds, so Q-learning never asks the critic about an action nobody took:

* value: ``L_V = E |tau - 1(u < 0)| u^2`` with ``u = min_i Q'_i(s, a) - V(s)``;
* critics: ``Q_i(s, a) -> r + gamma^k V(s_{t+k})`` (the buffer's n-step return and
  discount, 0 after a terminal state), Polyak-averaged targets;
* actor: advantage-weighted regression onto the batch's own actions,
  ``exp(beta * A / std(A)) * fit(a | s)`` with ``A = Q'(s, a) - V(s)``, the weight capped at
  ``max_weight``; ``fit`` is the policy's regression loss toward the action (the
  ``WeightedRegression`` capability: squared error of the deterministic action, the std by
  its own likelihood around it). ``extraction=ddpg_bc`` instead follows the critics'
  action-gradient online, held near the data by ``bc_weight`` x ``fit`` (Park et al. 2024)
  over the rows ``bc_rows`` names, after ``ddpg_bc_warmup_updates`` online updates of AWR.

Offline to online: the warm start (``offline_updates``) runs these same losses on the
demonstrations alone before the first env step, so the first policy that acts is IQL's
offline policy; online, every batch mixes demonstrations and the policy's own transitions
(``demo_ratio``) and the same losses go on. The encoder is the critics' (trained by the
critic loss, seen detached by the actor), as in the SAC family here; image observations
get DrQ random shifts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rlinf_user.algorithms.augment import augment_obs, encoder_cameras
from rlinf_user.algorithms.base import Algorithm, ReplayPlan
from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.actor_critic import CriticEnsemble, mlp


@dataclass
class IQLConfig:
    """Implicit Q-learning from demonstrations and datasets, then online."""

    name: str = "iql"
    gamma: float = 0.95
    n_step: int = 3  # the buffer's n-step returns (per env stream); 1: one-step targets
    tau: float = 0.005  # Polyak rate of the target critics
    batch_size: int = 256
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    value_lr: float = 3e-4
    expectile: float = 0.8  # tau of the value's expectile: 0.5 is the mean, toward 1 the best seen
    # inverse temperature of the advantage weights, in units of the batch's advantage spread
    # (normalize_advantage) or of the reward itself
    beta: float = 2.0
    normalize_advantage: bool = True
    max_weight: float = 20.0
    # how the actor is extracted from the critics: "awr" (IQL's advantage-weighted regression
    # onto the data's actions) | "ddpg_bc" online (the critics' action-gradient plus bc_weight x
    # the regression onto the data's actions, Park et al. 2024), AWR still in the offline warm
    # start, while the critics know only the demonstrations (their action-gradient there
    # took the offline policy from 50% to 2-12% of the pick's validation positions)
    extraction: str = "awr"
    bc_weight: float = 1.0
    # ddpg_bc: which rows the regression term pulls toward: "all" (every row, Park et al.),
    # "demos" (the demonstrated rows only, as the RLPD recipe's TD3+BC term: the policy's own
    # past actions do not hold it back) or "weighted" (every row, by its advantage weight)
    bc_rows: str = "all"
    # ddpg_bc: online updates that still extract by AWR first, while the critics learn the
    # worth of the policy's own actions (their action-gradient is only trusted after)
    ddpg_bc_warmup_updates: int = 0
    # exploration: the actor's std is fitted to the data's spread around its action, which on
    # demonstrations is tiny (online, the policy then repeats its own mistakes without
    # variation: the pick's failures, docs/results.md); the fit keeps it at this much or more
    # (pre-tanh units; 0: no floor). The deterministic action is not affected.
    explore_std: float = 0.5
    num_critics: int = 2
    critic_layer_norm: bool = True
    demo_ratio: float = 0.5  # online: share of every batch from the demonstrations
    offline_updates: int = 5000  # IQL on the demonstrations alone before the first env step
    utd_ratio: float = 1.0  # updates per env step online
    learning_starts: int = 0  # env steps of random actions first (0: the offline policy acts)
    paced: bool = False  # sim env workers wait while the learner is behind utd_ratio
    drq_pad: int = 4
    reward_scale: float = 1.0


class IQL(Algorithm):
    config = IQLConfig
    requires = ("weighted regression onto given actions",)

    @classmethod
    def needs(cls, algo_cfg) -> tuple[str, ...]:
        if str(getattr(algo_cfg, "extraction", "awr")) == "ddpg_bc":
            return (*cls.requires, "reparameterised sampling with log-prob")
        return cls.requires

    @classmethod
    def data_plan(cls, algo_cfg) -> ReplayPlan:
        return ReplayPlan(
            batch_size=int(algo_cfg.batch_size), demo_ratio=float(algo_cfg.demo_ratio),
            utd_ratio=float(algo_cfg.utd_ratio), learning_starts=int(algo_cfg.learning_starts),
            n_step=int(algo_cfg.n_step), gamma=float(algo_cfg.gamma), paced=bool(algo_cfg.paced),
            warm_start_updates=int(algo_cfg.offline_updates), warm_start_lr=float(algo_cfg.actor_lr),
        )  # fmt: skip

    @classmethod
    def problems(cls, algo_cfg, policy_cfg, spec=None) -> list[str]:
        out = super().problems(algo_cfg, policy_cfg, spec)
        if str(algo_cfg.extraction) not in ("awr", "ddpg_bc"):
            out.append(f"algo.extraction={algo_cfg.extraction}: awr or ddpg_bc")
        if str(algo_cfg.bc_rows) not in ("all", "demos", "weighted"):
            out.append(f"algo.bc_rows={algo_cfg.bc_rows}: all, demos or weighted")
        if not 0.5 <= float(algo_cfg.expectile) < 1.0:
            out.append(f"algo.expectile={algo_cfg.expectile}: between 0.5 (the mean) and 1")
        if int(algo_cfg.n_step) < 1 or float(algo_cfg.beta) <= 0:
            out.append("algo.n_step must be >= 1 and algo.beta > 0")
        if str(algo_cfg.bc_rows) == "demos" and float(algo_cfg.demo_ratio) <= 0:
            out.append("algo.bc_rows=demos pulls toward the demonstrated rows of each batch: "
                       "give algo.demo_ratio > 0 (and demos=<dataset>)")  # fmt: skip
        if float(algo_cfg.explore_std) < 0:
            out.append(f"algo.explore_std={algo_cfg.explore_std}: a standard deviation, >= 0")
        if int(algo_cfg.ddpg_bc_warmup_updates) < 0:
            out.append(f"algo.ddpg_bc_warmup_updates={algo_cfg.ddpg_bc_warmup_updates}: a count of updates, >= 0")
        return out

    @classmethod
    def run_problems(cls, cfg) -> list[str]:
        if int(cfg.algo.offline_updates) > 0 and not cfg.demos:
            return [f"algo={cfg.algo.name} learns offline from demonstrations first (algo.offline_updates="
                    f"{cfg.algo.offline_updates}): give demos=<dataset>, or algo.offline_updates=0"]  # fmt: skip
        return []

    def __init__(self, cfg, policy, spec: EnvSpec, device="cpu"):
        super().__init__(cfg, policy, spec, device)
        feat = policy.encoder.out_dim
        hidden = list(getattr(policy, "hidden", None) or [256, 256])
        self.critic = CriticEnsemble(feat, spec.action_dim, hidden, int(cfg.num_critics), layer_norm=bool(cfg.critic_layer_norm))
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = mlp(feat, hidden, 1, layer_norm=bool(cfg.critic_layer_norm))
        self.augmented = encoder_cameras(policy.encoder)  # the frames DrQ shifts
        for m in (policy, self.critic, self.target_critic, self.value):
            m.to(self.device)
        self.critic_opt = torch.optim.Adam([*self.critic.parameters(), *policy.encoder.parameters()], lr=cfg.critic_lr)
        self.value_opt = torch.optim.Adam(self.value.parameters(), lr=cfg.value_lr)
        actor_params = [p for n, p in policy.named_parameters() if not n.startswith("encoder.")]
        self.actor_opt = torch.optim.Adam(actor_params, lr=cfg.actor_lr)
        self.offline = False  # in the warm start: the actor is extracted by AWR whatever `extraction` says

    def warm_start(self, batches) -> float:
        """The offline phase: IQL's own losses on demonstration batches. They are not counted
        in ``num_updates``, which meters the online updates against env steps (UTD)."""
        loss, before = float("nan"), self.num_updates
        self.offline = True
        try:
            for batch in batches:
                loss = self.update(batch)["critic_loss"]
        finally:
            self.offline = False
        self.offline_updates_done = self.num_updates - before
        self.num_updates = before
        return loss

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        cfg = self.cfg
        obs = augment_obs(batch[Col.OBS], cfg.drq_pad, self.augmented)
        next_obs = augment_obs(batch[Col.NEXT_OBS], cfg.drq_pad, self.augmented)
        action = batch[Col.ACTION]
        feats = self.policy.encoder(obs)
        with torch.no_grad():
            next_feats = self.policy.encoder(next_obs)
            q_target = self.target_critic(feats.detach(), action).min(dim=0).values
        # value: an upper expectile of the target critics' Q over the data's actions
        v = self.value(feats.detach()).squeeze(-1)
        u = q_target - v
        value_loss = (torch.abs(cfg.expectile - (u < 0).float()) * u.square()).mean()
        self.value_opt.zero_grad(set_to_none=True)
        self.backward(value_loss, self.value_opt)
        self.value_opt.step()
        # critics: r + gamma^k V(s'), never a max over actions
        reward = batch[Col.REWARD] * cfg.reward_scale
        discount = batch[Col.DISCOUNT] if Col.DISCOUNT in batch else cfg.gamma * (1.0 - batch[Col.TERMINATED])
        with torch.no_grad():
            target = reward + discount * self.value(next_feats).squeeze(-1)
        q = self.critic(feats, action)
        critic_loss = F.mse_loss(q, target.unsqueeze(0).expand_as(q)) * q.shape[0]
        self.critic_opt.zero_grad(set_to_none=True)
        self.backward(critic_loss, self.critic_opt)
        self.critic_opt.step()
        # actor: advantage-weighted regression onto the batch's actions
        with torch.no_grad():
            adv = q_target - self.value(feats.detach()).squeeze(-1)
            scale = adv.std().clamp_min(1e-6) if cfg.normalize_advantage else 1.0
            w = torch.exp(cfg.beta * adv / scale).clamp(max=cfg.max_weight)
        fit = self.policy.fit_features(feats.detach(), action, min_std=float(cfg.explore_std))
        if cfg.extraction == "ddpg_bc" and not self.offline and self.num_updates >= cfg.ddpg_bc_warmup_updates:
            # DDPG+BC extraction from IQL's critics (Park et al. 2024): the actor climbs the
            # critics' action-gradient, Q over its batch mean magnitude, held near the data by
            # the regression term (a floor of 1 on the magnitude, as the SAC family's TD3+BC
            # term has, measured no better on the pick: docs/results.md)
            pi, _ = self.policy.sample_features(feats.detach())
            q_pi = self.critic(feats.detach(), pi).mean(dim=0)
            actor_loss = -(q_pi / q_pi.abs().mean().detach().clamp_min(1e-3)).mean() + cfg.bc_weight * self._bc(fit, w, batch)
        else:
            actor_loss = (w * fit).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        self.backward(actor_loss, self.actor_opt)
        self.actor_opt.step()
        with torch.no_grad():
            for p, tp in zip(self.critic.parameters(), self.target_critic.parameters()):
                tp.lerp_(p, cfg.tau)
        self.num_updates += 1
        return {
            "critic_loss": critic_loss.item() / q.shape[0], "value_loss": value_loss.item(),
            "actor_loss": actor_loss.item(), "q_mean": q.mean().item(), "v_mean": v.mean().item(),
            "advantage_mean": adv.mean().item(), "weight_max": w.max().item(),
        }  # fmt: skip

    def _bc(self, fit: torch.Tensor, w: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """The regression term of DDPG+BC over the rows ``bc_rows`` names."""
        if self.cfg.bc_rows == "weighted":
            return (w * fit).mean()
        if self.cfg.bc_rows == "demos":
            demo = batch.get(Col.FROM_DEMOS)
            rows = demo > 0 if demo is not None else None
            return fit[rows].mean() if rows is not None and bool(rows.any()) else fit.sum() * 0.0
        return fit.mean()

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(), "value_net": self.value.state_dict(),
            "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
            "value_opt": self.value_opt.state_dict(), "num_updates": self.num_updates,
        }  # fmt: skip

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        self.value.load_state_dict(state["value_net"])
        for name in ("actor_opt", "critic_opt", "value_opt"):
            getattr(self, name).load_state_dict(state[name])
        self.num_updates = int(state["num_updates"])
