"""SAC with critic ensembles, high update-to-data, RLPD demo mixing, CrossQ and SAC-Flow.

One class covers the family; the config picks the variant:

* ``sac``: twin (or ensemble) critics with Polyak target networks.
* ``rlpd``: SAC + LayerNorm critics + 50/50 online/demo batches (``demo_ratio``) and a
  larger ensemble with a random min-subset (REDQ), as in Ball et al. 2023.
* ``crossq``: batch-renormalised critics, no target network; current and next
  state-actions pass through the critic in one joint batch (Bhatt et al. 2024).
* ``sac_flow``: the same losses over a flow policy, whose reparameterised sample and
  log-prob come from its velocity network (see :mod:`rlinf_user.policies.flow`).

Any policy with reparameterised sampling (:class:`rlinf_user.policies.base.Reparameterised`)
works: the critics read its encoder's features. Images are augmented with DrQ random
shifts. With ``shared_encoder`` (DrQ's default) the encoder is trained by the critic loss
and seen detached by the actor; without it the critics train a copy of their own and the
actor's encoder is trained by the actor loss (and the BC warm start), so TD learning
cannot rewrite the features a cloned actor relies on.
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from rlinf_user.algorithms.augment import augment_obs, encoder_cameras
from rlinf_user.algorithms.base import Algorithm, ReplayPlan
from rlinf_user.algorithms.sac_config import CrossQConfig, RLPDConfig, SACConfig, SACFlowConfig
from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.actor_critic import CriticEnsemble

log = logging.getLogger(__name__)


def metric_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """An update's metrics as floats: the tensors among them read back together."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    values = torch.stack([metrics[k].detach().float().reshape(()) for k in keys]).tolist() if keys else []
    return {**{k: float(v) for k, v in metrics.items()}, **dict(zip(keys, values))}


def steady_overrides(algo_cfg) -> tuple[tuple[str, int], ...]:
    """The critic warm-up skipped (its updates leave the actor idle: half the cost of the
    pick's later ones, and a profile timing them predicted twice the updates/s of a run)."""
    return (("critic_warmup_updates", 0),) if int(getattr(algo_cfg, "critic_warmup_updates", 0) or 0) > 0 else ()


