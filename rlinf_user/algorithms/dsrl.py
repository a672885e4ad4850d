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

What it does not take (refused by name, not ignored):

* demonstrations on the demo side of batches (``algo.demo_ratio > 0``) and a person's
  corrections (``intervention.enabled``): their rows hold executed actions, not the noise
  that would have produced them. The demonstrations' place is the base policy, cloned on
  them before (``algo=bc`` or ``sac_flow``'s warm start); inferring the noise of a given
  action by running the flow backwards is the way in for corrections, not built yet;
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

from dataclasses import dataclass, field
from typing import ClassVar

from omegaconf import OmegaConf

from rlinf_user.algorithms.base import Algorithm, ReplayPlan
from rlinf_user.algorithms.sac import SAC, SACConfig
from rlinf_user.env.spec import Col
from rlinf_user.policies.steered import SteeredPolicyConfig

# the policies with NoiseSteerable (rlinf_user.policies.steered); openpi_remote: a served
# flow (scripts/serve_openpi_steerable.py) with policy.noise_shape set
STEERABLE = ("flow", "pi0", "lite_vla", "openpi_remote")


@dataclass
class DSRLConfig(SACConfig):
    """SAC over the input noise of a frozen flow policy (DSRL)."""

    name: str = "dsrl"
    base_checkpoint: str | None = None  # the flow policy's weights: best.pt, a checkpoint or a run directory
    noise_max: float = 1.5  # |noise| per element (the flow was trained on N(0, I))
    noise_hidden: list[int] = field(default_factory=lambda: [256, 256])  # the noise actor's and critics' width
    learning_starts: int = 0
    gamma: float = 0.95
    init_temperature: float = 0.1
    backup_entropy: bool = False


class DSRL(SAC):
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
                   "hidden": list(cfg.algo.noise_hidden)}  # fmt: skip
        cfg.policy = OmegaConf.merge(OmegaConf.structured(SteeredPolicyConfig), steered)

    @classmethod
    def data_plan(cls, algo_cfg) -> ReplayPlan:
        return ReplayPlan(
            batch_size=int(algo_cfg.batch_size), utd_ratio=float(algo_cfg.utd_ratio), learning_starts=0,
            n_step=int(algo_cfg.n_step), gamma=float(algo_cfg.gamma), paced=bool(algo_cfg.paced), extras=(Col.NOISE,),
            chunk_rows=True,
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
        if float(algo_cfg.demo_ratio) > 0 or float(algo_cfg.bc_weight or 0) > 0:
            out.append("algo=dsrl learns from the noise it chose: demonstrations train the base policy (algo=bc), not "
                       "the demo side of DSRL's batches (set algo.demo_ratio=0, algo.bc_weight=0)")  # fmt: skip
        if str(algo_cfg.get("actor_loss", "reparam")) != "reparam":
            out.append("algo=dsrl trains its noise actor with SAC's reparameterised loss (algo.actor_loss=reparam)")
        if not float(algo_cfg.noise_max) > 0:
            out.append(f"algo.noise_max={algo_cfg.noise_max}: > 0")
        horizon = base.get("horizon") if base is not None else 1
        chunked = (not horizon and name == "openpi_remote") or int(horizon or 1) > 1  # openpi_remote: the whole chunk
        if chunked and int(algo_cfg.n_step) > 1:
            out.append(f"algo.n_step={algo_cfg.n_step} with chunks of policy.horizon={base.get('horizon')}: a chunk is "
                       "one transition whose target already discounts its steps; set algo.n_step=1")  # fmt: skip
        return out

    @classmethod
    def run_problems(cls, cfg) -> list[str]:
        out = []
        if cfg.get("intervention") is not None and bool(cfg.intervention.enabled):
            out.append("algo=dsrl cannot learn from a person's corrections yet (they carry no noise): "
                       "intervention.enabled=false, or algo=rlpd")  # fmt: skip
        base = cfg.policy.get("base") or {}
        if not cfg.algo.base_checkpoint and not base.get("checkpoint") and base.get("name") != "openpi_remote":
            out.append("algo=dsrl steers a trained flow policy: set algo.base_checkpoint=<run dir or best.pt> "
                       "(or policy.checkpoint=<folder> for pi0 / lite_vla)")  # fmt: skip
        return out
