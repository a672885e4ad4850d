"""PPO and GRPO for continuous actions.

PPO (Schulman et al. 2017, as CleanRL/ManiSkill implement it): clipped surrogate over the
behaviour policy's recorded log-probs, GAE advantages (computed by
:mod:`rlinf_user.algorithms.ppo.credit`, never across an episode boundary or a gap in a worker's
step sequence; truncated episodes bootstrap from the value of their final observation),
optional value clipping, minibatch epochs, advantage normalisation, an entropy bonus and
an early stop of the epochs past ``target_kl``.

A policy may score a chunk per element (a flow VLA's Flow-Noise log-prob is ``(B, H * A)``):
each element's ratio is clipped on its own against the chunk's advantage (RLinf's
token-level ratio), which keeps a chunk of many dims from saturating one joint ratio.

GRPO (Shao et al. 2024) drops the critic: episodes started from the same reset seed form
a group and score each other. By default a step gets its discounted reward-to-go minus
the group's other episodes' mean at that step (``algo.baseline=step``); with
``baseline=episode`` every step gets its episode's group-normalised return.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from rlinf_user.algorithms.base import Algorithm, NonFiniteLoss, OnPolicyPlan
from rlinf_user.algorithms.ppo.config import GRPOConfig, PPOConfig
from rlinf_user.algorithms.ppo.credit import OnPolicyStore
from rlinf_user.env.spec import Col, EnvSpec, columns_to_torch, index_obs_torch

log = logging.getLogger(__name__)


#: policies whose value head can give one value per action of a chunk (action-level credit)
VALUE_PER_ACTION_POLICIES = ("pi0", "lite_vla", "token_vla")


class PPO(Algorithm):
    config = PPOConfig
    tuning_family = "ppo"
    requires = ("log-prob of recorded samples", "a value function")
    grpo = False  # GRPO: no critic, episodes scored within their reset-seed group

    @classmethod
    def data_plan(cls, algo_cfg) -> OnPolicyPlan:
        return OnPolicyPlan(num_steps=int(algo_cfg.num_steps), sync=str(algo_cfg.mode) == "sync",
                            group_size=int(algo_cfg.group_size) if cls.grpo else 0,
                            per_action_credit=str(algo_cfg.credit) == "action")  # fmt: skip

    @classmethod
    def problems(cls, algo_cfg, policy_cfg, spec=None) -> list[str]:
        out = super().problems(algo_cfg, policy_cfg, spec)
        if algo_cfg.mode not in ("sync", "async"):
            out.append(f"algo.mode={algo_cfg.mode!r}: use sync or async")
        if int(algo_cfg.num_steps) < 1 or int(algo_cfg.update_epochs) < 1 or int(algo_cfg.num_minibatches) < 1:
            out.append("algo.num_steps, algo.update_epochs and algo.num_minibatches must be >= 1")
        credit = str(algo_cfg.credit)
        if credit not in ("chunk", "action"):
            out.append(f"algo.credit={credit!r}: chunk or action")
        elif credit == "action" and (cls.grpo or str(policy_cfg.name) not in VALUE_PER_ACTION_POLICIES):
            out.append(
                f"algo.credit=action needs algo=ppo and a VLA's value head (policy={', '.join(VALUE_PER_ACTION_POLICIES)}); "
                f"this run has algo={algo_cfg.name} policy={policy_cfg.name}"
            )
        return out

    @classmethod
    def run_problems(cls, cfg) -> list[str]:
        name, out = cfg.algo.name, []
        if cfg.demos:
            out.append(f"algo={name} learns on-policy from its own rollouts: demos= is not used (use algo=rlpd or bc)")
        iv = cfg.get("intervention")
        if iv is not None and iv.enabled:
            out.append(f"algo={name}: human interventions need an off-policy algorithm (algo=rlpd, sac)")
        return out

    @classmethod
    def configure(cls, cfg) -> None:
        if str(cfg.algo.credit) == "action" and "value_per_action" in cfg.policy:
            cfg.policy.value_per_action = True  # the policy's value head then has one output per action

    def segment_store(self) -> OnPolicyStore:
        """Where the env workers' segments wait for an update, and get their advantages."""
        c = self.cfg
        return OnPolicyStore(c.gamma, c.gae_lambda, None, c.reward_scale)

    def __init__(self, cfg, policy, spec: EnvSpec, device="cpu"):
        super().__init__(cfg, policy, spec, device)
        self.policy.to(self.device)
        value_ids = {id(q) for q in self.value_parameters()}
        groups = [{"params": [q for q in self.policy.parameters() if id(q) not in value_ids], "lr": float(cfg.lr)}]
        if value_ids:
            vlr = cfg.get("value_lr") if hasattr(cfg, "get") else getattr(cfg, "value_lr", None)
            groups.append({"params": self.value_parameters(), "lr": float(vlr if vlr is not None else cfg.lr)})
        self.opt = torch.optim.Adam(groups, lr=float(cfg.lr), eps=1e-5)

    def value_parameters(self) -> list[torch.nn.Parameter]:
        """The critic's own parameters (its own learning rate, trained alone while warming up)."""
        head = getattr(self.policy, "value_head", None)
        if head is None:
            head = getattr(self.policy, "critic", None)
        return [] if self.grpo or head is None else list(head.parameters())

    def warming_up(self) -> bool:
        return not self.grpo and self.num_updates < int(getattr(self.cfg, "critic_warmup_updates", 0) or 0)

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        """One policy iteration on a prepared batch (columns plus ``advantage`` and
        ``return`` from :class:`rlinf_user.algorithms.ppo.credit.OnPolicyStore`)."""
        cfg = self.cfg
        data = columns_to_torch(batch, self.device)
        obs, sample = data[Col.OBS], data[Col.SAMPLE]
        old_logp, adv = data[Col.LOG_PROB].float(), data[Col.ADVANTAGE].float()
        ret = data[Col.RETURN].float()
        old_v = data[Col.VALUE].float() if Col.VALUE in data else torch.zeros_like(ret)
        n = len(adv)
        # action-level credit: an advantage and a return per action of the row's chunk,
        # weighted by whether that action ran (columns of rlinf_user.algorithms.ppo.credit.gae_actions)
        ran = None
        if adv.dim() == 2:
            steps = data[Col.CHUNK_STEPS].reshape(-1, 1)
            ran = (torch.arange(adv.shape[1], device=self.device)[None] < steps).float()
            old_v = old_v.reshape(ret.shape)
        mb = max(1, n // int(cfg.num_minibatches))
        metrics: dict[str, float] = {}
        clipfracs, approx_kl, epochs = [], 0.0, 0
        warmup = self.warming_up()
        critic = not self.grpo and cfg.vf_coef > 0
        metrics["critic_warmup"] = float(warmup)
        with torch.no_grad():  # 0 when the rows came from exactly this policy (sync rounds)
            kls = []
            for start in range(0, n, mb):  # in minibatches: a VLA's full batch may not fit at once
                idx = torch.arange(start, min(n, start + mb), device=self.device)
                lr = self.policy.log_prob(index_obs_torch(obs, idx), sample[idx])[0] - old_logp[idx]
                kls.append(((lr.exp() - 1) - lr).flatten())
            metrics["start_kl"] = float(torch.cat(kls).mean())
        for _epoch in range(int(cfg.update_epochs)):
            perm = torch.randperm(n, device=self.device)
            for start in range(0, n, mb):
                idx = perm[start : start + mb]
                sub = index_obs_torch(obs, idx)
                v = None
                if not warmup and critic and hasattr(self.policy, "log_prob_and_value"):
                    logp, entropy, v = self.policy.log_prob_and_value(sub, sample[idx])  # one prefix pass
                else:
                    with torch.set_grad_enabled(not warmup):  # critic warm-up: the policy is held, no graph for it
                        logp, entropy = self.policy.log_prob(sub, sample[idx])
                ratio_log = logp - old_logp[idx]  # (mb,) or per element (mb, N): each clipped alone
                ratio = ratio_log.exp()
                with torch.no_grad():
                    approx_kl = float(((ratio - 1) - ratio_log).mean())
                    clipfracs.append(float(((ratio - 1.0).abs() > cfg.clip_coef).float().mean()))
                a = adv[idx]
                if ran is None:
                    if cfg.norm_adv and len(a) > 1:
                        a = (a - a.mean()) / (a.std() + 1e-8)
                    a = a.reshape(-1, *([1] * (ratio.dim() - 1)))
                    pg = torch.max(-a * ratio, -a * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                else:  # each action's log-prob elements against that action's advantage
                    w = ran[idx]
                    if cfg.norm_adv and w.sum() > 1:
                        mean = (a * w).sum() / w.sum()
                        a = (a - mean) / (((a - mean) ** 2 * w).sum() / (w.sum() - 1)).sqrt().add(1e-8)
                    per = ratio.shape[1] // a.shape[1]  # log-prob elements per action
                    a, w = a.repeat_interleave(per, 1), w.repeat_interleave(per, 1)
                    el = torch.max(-a * ratio, -a * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef))
                    pg = (el * w).sum() / w.sum()
                loss = torch.zeros(()) if warmup else pg - cfg.ent_coef * entropy.mean()
                v_loss = torch.zeros(())
                if critic:
                    v = (self.policy.value(sub) if v is None else v).reshape(ret[idx].shape)
                    if cfg.clip_vloss:
                        v_clip = old_v[idx] + (v - old_v[idx]).clamp(-cfg.clip_coef, cfg.clip_coef)
                        err = torch.max((v - ret[idx]) ** 2, (v_clip - ret[idx]) ** 2)
                    else:
                        err = (v - ret[idx]) ** 2
                    v_loss = 0.5 * (err.mean() if ran is None else (err * ran[idx]).sum() / ran[idx].sum())
                    loss = loss + cfg.vf_coef * v_loss
                if not torch.isfinite(loss):
                    raise NonFiniteLoss(
                        f"non-finite PPO loss at update {self.num_updates} (policy loss {pg.item()}, value loss "
                        f"{v_loss.item()}; log-prob range {logp.min().item()}..{logp.max().item()}, recorded log-prob "
                        f"finite {bool(torch.isfinite(old_logp).all())}, advantage mean {adv.mean().item()} std "
                        f"{adv.std().item()}, {n} rows)"
                    )
                if loss.requires_grad:  # (a warm-up without a value loss trains nothing)
                    self.opt.zero_grad(set_to_none=True)
                    self.backward(loss, self.opt)
                    nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                    self.opt.step()
                metrics.update(policy_loss=pg.item(), value_loss=v_loss.item(), entropy=entropy.mean().item())
            epochs += 1
            if cfg.target_kl is not None and not warmup and self.group_mean(approx_kl) > cfg.target_kl:
                break  # (data-parallel replicas stop together: the decision is on their mean KL)
        self.num_updates += 1
        if cfg.norm_obs and hasattr(self.policy, "update_normalizer"):
            self.policy.update_normalizer(self.group_rows(obs[Col.STATE]))
        with torch.no_grad():
            r, ov = (ret, old_v) if ran is None else (ret[ran > 0], old_v[ran > 0])
            var = float(r.var()) if len(r) > 1 else 0.0
            explained = float("nan") if var == 0 or self.grpo else 1.0 - float((r - ov).var()) / var
        metrics.update(approx_kl=approx_kl, clipfrac=float(np.mean(clipfracs)) if clipfracs else 0.0, epochs=float(epochs),
                       explained_variance=explained, rows=float(n), log_std=self.policy.log_std.mean().item() if hasattr(self.policy, "log_std") else 0.0)  # fmt: skip
        return metrics

    @torch.no_grad()
    def values(self, obs_columns: dict[str, np.ndarray]) -> np.ndarray:
        """The critic's values of observation batches given as ``obs/...`` columns (the
        bootstrap of truncated episodes and of segment ends)."""
        if self.grpo:
            return np.zeros(len(obs_columns[Col.state(Col.OBS)]), np.float32)
        obs = columns_to_torch(obs_columns, self.device)[Col.OBS]
        return self.policy.value(obs).float().cpu().numpy()


class GRPO(PPO):
    config = GRPOConfig
    grpo = True

    @classmethod
    def needs(cls, algo_cfg) -> tuple[str, ...]:
        return cls.requires[:1]  # no critic

    @classmethod
    def problems(cls, algo_cfg, policy_cfg, spec=None) -> list[str]:
        out = super().problems(algo_cfg, policy_cfg, spec)
        if algo_cfg.baseline not in ("episode", "step"):
            out.append(f"algo.baseline={algo_cfg.baseline!r}: use episode or step")
        return out

    @classmethod
    def run_problems(cls, cfg) -> list[str]:
        out = super().run_problems(cfg)
        g = int(cfg.algo.group_size)
        sizes = [int(m.get("envs_per_worker", 1)) for m in (cfg.get("fleet") or [])] or [int(cfg.placement.envs_per_worker)]
        if any(g < 1 or n % g for n in sizes):
            out.append(
                f"algo.group_size={g} must divide the envs of every worker (placement.envs_per_worker={sizes[0]}): "
                f"GRPO compares episodes that start from the same reset seed within a worker"
            )
        env = cfg.get("env")
        if env is not None and env.get("reward") == "dense":
            steps = int(env.max_episode_steps)
            gamma = float(cfg.algo.gamma)
            episode = cfg.algo.baseline == "episode" or gamma >= 1.0
            horizon = steps if episode else min(steps, round(1.0 / (1.0 - gamma)))
            if float(env.get("success_bonus") or 0) < horizon:
                log.warning(
                    "algo=grpo scores %s: with a dense reward and success ending the episode, hovering near the "
                    "goal for %d steps can out-score succeeding; set env.success_bonus to at least that many "
                    "times the largest per-step reward (env.success_bonus=%d for rewards in [0, 1])",
                    "whole undiscounted episodes" if episode else f"rewards-to-go discounted by gamma={gamma}",
                    horizon, horizon,
                )  # fmt: skip
        return out

    def segment_store(self) -> OnPolicyStore:
        c = self.cfg
        return OnPolicyStore(c.gamma, c.gae_lambda, int(c.group_size), c.reward_scale, str(c.baseline))
