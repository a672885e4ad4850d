"""The SAC family's settings: SAC's own, and the defaults RLPD, CrossQ and SAC-Flow change
(:mod:`rlinf_user.algorithms.sac`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SACConfig:
    """Off-policy actor-critic: SAC with critic ensembles and a bounded update-to-data ratio."""

    name: str = "sac"
    gamma: float = 0.9
    # n-step returns: each target sums n rewards and bootstraps from the state n steps on
    # (shorter at an episode's end); computed in the buffer per env stream, in the order it ran
    n_step: int = 1
    tau: float = 0.005
    batch_size: int = 256
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    init_temperature: float = 1.0
    # the temperature follows target_entropy (SAC's automatic tuning). false: it stays at
    # init_temperature. Tuning drives any policy's entropy to the target, whatever noise
    # the task tolerates: a clone of precise demonstrations (entropy about -8 over 4 action
    # dims) is pushed to -2, a step std near 0.15, and a learned pick's own episodes fail
    # a third of the time (docs/results.md, "Learning that holds")
    autotune_temperature: bool = True
    # with autotune_temperature=false: the temperature moves from init_temperature to this
    # one, geometrically, over temperature_decay_updates actor updates (explore early, act
    # cleanly late); None: it stays at init_temperature
    final_temperature: float | None = None
    temperature_decay_updates: int = 0
    target_entropy: float | None = None  # default -action_dim / 2
    # the actor's learning rate moves from actor_lr to this one, geometrically, over
    # actor_lr_decay_updates updates after the critic's warm-up (None: it stays). Adam's
    # steps keep their size however small the gradient, so at a fixed rate a converged
    # actor keeps moving by about that much per update; a falling rate lets it settle
    final_actor_lr: float | None = None
    actor_lr_decay_updates: int = 0
    # the entropy bonus in the critic's target (SAC's soft value). false: the temperature
    # acts on the actor only (as RLPD's and SERL's pick configs set it), so a sharp cloned
    # policy's log-probs do not swamp a sparse reward in the Q-values
    backup_entropy: bool = True
    num_critics: int = 2
    num_min_critics: int = 2  # REDQ-style random subset for the target min
    utd_ratio: float = 1.0  # critic updates per env step (across all envs)
    # sims: env workers wait while the learner is behind utd_ratio x env steps, so a sim
    # faster than the learner gets the updates it would on a real robot (which cannot wait)
    paced: bool = False
    actor_update_every: int = 1  # critic:actor update ratio
    learning_starts: int = 1000  # env steps of uniformly random actions first
    critic_layer_norm: bool = False
    batch_norm: bool = False  # CrossQ: batch-renorm critics, no target network
    demo_ratio: float = 0.0  # fraction of each batch drawn from demos (RLPD: 0.5)
    bc_warmup_updates: int = 0  # behaviour-clone the actor on demos=... before RL starts
    # ... with Gaussian noise on frozen feature maps (policy.frame_features), x their std.
    # Off in the pixel recipe: at 0.3 it left the weak seed-1 pixel clone at 57% (53%
    # without; docs/results.md)
    bc_feature_noise: float = 0.0
    # TD3+BC: the actor loss adds bc_weight x the squared distance of its action to the
    # demonstrated one on each batch's demo rows, and its Q term is divided by the batch's
    # mean |Q| (TD3+BC's alpha = 2.5 is bc_weight = 0.4); needs demo_ratio > 0
    bc_weight: float = 0.0
    # critic-only updates first: the actor (a cloned policy, say) is held until the critic
    # has learned what it is worth, so its first gradients are not an untrained critic's
    critic_warmup_updates: int = 0
    # one encoder for actor and critics, trained by the critic loss (DrQ/SERL). false: the
    # critics train their own copy and the actor's encoder learns from the actor loss and
    # the BC warm start, so TD updates cannot move the features a cloned actor acts on
    shared_encoder: bool = True
    # how the actor learns from the critics. "reparam": SAC's, through the critic's gradient
    # in the action. "awac": AWAC's weights (Nair et al. 2020) on a regression of the
    # deterministic action onto the batch's own actions, exp(A / (awac_beta x std A)) with
    # A = Q(s, a) - Q(s, pi(s)), capped at awac_max_weight: it only ranks actions it has seen
    actor_loss: str = "reparam"
    awac_beta: float = 0.5
    awac_max_weight: float = 20.0
    # how AWAC sets the std. null: the entropy term (and the BC term on demonstrated rows)
    # alone. A number: the weighted likelihood of the batch's actions around the mean held
    # fixed, std^2 = the weighted spread + awac_min_std^2, its gradient kept to the last
    # layer's std rows. Left to the entropy term, the std has no counterweight on the
    # policy's own states and grew there to ~0.4 a dimension from pixels (docs/results.md)
    awac_min_std: float | None = None
    # the policy that acts and is evaluated: an exponential moving average of the actor's
    # weights, moved by (1 - policy_ema) towards it after each actor update (0: the actor
    # itself). It also explores, lagging the actor by ~1/(1 - policy_ema) updates; at 0.999
    # on the randomised pick it learned worse than the actor itself (docs/results.md)
    policy_ema: float = 0.0
    drq_pad: int = 4  # DrQ random-shift padding for image observations (0: off)
    # the whole update captured in a CUDA graph, replayed per batch (rlinf_user/algorithms/
    # update_graph.py): auto = on a CUDA learner; on = refused off a GPU; off = eager
    update_graph: str = "off"
    grad_clip: float = 0.0
    reward_scale: float = 1.0


@dataclass
class RLPDConfig(SACConfig):
    """RLPD (Ball et al. 2023): LayerNorm critics, a 10-critic ensemble with a random
    2-critic target min, half of every batch from the demonstrations."""

    name: str = "rlpd"
    num_critics: int = 10
    critic_layer_norm: bool = True
    demo_ratio: float = 0.5


@dataclass
class CrossQConfig(SACConfig):
    """CrossQ (Bhatt et al. 2024): batch-renormalised critics, no target networks."""

    name: str = "crossq"
    batch_norm: bool = True
    actor_update_every: int = 3


@dataclass
class SACFlowConfig(SACConfig):
    """SAC over a flow policy (SAC-Flow, arXiv 2509.25756): the velocity network's
    K-step rollout is the reparameterised actor; its log-prob comes from the noisy
    sequential formulation (see :mod:`rlinf_user.policies.flow`)."""

    name: str = "sac_flow"
    target_entropy: float | None = 0.0  # SAC-Flow's: the chain's log-prob is not a marginal's
    init_temperature: float = 0.2
