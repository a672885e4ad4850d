"""PPO and GRPO: the algorithm (:mod:`.algorithm`), its configs (:mod:`.config`) and the
credit assignment it owns (:mod:`.credit`: GAE, action-level GAE, GRPO's groups)."""

from rlinf_user.algorithms.ppo.algorithm import GRPO, PPO
from rlinf_user.algorithms.ppo.config import GRPOConfig, PPOConfig
from rlinf_user.algorithms.ppo.credit import OnPolicyStore

__all__ = ["GRPO", "GRPOConfig", "OnPolicyStore", "PPO", "PPOConfig"]
