"""DSRL: SAC in the noise space of a frozen flow policy (``algo=dsrl``).

Wagenmaker et al. 2025, "Steering Your Diffusion Policy with Latent Space Reinforcement
Learning". The configured flow policy (``policy=flow``, ``pi0``, ``lite_vla``) is loaded from
``algo.base_checkpoint`` (or its own ``policy.checkpoint`` folder) and frozen, or served
(``policy=openpi_remote`` with ``policy.noise_shape``: an openpi server that takes the
noise, ``scripts/serve_openpi_steerable.py``); at compose,
this algorithm wraps it in :class:`~rlinf_user.policies.steered.SteeredPolicy`, whose small
tanh-Gaussian actor chooses the flow's input noise from the observation. SAC then trains
that actor and its critics ``Q(s, u)`` on rows whose "action" is the chosen unit-box noise
``u`` (``Col.NOISE``, kept in every replay row by the data plan): no gradient reaches the
flow policy, and only the actor and critics change and travel to the env workers.

**Demonstrations and a person's corrections** (``algo.action_critic=true``, DSRL-NA, the
paper's noise-aliased variant). Their rows hold executed actions, not the noise that would
have produced them, so the noise critic cannot score them. An action critic ``Q_A(s, a)``
can: it learns by TD from every executed row (the policy's own, the demonstrations on the
demo side of each batch, the corrections), bootstrapping with the steered policy's next
action ``base(s', w')``. The noise critic ``Q_W(s, u)`` is then distilled from it,
``Q_W(s, u) -> Q_A(s, base(s, noise_max u))``, on noises from the actor and uniform ones
over the box, and the actor climbs ``Q_W`` as before. A correction thus raises the value
of the actions near it, and the actor learns which noises reach them; no inversion of the
flow is needed. Running the flow backwards from a person's action was the other way in,
rejected: that action is often outside what the base can produce, and its clipped noise
would label the row with an action it did not take. The cost is two passes of the base per
update (the next action and the distilled one), so the learner holds the base: a served
policy (``openpi_remote``) is refused with it, as are chunks (the row would need every
action the chunk ran; only its first is kept).

What it does not take (refused by name, not ignored):

* without ``action_critic``: demonstrations on the demo side of batches
  (``algo.demo_ratio > 0``) and a person's corrections (``intervention.enabled``). Either
  way the demonstrations' other place is the base policy, cloned on them before
  (``algo=bc`` or ``sac_flow``'s warm start); a behaviour-cloning term (``bc_weight``) has no
  noise to pull towards;
* uniformly random actions first (``algo.learning_starts > 0``): exploration is the actor's
  own noise around the base's behaviour, from the first step;
* n-step returns over chunks (``algo.n_step > 1`` with ``policy.horizon > 1``).

A chunk policy's noise is chosen once per chunk (``H x A`` numbers), so a chunk is one
transition (``ReplayPlan.chunk_rows``): the env worker folds the steps it ran into one row
that keeps each action's reward, and the critic's target is their sum discounted step by
step plus ``gamma^k`` times the value after the ``k`` steps that ran (fewer than ``H`` when
the episode ended inside the chunk). A chunk the edge daemon ran on its own clock is the
same row: the steps it streamed back are what the worker folds.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from rlinf_user.algorithms.base import Algorithm, ReplayPlan
from rlinf_user.algorithms.sac import SAC, SACConfig, steady_overrides
from rlinf_user.env.spec import Col
from rlinf_user.policies.actor_critic import CriticEnsemble
from rlinf_user.policies.encoders import EncoderConfig
from rlinf_user.policies.steered import SteeredPolicyConfig

log = logging.getLogger(__name__)

# the policies with NoiseSteerable (rlinf_user.policies.steered); openpi_remote: a served
# flow (scripts/serve_openpi_steerable.py) with policy.noise_shape set
STEERABLE = ("flow", "pi0", "lite_vla", "openpi_remote")


# the bases whose embedding the noise actor can read (algo.noise_encoder.encoder=base)
EMBEDDED = ("pi0", "lite_vla")


def reads_embedding(algo_cfg) -> bool:
    """The noise actor reads the base's embedding: rows carry ``obs/`` and ``next_obs/embedding``."""
    enc = getattr(algo_cfg, "noise_encoder", None)
    return enc is not None and str(enc.get("encoder") if hasattr(enc, "get") else enc.encoder) == "base"


