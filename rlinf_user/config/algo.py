"""One typed config per algorithm (``configs/algo/<name>.yaml`` sits on top of these).

Each dataclass is registered in Hydra's ConfigStore as ``algo_schema/<name>``; the YAML
file of the same name pulls it in, so ``algo=ppo algo.clip_coef=0.3`` is type-checked
and a key another algorithm has (``algo=ppo algo.num_critics=4``) is refused at compose.
The implementation of each lives in :data:`rlinf_user.algorithms.ALGORITHMS`.
"""

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
    target_entropy: float | None = None  # default -action_dim / 2
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
    # in the action. "awac": advantage-weighted likelihood of the batch's own actions (Nair
    # et al. 2020): weights exp(A / (awac_beta x std A)), A = Q(s, a) - Q(s, pi(s)), capped
    # at awac_max_weight; the actor never follows the critic's action-gradient, only ranks
    # actions it has seen (demos and its own), which keeps a cloned policy from drifting
    actor_loss: str = "reparam"
    awac_beta: float = 0.5
    awac_max_weight: float = 20.0
    drq_pad: int = 4  # DrQ random-shift padding for image observations (0: off)
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


@dataclass
class BCConfig:
    """Behaviour cloning on the demonstrations (``demos=``), for any policy that can be
    trained by BC; env workers only evaluate it."""

    name: str = "bc"
    lr: float = 1e-3
    weight_decay: float = 1e-5
    batch_size: int = 256
    updates_per_step: float = 1.0  # updates per env step of evaluation (bounds the pace)


@dataclass
class PPOConfig:
    """PPO for continuous actions (clipped objective, GAE, minibatch epochs)."""

    name: str = "ppo"
    gamma: float = 0.8
    gae_lambda: float = 0.9
    lr: float = 3e-4
    num_steps: int = 50  # env steps per env between updates (one rollout segment)
    update_epochs: int = 4
    num_minibatches: int = 8
    clip_coef: float = 0.2
    clip_vloss: bool = False
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = 0.1  # stop the epochs early past this approximate KL
    norm_adv: bool = True
    # running mean/std of the state, refined after every update and published with the
    # weights (the next round acts and trains with the same statistics)
    norm_obs: bool = True
    reward_scale: float = 1.0
    value_lr: float | None = None  # the value head's learning rate (None: lr); a VLA's actor wants a far smaller lr
    # updates that train only the value head (the policy held): a fresh critic on a
    # pretrained policy first learns what that policy is worth, so its first advantages
    # are not noise that undoes the pretraining
    critic_warmup_updates: int = 0
    # action chunks: chunk = one row per chunk, its rewards summed, one advantage for all of
    # its actions; action = GAE over the chunk's single actions (a value per action from the
    # chunk's observation, as RLinf's action-level rewards), each action's log-prob
    # elements clipped against its own advantage. VLAs (pi0, lite_vla, token_vla) only.
    credit: str = "chunk"
    # sync: collect with version v, update, collect with v+1. async: workers go on
    # collecting with a policy at most placement.max_policy_lag versions old.
    mode: str = "sync"


@dataclass
class GRPOConfig(PPOConfig):
    """GRPO: no critic; an episode's return is normalised within its group (episodes that
    start from the same reset seed), and every step of it gets that advantage."""

    name: str = "grpo"
    group_size: int = 4  # episodes per reset seed; must divide every worker's env count
    # step: step t gets its (gamma-discounted) reward-to-go minus the mean reward-to-go at
    # t of the group's other episodes, over one std per group (DeepSeekMath's
    # process-supervised GRPO credits a step with the normalised rewards that follow it).
    # episode: every step gets its episode's group-normalised undiscounted return
    # (outcome-supervised GRPO). On PushCube step + gamma 0.9 reached 90% in 3/3 seeds.
    baseline: str = "step"
    gamma: float = 0.9  # discount of the step baseline's reward-to-go (episode scoring ignores it)
    vf_coef: float = 0.0


ALGO_CONFIGS: dict[str, type] = {
    "sac": SACConfig,
    "rlpd": RLPDConfig,
    "crossq": CrossQConfig,
    "sac_flow": SACFlowConfig,
    "bc": BCConfig,
    "ppo": PPOConfig,
    "grpo": GRPOConfig,
}
