"""PPO's and GRPO's typed configs (``configs/algo/ppo.yaml`` and ``grpo.yaml`` sit on top)."""

from __future__ import annotations

from dataclasses import dataclass


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