@dataclass
class DSRLConfig(SACConfig):
    """SAC over the input noise of a frozen flow policy (DSRL)."""

    name: str = "dsrl"
    base_checkpoint: str | None = None  # the flow policy's weights: best.pt, a checkpoint or a run directory
    noise_max: float = 1.5  # |noise| per element (the flow was trained on N(0, I))
    noise_hidden: list[int] = field(default_factory=lambda: [256, 256])  # the noise actor's and critics' width
    # the noise actor's (and its critics') observation encoder: a cnn on an env with cameras
    # unless set (algo.noise_encoder.encoder_channels=[16,16], ...). It is its own: the
    # base's encoder is frozen with the base. encoder=base (pi0, lite_vla): the state and the
    # frozen base's own embedding of the observation (images and instruction through its VLM),
    # computed once per row: by the acting policy, and where rows are stored for next_obs
    noise_encoder: EncoderConfig = field(default_factory=EncoderConfig)
    learning_starts: int = 0
    gamma: float = 0.95
    init_temperature: float = 0.1
    backup_entropy: bool = False
    # DSRL-NA: an action critic learns from every executed row (demonstrations and a
    # person's corrections included) and the noise critic is distilled from it
    action_critic: bool = False


class DSRL(SAC):
    capturable_update = False  # its critic loss reads its metrics back to the host
    config = DSRLConfig
    tuning_family = None  # its own algo_tuning.dsrl block, not SAC's (learning_starts, ...)
    resumes_from = ()
    action_key: ClassVar[str] = Col.NOISE

    @classmethod
    def configure(cls, cfg) -> None:
        """The configured flow policy becomes the frozen base of a steered policy."""
        base = cfg.policy
        if str(base.name) == "steered":  # composed again from a run's resolved config
            return
        base = OmegaConf.to_container(base, resolve=True)
        if base.get("name") == "openpi_remote":  # the learner builds it for its shapes: no connection there
            base["connect"] = "first_use"
        steered = {"name": "steered", "base": base,
                   "base_checkpoint": cfg.algo.base_checkpoint, "noise_max": float(cfg.algo.noise_max),
                   "hidden": list(cfg.algo.noise_hidden),
                   **OmegaConf.to_container(cfg.algo.noise_encoder, resolve=True)}  # fmt: skip
        cfg.policy = OmegaConf.merge(OmegaConf.structured(SteeredPolicyConfig), steered)

    @classmethod
    def data_plan(cls, algo_cfg) -> ReplayPlan:
        demo_ratio = float(algo_cfg.demo_ratio) if bool(getattr(algo_cfg, "action_critic", False)) else 0.0
        return ReplayPlan(
            batch_size=int(algo_cfg.batch_size), utd_ratio=float(algo_cfg.utd_ratio), learning_starts=0,
            demo_ratio=demo_ratio,
            n_step=int(algo_cfg.n_step), gamma=float(algo_cfg.gamma), paced=bool(algo_cfg.paced),
            extras=(Col.NOISE, f"{Col.OBS}/{Col.EMBEDDING}") if reads_embedding(algo_cfg) else (Col.NOISE,),
            chunk_rows=True, steady_overrides=steady_overrides(algo_cfg),
        )  # fmt: skip

    @classmethod
    def problems(cls, algo_cfg, policy_cfg, spec=None) -> list[str]:
        out = Algorithm.problems.__func__(cls, algo_cfg, policy_cfg, spec)  # the capabilities SAC's losses use
        base = policy_cfg.get("base") if str(policy_cfg.name) == "steered" else policy_cfg
        name = str(base.name) if base is not None else "none"
        if name not in STEERABLE:
            out.append(f"algo=dsrl steers a flow policy through its noise: set policy= to one of {', '.join(STEERABLE)} "
                       f"(policy={name})")  # fmt: skip
        if name == "openpi_remote" and base.get("noise_shape") is None:
            out.append("algo=dsrl over policy=openpi_remote needs policy.noise_shape=[H, D] (the served model's "
                       "action_horizon and action_dim) and a server that takes the noise "
                       "(scripts/serve_openpi_steerable.py)")  # fmt: skip
        if int(algo_cfg.learning_starts) > 0:
            out.append(f"algo.learning_starts={algo_cfg.learning_starts}: DSRL explores with its own noise from the first "
                       "step (random actions would carry no noise to learn from); set 0")  # fmt: skip
        na = bool(getattr(algo_cfg, "action_critic", False))
        if float(algo_cfg.demo_ratio) > 0 and not na:
            out.append("algo=dsrl learns from the noise it chose: demonstrations train the base policy (algo=bc), or "
                       "enter through an action critic (algo.action_critic=true); else set algo.demo_ratio=0")  # fmt: skip
        if float(algo_cfg.bc_weight or 0) > 0:
            out.append("algo.bc_weight: a behaviour-cloning term has no noise to pull towards in algo=dsrl (set 0; "
                       "demonstrations enter through algo.action_critic=true)")  # fmt: skip
        if na and name == "openpi_remote":
            out.append("algo.action_critic=true runs the base policy in the learner (two passes an update): a served "
                       "policy (openpi_remote) cannot; set algo.action_critic=false")  # fmt: skip
        if reads_embedding(algo_cfg) and name not in EMBEDDED:
            out.append(f"algo.noise_encoder.encoder=base reads the base's own embedding of the observation: policy= "
                       f"one of {', '.join(EMBEDDED)} (policy={name}; a served or small flow policy has none)")  # fmt: skip
        if str(algo_cfg.get("actor_loss", "reparam")) != "reparam":
            out.append("algo=dsrl trains its noise actor with SAC's reparameterised loss (algo.actor_loss=reparam)")
        if not float(algo_cfg.noise_max) > 0:
            out.append(f"algo.noise_max={algo_cfg.noise_max}: > 0")
        horizon = base.get("horizon") if base is not None else 1
        chunked = (not horizon and name == "openpi_remote") or int(horizon or 1) > 1  # openpi_remote: the whole chunk
        if chunked and na:
            out.append(f"algo.action_critic=true with chunks of policy.horizon={base.get('horizon')}: the action critic "
                       "would need every action a chunk ran, and a chunk's row keeps its first; use horizon 1")  # fmt: skip
        if chunked and int(algo_cfg.n_step) > 1:
            out.append(f"algo.n_step={algo_cfg.n_step} with chunks of policy.horizon={base.get('horizon')}: a chunk is "
                       "one transition whose target already discounts its steps; set algo.n_step=1")  # fmt: skip
        return out

    @classmethod
    def run_problems(cls, cfg) -> list[str]:
        out = []
        if cfg.get("intervention") is not None and bool(cfg.intervention.enabled) and not cfg.algo.get("action_critic"):
            out.append("algo=dsrl learns a person's corrections through an action critic (they carry no noise): "
                       "algo.action_critic=true, or intervention.enabled=false")  # fmt: skip
        base = cfg.policy.get("base") or {}
        if not cfg.algo.base_checkpoint and not base.get("checkpoint") and base.get("name") != "openpi_remote":
            out.append("algo=dsrl steers a trained flow policy: set algo.base_checkpoint=<run dir or best.pt> "
                       "(or policy.checkpoint=<folder> for pi0 / lite_vla)")  # fmt: skip
        return out

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        metrics = super().update(batch)
        if self.num_updates == 1:
            metrics.update(self.noise_authority(batch[Col.OBS]))
        return metrics

    @torch.no_grad()
    def noise_authority(self, obs: dict[str, Any], draws: int = 16, states: int = 64) -> dict[str, float]:
        """How far the frozen base's action moves with its noise: per action dim, the std of
        ``base(s, noise)`` over noises drawn uniformly from the box, averaged over states. A
        dim near 0 is one that steering cannot change (a clone of deterministic demonstrations
        maps every noise to the demonstrated action); logged once, at the first update."""
        from rlinf_user.env.contract import ACTION_NAMES

        obs = _rows(obs, slice(0, states))
        b = int(obs[Col.STATE].shape[0])
        rng = torch.Generator(device=self.device).manual_seed(0)  # the training's random streams stay as they were
        u = torch.rand(draws * b, self.policy.noise_dim, device=self.device, generator=rng) * 2 - 1
        acts = self._executed(_repeat(obs, draws), u).view(draws, b, -1)
        std = acts.std(0).mean(0).float().cpu()
        names = [ACTION_NAMES[d] if d < len(ACTION_NAMES) else str(d) for d in self.spec.active_dims]
        log.info("algo=dsrl: the base's action moves with its noise by (std over the noise box) %s",
                 ", ".join(f"{n} {v:.3f}" for n, v in zip(names, std.tolist())))  # fmt: skip
        still = [n for n, v in zip(names, std.tolist()) if v < 0.01]
        if still:
            log.warning("algo=dsrl: the base's action does not move with its noise in %s (std < 0.01 over the box "
                        "of +-%g): steering cannot change it there; a base that is more stochastic there (or a "
                        "larger algo.noise_max) gives the noise actor something to choose", ", ".join(still),
                        float(self.cfg.noise_max))  # fmt: skip
        return {f"noise_authority/{n}": v for n, v in zip(names, std.tolist())}

    # -- DSRL-NA: the action critic and the noise critic distilled from it ------------------

    def __init__(self, algo_cfg, policy, spec, device="cpu"):
        super().__init__(algo_cfg, policy, spec, device)
        self.na = bool(getattr(algo_cfg, "action_critic", False))
        if not self.na:
            return
        hidden = list(getattr(policy, "hidden", None) or [256, 256])
        self.action_critic = CriticEnsemble(policy.encoder.out_dim, spec.action_dim, hidden, algo_cfg.num_critics,
                                            layer_norm=algo_cfg.critic_layer_norm).to(self.device)  # fmt: skip
        self.target_action_critic = copy.deepcopy(self.action_critic).requires_grad_(False)
        self.critic_opt.add_param_group({"params": list(self.action_critic.parameters())})
        self._modules.update(action_critic=self.action_critic, target_action_critic=self.target_action_critic)

    def _executed(self, obs: dict[str, Any], u: torch.Tensor) -> torch.Tensor:
        """The action the base runs from the unit-box noise ``u`` (its chunk's first)."""
        return self.policy.actions_for(obs, u)[:, 0]

    def _critic_loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        if not self.na:
            return super()._critic_loss(batch)
        obs, next_obs = batch[Col.OBS], batch[Col.NEXT_OBS]
        reward, discount = self._returns(batch)
        feats = self.critic_encoder(obs)
        with torch.no_grad():  # TD for Q_A on the executed action, whoever chose it
            next_u, _ = self.policy.sample_features(self.policy.encoder(next_obs))
            next_q = self.target_action_critic(self.target_encoder(next_obs), self._executed(next_obs, next_u))
            target = reward + discount * self._target_min(next_q)
        q_a = self.action_critic(feats, batch[Col.ACTION])
        loss_a = F.mse_loss(q_a, target.unsqueeze(0).expand_as(q_a))
        with torch.no_grad():  # distillation: the noises the actor picks, and the rest of the box
            actor_u, _ = self.policy.sample_features(self.policy.encoder(obs))
            u = torch.cat([actor_u, torch.rand_like(actor_u) * 2 - 1])
            obs2 = _twice(obs)
            feats2 = torch.cat([feats, feats]).detach()
            aliased = self.action_critic(feats2, self._executed(obs2, u)).mean(0)
        q_w = self.critic(torch.cat([feats, feats]), u)
        loss_w = F.mse_loss(q_w, aliased.unsqueeze(0).expand_as(q_w))
        loss = (loss_a + loss_w) * q_a.shape[0]
        return loss, {"critic_loss": loss_a.item(), "distill_loss": loss_w.item(), "q_mean": q_a.mean().item(),
                      "q_noise_mean": q_w.mean().item()}  # fmt: skip

    @torch.no_grad()
    def _polyak(self) -> None:
        super()._polyak()
        if self.na:
            for p, tp in zip(self.action_critic.parameters(), self.target_action_critic.parameters()):
                tp.lerp_(p, self.cfg.tau)


def _twice(obs: Any) -> Any:
    """The batch of observations stacked on itself (nested dicts of tensors)."""
    return _repeat(obs, 2)


def _repeat(obs: Any, k: int) -> Any:
    """The batch of observations stacked ``k`` times (nested dicts of tensors)."""
    if torch.is_tensor(obs):
        return torch.cat([obs] * k)
    if isinstance(obs, dict):
        return {key: _repeat(v, k) for key, v in obs.items()}
    if isinstance(obs, list | tuple):  # per-row values (instructions)
        return [*obs] * k
    return obs


def _rows(obs: Any, rows: slice) -> Any:
    """Rows ``rows`` of a batch of observations (nested dicts of tensors)."""
    if torch.is_tensor(obs) or isinstance(obs, list | tuple):
        return obs[rows]
    if isinstance(obs, dict):
        return {key: _rows(v, rows) for key, v in obs.items()}
    return obs