class SAC(Algorithm):
    config = SACConfig
    tuning_family = "sac"
    resumes_from = ("sac", "rlpd", "crossq")  # the same networks; only the recipe differs
    requires = ("reparameterised sampling with log-prob",)
    trains_flow: ClassVar[bool] = False  # SAC-Flow: the policy is a flow (policy=flow)
    # the column the critics score and the actor samples: the env's action, or (DSRL) the
    # noise a steered flow policy acted from
    action_key: ClassVar[str] = Col.ACTION
    capturable_update: ClassVar[bool] = True  # update_on_device reads nothing back to the host

    @staticmethod
    def actor_width(policy, spec: EnvSpec) -> int:
        """Width of what the actor samples (the critics' action input)."""
        return int(getattr(policy, "noise_dim", None) or spec.action_dim)

    @classmethod
    def data_plan(cls, algo_cfg) -> ReplayPlan:
        return ReplayPlan(
            batch_size=int(algo_cfg.batch_size), demo_ratio=float(algo_cfg.demo_ratio), utd_ratio=float(algo_cfg.utd_ratio),
            learning_starts=int(algo_cfg.learning_starts), n_step=int(algo_cfg.n_step), gamma=float(algo_cfg.gamma),
            paced=bool(algo_cfg.paced), warm_start_updates=int(algo_cfg.bc_warmup_updates or 0),
            warm_start_lr=float(algo_cfg.actor_lr), warm_start_feature_noise=float(algo_cfg.bc_feature_noise or 0.0),
            steady_overrides=steady_overrides(algo_cfg),
        )  # fmt: skip

    @classmethod
    def run_problems(cls, cfg) -> list[str]:
        if float(cfg.algo.bc_weight or 0.0) > 0 and float(cfg.algo.demo_ratio) <= 0:
            return [f"algo.bc_weight={cfg.algo.bc_weight} pulls the actor towards the demo rows of each batch, "
                    "but algo.demo_ratio=0 draws none: set algo.demo_ratio (e.g. 0.5) and demos=<path>"]  # fmt: skip
        return []

    @classmethod
    def problems(cls, algo_cfg, policy_cfg, spec=None) -> list[str]:
        out = super().problems(algo_cfg, policy_cfg, spec)
        if cls.trains_flow and str(policy_cfg.name) != "flow":
            out.append(f"algo={algo_cfg.name} trains a flow policy: set policy=flow (policy={policy_cfg.name})")
        if int(algo_cfg.get("n_step", 1)) < 1:
            out.append(f"algo.n_step={algo_cfg.n_step}: n-step returns need n >= 1 (1: one-step targets)")
        if int(algo_cfg.get("critic_warmup_updates", 0)) < 0:
            out.append(f"algo.critic_warmup_updates={algo_cfg.critic_warmup_updates} must be >= 0")
        if float(algo_cfg.get("bc_feature_noise") or 0.0) < 0:
            out.append(f"algo.bc_feature_noise={algo_cfg.bc_feature_noise}: a multiple of the features' std, >= 0")
        if not cls.trains_flow and str(policy_cfg.name) == "flow":
            out.append(f"policy=flow is trained by SAC through algo=sac_flow (algo={algo_cfg.name})")
        final_t = algo_cfg.get("final_temperature")
        if final_t is not None:
            if bool(algo_cfg.get("autotune_temperature", True)):
                out.append(f"algo.final_temperature={final_t} schedules a fixed temperature: set "
                           "algo.autotune_temperature=false (tuning would move it on its own)")  # fmt: skip
            elif not float(final_t) > 0 or int(algo_cfg.get("temperature_decay_updates", 0)) <= 0:
                out.append(f"algo.final_temperature={final_t} needs a value > 0 and "
                           "algo.temperature_decay_updates > 0 (the updates it takes to get there)")  # fmt: skip
        final_lr = algo_cfg.get("final_actor_lr")
        if final_lr is not None and (not float(final_lr) > 0 or int(algo_cfg.get("actor_lr_decay_updates", 0)) <= 0):
            out.append(f"algo.final_actor_lr={final_lr} needs a value > 0 and algo.actor_lr_decay_updates > 0 "
                       "(the updates it takes to get there)")  # fmt: skip
        actor_loss = str(algo_cfg.get("actor_loss", "reparam"))
        if actor_loss not in ("reparam", "awac"):
            out.append(f"algo.actor_loss={actor_loss}: expected reparam (SAC's) or awac (advantage-weighted)")
        elif actor_loss == "awac" and str(policy_cfg.name) == "flow":
            out.append("algo.actor_loss=awac needs the log-probability of given actions: a Gaussian policy (mlp, cnn)")
        elif actor_loss == "awac" and float(algo_cfg.get("awac_beta", 1.0)) <= 0:
            out.append(f"algo.awac_beta={algo_cfg.awac_beta} must be > 0")
        elif algo_cfg.get("awac_min_std") is not None and float(algo_cfg.awac_min_std) < 0:
            out.append(f"algo.awac_min_std={algo_cfg.awac_min_std} must be >= 0 (or null: the std left to the entropy term)")
        return out

    def __init__(self, algo_cfg, policy, spec: EnvSpec, device="cpu"):
        super().__init__(algo_cfg, policy, spec, device)
        self.crossq = bool(algo_cfg.batch_norm)
        hidden = list(getattr(policy, "hidden", None) or [256, 256])  # critics as wide as the actor
        width = self.actor_width(policy, spec)
        self.critic = CriticEnsemble(
            policy.encoder.out_dim,
            width,
            hidden,
            algo_cfg.num_critics,
            layer_norm=algo_cfg.critic_layer_norm,
            batch_norm=self.crossq,
        )
        self.target_critic = None if self.crossq else copy.deepcopy(self.critic).requires_grad_(False)
        self.shared_encoder = bool(getattr(algo_cfg, "shared_encoder", True))
        # the critics' encoder: the policy's own (shared) or a copy trained by the critic loss alone
        self.critic_encoder = policy.encoder if self.shared_encoder else copy.deepcopy(policy.encoder)
        self.target_encoder = None if self.crossq else copy.deepcopy(self.critic_encoder).requires_grad_(False)
        self.augmented = encoder_cameras(policy.encoder, self.critic_encoder)  # the frames DrQ shifts
        self.log_alpha = nn.Parameter(torch.tensor(float(algo_cfg.init_temperature)).log())
        self.target_entropy = (
            algo_cfg.target_entropy if algo_cfg.target_entropy is not None else -width / 2.0
        )
        betas = (0.5, 0.999) if self.crossq else (0.9, 0.999)
        self.critic_opt = torch.optim.Adam(
            list(self.critic.parameters()) + list(self.critic_encoder.parameters()), lr=algo_cfg.critic_lr, betas=betas
        )
        actor_params = [p for n, p in policy.named_parameters() if not (self.shared_encoder and n.startswith("encoder."))]
        self.actor_opt = torch.optim.Adam(actor_params, lr=algo_cfg.actor_lr, betas=betas)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=algo_cfg.alpha_lr, betas=betas)
        ema = float(getattr(algo_cfg, "policy_ema", 0.0) or 0.0)
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"algo.policy_ema={ema}: a moving-average rate in [0, 1) (0: off)")
        # never in a loss or an optimiser; its parameters keep the actor's requires_grad
        # flags, which tell the weight publisher what changes between versions
        self.policy_avg = copy.deepcopy(policy) if ema > 0 else None
        self._modules = {"policy": policy, "critic": self.critic, "target_critic": self.target_critic,
                         "target_encoder": self.target_encoder,
                         "critic_encoder": None if self.shared_encoder else self.critic_encoder,
                         "policy_avg": self.policy_avg}  # fmt: skip
        for m in self._modules.values():
            if m is not None:
                m.to(self.device)
        self.log_alpha.data = self.log_alpha.data.to(self.device)
        from rlinf_user.algorithms.update_graph import UpdateGraphs

        self.update_graphs = UpdateGraphs.for_algorithm(self, getattr(algo_cfg, "update_graph", "off"), self.device)

    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        return (self.critic_opt, self.actor_opt, self.alpha_opt)

    def after_warm_start(self) -> None:
        self.sync_encoders()
        if self.policy_avg is not None:  # the average starts from the cloned policy
            self.policy_avg.load_state_dict(self.policy.state_dict())

    @torch.no_grad()
    def _average_policy(self) -> None:
        rate = 1.0 - float(self.cfg.policy_ema)
        for p, ap in zip(self.policy.parameters(), self.policy_avg.parameters()):
            ap.lerp_(p, rate)
        for b, ab in zip(self.policy.buffers(), self.policy_avg.buffers()):
            ab.copy_(b)

    @property
    def acting_policy(self) -> torch.nn.Module:
        """The actor's moving average where ``policy_ema`` > 0."""
        return self.policy if self.policy_avg is None else self.policy_avg

    def sync_encoders(self) -> None:
        """After the policy's encoder was trained outside this algorithm (the BC warm start):
        the critics' encoder (when separate) and the target start from it."""
        with torch.no_grad():
            if not self.shared_encoder:
                self.critic_encoder.load_state_dict(self.policy.encoder.state_dict())
            if self.target_encoder is not None:
                self.target_encoder.load_state_dict(self.critic_encoder.state_dict())

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()

    def _target_min(self, q: torch.Tensor) -> torch.Tensor:
        """Min over a random subset of ``num_min_critics`` members (REDQ); q is (E, B)."""
        k = min(self.cfg.num_min_critics, q.shape[0])
        if k < q.shape[0]:
            idx = torch.randperm(q.shape[0], device=q.device)[:k]
            q = q[idx]
        return q.min(dim=0).values

    def _returns(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's reward and the bootstrap's factor: gamma^k, 0 after a terminal state
        (k: the buffer's n-step window, the steps of a chunk row, else 1)."""
        gamma, done = self.cfg.gamma, batch[Col.TERMINATED]
        if Col.DISCOUNT in batch:  # n-step returns from the buffer
            reward, discount = batch[Col.REWARD], batch[Col.DISCOUNT]
        elif Col.STEP_REWARDS in batch:  # a chunk as one row: its actions' rewards, discounted
            steps = batch[Col.STEP_REWARDS]
            powers = gamma ** torch.arange(steps.shape[-1], device=steps.device, dtype=steps.dtype)
            reward = (steps * powers).sum(-1)
            discount = gamma ** batch[Col.CHUNK_STEPS].to(steps.dtype) * (1.0 - done)
        else:
            reward, discount = batch[Col.REWARD], gamma * (1.0 - done)
        return reward * self.cfg.reward_scale, discount

    def _critic_loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        obs, next_obs = batch[Col.OBS], batch[Col.NEXT_OBS]
        reward, discount = self._returns(batch)
        alpha = self.alpha.detach()
        backup = 1.0 if self.cfg.backup_entropy else 0.0
        enc = self.critic_encoder
        if self.crossq:
            feats = enc(obs)
            next_feats = enc(next_obs)
            with torch.no_grad():
                actor_next = next_feats if self.shared_encoder else self.policy.encoder(next_obs)
                next_a, next_logp = self.policy.sample_features(actor_next)
            q_all = self.critic(torch.cat([feats, next_feats.detach()]), torch.cat([batch[self.action_key], next_a]))
            q, next_q = q_all.split(feats.shape[0], dim=1)
            with torch.no_grad():
                target = reward + discount * (self._target_min(next_q) - backup * alpha * next_logp)
        else:
            feats = enc(obs)
            with torch.no_grad():
                next_a, next_logp = self.policy.sample_features(self.policy.encoder(next_obs))
                next_q = self.target_critic(self.target_encoder(next_obs), next_a)
                target = reward + discount * (self._target_min(next_q) - backup * alpha * next_logp)
            q = self.critic(feats, batch[self.action_key])
        loss = F.mse_loss(q, target.unsqueeze(0).expand_as(q)) * q.shape[0]
        return loss, {"critic_loss": loss.detach() / q.shape[0], "q_mean": q.detach().mean()}

    def _actor_loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, dict]:
        if self.shared_encoder:
            with torch.no_grad():  # the actor sees the critics' encoder detached: no graph to build
                feats = actor_feats = self.policy.encoder(batch[Col.OBS])
        else:  # the actor's encoder learns from the actor loss; the critics judge on their own
            actor_feats = self.policy.encoder(batch[Col.OBS])
            with torch.no_grad():
                feats = self.critic_encoder(batch[Col.OBS])
        action, logp = self.policy.sample_features(actor_feats)
        if self.crossq:
            self.critic.eval()
        q = self.critic(feats, action).mean(dim=0)
        if self.crossq:
            self.critic.train()
        metrics = {"entropy": -logp.detach().mean()}
        demo = batch.get(Col.FROM_DEMOS)
        if getattr(self.cfg, "actor_loss", "reparam") == "awac":
            return self._awac_loss(batch, feats, actor_feats, action, logp, demo, metrics)
        if self._bc_applies(demo):
            # TD3+BC (Fujimoto & Gu 2021): the Q term over its batch mean magnitude, so the
            # BC term's weight means the same as the critic grows. Not below 1: Q-values
            # near 0 (a sparse reward, early on) would otherwise amplify the critic's noise.
            # Both only where the batch has demo rows: decided on the device, not the host
            any_demo = (demo > 0).any()
            q = torch.where(any_demo, q / q.abs().mean().detach().clamp_min(1.0), q)
            bc = self._bc_term(action, batch, demo, metrics)
            actor_loss = (self.alpha.detach() * logp - q).mean() + self.cfg.bc_weight * bc
        else:
            actor_loss = (self.alpha.detach() * logp - q).mean()
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        return actor_loss, alpha_loss, metrics

    def _bc_applies(self, demo) -> bool:
        return self.cfg.bc_weight > 0 and demo is not None

    @staticmethod
    def _bc_term(action, batch, demo, metrics) -> torch.Tensor:
        """Squared distance of the sampled action to the demonstrated one, averaged over the
        demo rows (0 without any): a masked mean, so nothing is read back to the host."""
        rows = (demo > 0).to(action.dtype)
        dist = (action - batch[Col.ACTION]).square().sum(-1)
        bc = (dist * rows).sum() / rows.sum().clamp_min(1.0)
        metrics["bc_loss"] = bc.detach()
        return bc

    def _awac_loss(self, batch, feats, actor_feats, action, logp, demo, metrics) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """AWAC-weighted regression onto the batch's actions, the entropy term, the BC pull."""
        with torch.no_grad():
            q_data = self.critic(feats, batch[self.action_key]).mean(dim=0)
            q_pi = self.critic(feats, action.detach()).mean(dim=0)
            adv = q_data - q_pi
            z = adv / adv.std().clamp_min(1e-6)
            w = torch.exp(z / float(self.cfg.awac_beta)).clamp(max=float(self.cfg.awac_max_weight))
        # the deterministic action's squared error, the std left to the entropy term: the
        # likelihood's std gradient on a clone whose std sits at its floor runs through the
        # layers the mean shares and moved it off its demonstrations (docs/results.md, pixels)
        min_std = self.cfg.awac_min_std
        fit = self.policy.fit_features(actor_feats, batch[self.action_key],
                                       min_std=None if min_std is None else float(min_std), std_head_only=True)  # fmt: skip
        actor_loss = (w * fit).mean() + (self.alpha.detach() * logp).mean()
        if self._bc_applies(demo):
            actor_loss = actor_loss + self.cfg.bc_weight * self._bc_term(action, batch, demo, metrics)
        metrics.update(awac_weight_max=w.max(), advantage_std=adv.std())
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        return actor_loss, alpha_loss, metrics

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        """One critic update (and an actor/temperature update every ``actor_update_every``)."""
        actor = self.next_phase()
        metrics = None if self.update_graphs is None else self.update_graphs.run(batch, actor)
        if metrics is None:
            metrics = self.update_on_device(batch, actor)
        self.after_update(actor)
        if actor:
            metrics["alpha"] = self.alpha.detach()  # as the next update will use it (a schedule moved it)
        return metric_floats(metrics)

    def next_phase(self) -> bool:
        """The host's part before an update: count it, and say whether the actor (and the
        temperature) update too; the actor's rate follows its schedule."""
        self.num_updates += 1
        warm = self.num_updates <= int(self.cfg.critic_warmup_updates)  # the critic learns the policy's worth first
        actor = not warm and self.num_updates % self.cfg.actor_update_every == 0
        if actor and self.cfg.final_actor_lr is not None:
            self._schedule_actor_lr()
        return actor

    def after_update(self, actor: bool) -> None:
        """The host's part after an update: the scheduled temperature for the next one."""
        if actor and not self.cfg.autotune_temperature and self.cfg.final_temperature is not None:
            self._schedule_temperature()

    def update_on_device(self, batch: dict[str, Any], actor: bool) -> dict[str, Any]:
        """The update's work on the device, its metrics as tensors: nothing in it reads a
        value back to the host, so it can be captured whole (``algo.update_graph``)."""
        obs = augment_obs(batch[Col.OBS], self.cfg.drq_pad, self.augmented)
        next_obs = augment_obs(batch[Col.NEXT_OBS], self.cfg.drq_pad, self.augmented)
        with_maps = getattr(self.policy.encoder, "with_maps", None)
        if with_maps is not None:  # a frozen backbone runs once per update, not once per encoder that reads it
            obs, next_obs = with_maps(obs, next_obs)
        batch = {**batch, Col.OBS: obs, Col.NEXT_OBS: next_obs}
        critic_loss, metrics = self._critic_loss(batch)
        self.critic_opt.zero_grad(set_to_none=True)
        self.backward(critic_loss, self.critic_opt)
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.critic.parameters(), self.cfg.grad_clip)
        self.critic_opt.step()
        if actor:
            actor_loss, alpha_loss, m = self._actor_loss(batch)
            self.actor_opt.zero_grad(set_to_none=True)
            self.backward(actor_loss, self.actor_opt)
            self.actor_opt.step()
            if self.cfg.autotune_temperature:
                self.alpha_opt.zero_grad(set_to_none=True)
                self.backward(alpha_loss, self.alpha_opt)
                self.alpha_opt.step()
            if self.policy_avg is not None:
                self._average_policy()
            metrics.update(m, actor_loss=actor_loss.detach(), alpha=self.alpha.detach())
        if self.target_critic is not None:
            self._polyak()
        return metrics

    def _after_warm_up(self, start: float, end: float, length: int) -> float:
        """start -> end, geometrically over ``length`` updates after the critic's warm-up (a
        function of the update count: a resumed run goes on where it was)."""
        frac = min(1.0, max(0.0, (self.num_updates - int(self.cfg.critic_warmup_updates)) / float(length)))
        return float(start) * (float(end) / float(start)) ** frac

    @torch.no_grad()
    def _schedule_temperature(self) -> None:
        c = self.cfg
        self.log_alpha.fill_(math.log(self._after_warm_up(c.init_temperature, c.final_temperature, c.temperature_decay_updates)))

    def _schedule_actor_lr(self) -> None:
        lr = self._after_warm_up(self.cfg.actor_lr, self.cfg.final_actor_lr, self.cfg.actor_lr_decay_updates)
        for group in self.actor_opt.param_groups:
            if isinstance(group["lr"], torch.Tensor):  # a captured update reads its rate from the device
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    @torch.no_grad()
    def _polyak(self) -> None:
        tau = self.cfg.tau
        for src, dst in ((self.critic, self.target_critic), (self.critic_encoder, self.target_encoder)):
            for p, tp in zip(src.parameters(), dst.parameters()):
                tp.lerp_(p, tau)
            for b, tb in zip(src.buffers(), dst.buffers()):
                tb.copy_(b)

    def _model_state(self) -> dict[str, torch.Tensor]:
        """Every trained tensor under one prefix per part (the checkpoint layout)."""
        out = {"log_alpha": self.log_alpha.detach()}
        for name, m in self._modules.items():
            if m is not None:
                out.update({f"{name}.{k}": v for k, v in m.state_dict().items()})
        return out

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "model": self._model_state(),
            "critic_opt": self.critic_opt.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "alpha_opt": self.alpha_opt.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        model = state["model"]
        for name, m in self._modules.items():
            if m is None:
                continue
            part = {k[len(name) + 1 :]: v for k, v in model.items() if k.startswith(name + ".")}
            if name == "policy_avg" and not part:  # saved without the average: it starts from the actor
                part = {k[len("policy.") :]: v for k, v in model.items() if k.startswith("policy.")}
            m.load_state_dict(part)
        self.log_alpha.data.copy_(model["log_alpha"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.num_updates = int(state["num_updates"])


class RLPD(SAC):
    config = RLPDConfig


class CrossQ(SAC):
    config = CrossQConfig


class SACFlow(SAC):
    config = SACFlowConfig
    resumes_from = ()
    trains_flow = True
