"""The algorithm interface and its registry.

An algorithm is one room: its module holds its typed config (``config``, registered with
Hydra as ``algo_schema/<name>`` by the registry entry that names it), the data it wants
(:meth:`Algorithm.data_plan`), its own config checks (:meth:`Algorithm.problems`,
:meth:`Algorithm.run_problems`), the per-sim tuning family it accepts (``tuning_family``)
and which checkpoints it can resume (:meth:`Algorithm.resumes`). A plan is one of

* :class:`ReplayPlan`: batches sampled from the replay buffer, at most ``utd_ratio`` updates
  per env step, demonstrations mixed in by ``demo_ratio`` (SAC, RLPD, CrossQ, SAC-Flow, BC);
* :class:`OnPolicyPlan`: ordered rollout segments, each step recorded with the policy
  version, log-prob and value that produced it; the algorithm's own segment store turns
  them into advantages (PPO's GAE, GRPO's groups).

The learner, env workers, compose and evaluation ask the algorithm and its plan; they never
test its name or read its keys. Adding an algorithm is one module, one YAML and one entry
in :data:`ALGORITHMS` (or a ``rlinf_user.algorithms`` entry point in another package).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.base import CAPABILITIES, Policy, build_policy, policy_class
from rlinf_user.registry import Registry

ALGORITHMS = Registry(
    "algorithm",
    {
        "sac": "rlinf_user.algorithms.sac:SAC",
        "rlpd": "rlinf_user.algorithms.sac:RLPD",
        "crossq": "rlinf_user.algorithms.sac:CrossQ",
        "sac_flow": "rlinf_user.algorithms.sac:SACFlow",
        "bc": "rlinf_user.algorithms.bc:BC",
        "ppo": "rlinf_user.algorithms.ppo:PPO",
        "grpo": "rlinf_user.algorithms.ppo:GRPO",
        "iql": "rlinf_user.algorithms.iql:IQL",
        "dsrl": "rlinf_user.algorithms.dsrl:DSRL",
    },
    entry_points="rlinf_user.algorithms",
)

REPLAY, ON_POLICY = "replay", "on_policy"


@dataclass(frozen=True)
class ReplayPlan:
    """What an off-policy algorithm wants from the replay buffer."""

    batch_size: int = 256
    demo_ratio: float = 0.0  # share of every batch drawn from demonstrations (1.0: demonstrations only)
    utd_ratio: float = 1.0  # updates per env step
    learning_starts: int = 0  # env steps of uniformly random actions first
    n_step: int = 1  # the buffer's n-step returns (per env stream)
    gamma: float = 0.99  # their discount
    paced: bool = False  # sim env workers wait while the learner is behind utd_ratio
    # updates on the demonstrations alone before the first env step (Algorithm.warm_start:
    # behaviour cloning by default, an offline phase of the algorithm's own losses for IQL)
    warm_start_updates: int = 0
    warm_start_lr: float = 1e-3
    # the warm start's Gaussian noise on frozen feature maps, x their std (augment.feature_noise)
    warm_start_feature_noise: float = 0.0
    # the policy's extras each row keeps (algo=dsrl: Col.NOISE, what the steered policy chose)
    extras: tuple[str, ...] = ()
    # a chunk of several env steps is one row (algo=dsrl: its noise was chosen once for the
    # chunk): each action's reward in Col.STEP_REWARDS and how many ran in Col.CHUNK_STEPS, so
    # the target sums them discounted and bootstraps with gamma^k (SAC._critic_loss)
    chunk_rows: bool = False
    # algo config values that skip an opening phase a run passes through once (a critic
    # warm-up with the actor idle), so a profile times the updates of the rest of the run
    steady_overrides: tuple[tuple[str, Any], ...] = ()

    data_mode: ClassVar[str] = REPLAY


@dataclass(frozen=True)
class OnPolicyPlan:
    """What an on-policy algorithm wants from the env workers."""

    num_steps: int  # env steps per env in a round
    sync: bool = True  # collect with version v, update, collect with v + 1
    group_size: int = 0  # > 0: envs in groups that reset from one seed, updates on whole groups
    per_action_credit: bool = False  # a chunk's actions keep their own rewards (Col.STEP_REWARDS)

    data_mode: ClassVar[str] = ON_POLICY


class NonFiniteLoss(FloatingPointError):
    """A NaN/Inf loss, log-prob or weight: the learner stops before it publishes or saves it."""


class Algorithm:
    """Base class. Subclasses declare their data plan (``data_plan``) and ``requires``
    (capability names from :data:`rlinf_user.policies.base.CAPABILITIES`) and implement
    ``update``, calling
    :meth:`backward` for every loss (a data-parallel learner averages the gradients there)."""

    requires: ClassVar[tuple[str, ...]] = ()
    config: ClassVar[type]  # the typed config (Hydra's algo_schema/<name>)
    tuning_family: ClassVar[str | None] = None  # the env's algo_tuning.<family> applies when none names it
    resumes_from: ClassVar[tuple[str, ...]] = ()  # algorithms besides itself whose checkpoints it loads
    grad_world: int = 1  # > 1: a data-parallel replica (torch.distributed group joined)

    def __init__(self, cfg, policy: Policy, spec: EnvSpec, device: str | torch.device = "cpu"):
        self.cfg = cfg
        self.policy = policy
        self.spec = spec
        self.device = torch.device(device)
        self.num_updates = 0

    @classmethod
    def problems(cls, algo_cfg, policy_cfg, spec: EnvSpec | None = None) -> list[str]:
        """Why this algorithm cannot train this policy (checked before anything starts)."""
        pcls = policy_class(policy_cfg)
        out = []
        for need in cls.needs(algo_cfg):
            proto = CAPABILITIES[need]
            if not all(hasattr(pcls, m) for m in _members(proto)):
                out.append(
                    f"algo={algo_cfg.name} needs a policy with {need}; policy={policy_cfg.name} has none "
                    f"(set policy= to one that has, e.g. {', '.join(_policies_with(proto)) or 'none registered'})"
                )
        return out

    @classmethod
    def needs(cls, algo_cfg) -> tuple[str, ...]:
        """The policy capabilities this configuration of the algorithm uses."""
        return cls.requires

    @classmethod
    def data_plan(cls, algo_cfg) -> ReplayPlan | OnPolicyPlan:
        """The data this configuration trains on (the runtime reads nothing else of it)."""
        raise NotImplementedError(f"{cls.__name__} declares no data plan")

    @classmethod
    def run_problems(cls, cfg) -> list[str]:
        """Why this run (envs, demonstrations, placement) cannot train with this algorithm,
        beyond :meth:`problems`; checked at the command line."""
        return []

    @classmethod
    def configure(cls, cfg) -> None:
        """Settings of the rest of the run this configuration implies (called at compose)."""

    @classmethod
    def resumes(cls, trained: str) -> bool:
        """Whether a checkpoint written by ``algo=trained`` can continue as this algorithm."""
        return trained == cls.config.name or trained in cls.resumes_from

    def update(self, batch: dict[str, Any]) -> dict[str, float]:  # pragma: no cover
        raise NotImplementedError

    def backward(self, loss: torch.Tensor, opt: torch.optim.Optimizer) -> None:
        """``loss.backward()``; in a data-parallel learner, then the gradients of ``opt``'s
        parameters averaged over every replica (one flat all-reduce), so each replica's
        ``opt.step()`` takes the same step, that of the whole batch."""
        loss.backward()
        if self.grad_world > 1:
            average_gradients([q for g in opt.param_groups for q in g["params"]], self.grad_world)

    def group_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Every replica's ``rows`` (equal counts), in rank order: statistics a replica keeps
        (the observation normaliser) are then updated with the whole batch on each."""
        if self.grad_world == 1:
            return rows
        import torch.distributed as dist

        parts = [torch.empty_like(rows) for _ in range(self.grad_world)]
        dist.all_gather(parts, rows.contiguous())
        return torch.cat(parts)

    def sync_buffers(self) -> None:
        """Floating-point buffers (batch-norm statistics) from rank 0 to every replica after
        an update, as DistributedDataParallel's ``broadcast_buffers`` does."""
        if self.grad_world == 1:
            return
        import torch.distributed as dist

        for m in [v for v in vars(self).values() if isinstance(v, torch.nn.Module)]:
            for b in m.buffers():
                if b.is_floating_point():
                    dist.broadcast(b.data, 0)

    def group_mean(self, value: float) -> float:
        """``value`` averaged over the data-parallel replicas (decisions they must share)."""
        if self.grad_world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t) / self.grad_world

    def check_finite(self, metrics: dict[str, float], weights: bool = True) -> None:
        """Raise :class:`NonFiniteLoss` if an update left a NaN/Inf metric or (``weights``)
        policy weight. The learner checks the metrics after every update and the weights
        before they leave it (a publish, a checkpoint): a weight gone non-finite makes the
        next update's loss non-finite too, and a full pass over the weights cost 4% of an
        RLPD update on CPU."""
        bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v) and k != "explained_variance"]
        if weights and not self.weights_finite():
            bad += [k for k, v in self.policy.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            raise NonFiniteLoss(f"update {self.num_updates} of algo={self.cfg.name} produced NaN/Inf in {bad[:8]}: {metrics}")

    def weights_finite(self) -> bool:
        """Whether every floating-point weight and buffer of the policy is finite: one fused
        norm over them (a norm that overflows to inf on finite weights above ~1e19 reads as
        non-finite here, and the caller's exact pass then finds nothing)."""
        tensors = [t for t in itertools.chain(self.policy.parameters(), self.policy.buffers()) if t.is_floating_point()]
        if not tensors:
            return True
        with torch.no_grad():
            return bool(torch.isfinite(torch.nn.utils.get_total_norm(tensors, foreach=True)))

    def warm_start(self, batches) -> float:
        """Before any RL update, ``plan.warm_start_updates`` batches of demonstrations:
        here, behaviour cloning of the policy; returns the last loss."""
        from rlinf_user.algorithms.augment import feature_noise
        from rlinf_user.algorithms.bc import BC

        plan = self.data_plan(self.cfg)
        bc = BC.for_policy(self.policy, lr=plan.warm_start_lr)
        loss = float("nan")
        for batch in batches:
            loss = bc.step(feature_noise(batch[Col.OBS], plan.warm_start_feature_noise), batch[Col.ACTION])
        self.after_warm_start()
        return loss

    def after_warm_start(self) -> None:
        """The policy was trained outside this algorithm (the BC warm start)."""

    @property
    def acting_policy(self) -> torch.nn.Module:
        """The weights published to act and be evaluated (the trained policy itself, unless
        an algorithm publishes something derived from it)."""
        return self.policy

    def policy_state(self) -> dict[str, torch.Tensor]:
        """CPU copy of the rollout policy's weights, for publication."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.acting_policy.state_dict().items()}

    def checkpoint_state(self) -> dict[str, Any]:
        """The policy and the one optimiser ``self.opt`` (algorithms with more override this)."""
        return {"policy": self.policy.state_dict(), "opt": self.opt.state_dict(), "num_updates": self.num_updates}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["opt"])
        self.num_updates = int(state["num_updates"])


def average_gradients(params: list[torch.nn.Parameter], world: int) -> None:
    """Sum the gradients over the process group in one flat buffer, divide by ``world``.
    Parameters without a gradient are skipped (replicas run the same code, so the same
    parameters have none)."""
    import torch.distributed as dist

    grads = [q.grad for q in params if q.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    start = 0
    for g in grads:
        g.copy_(flat[start : start + g.numel()].view_as(g))
        start += g.numel()


def _members(proto) -> list[str]:
    return [m for m in vars(proto) if not m.startswith("_") and m not in ("encoder",)] or list(proto.__annotations__)


def _policies_with(proto) -> list[str]:
    from rlinf_user.policies.base import POLICIES

    out = []
    for name in POLICIES.names():
        try:
            cls = POLICIES.get(name)
        except ImportError:
            continue
        if all(hasattr(cls, m) for m in _members(proto)):
            out.append(name)
    return out


def algorithm_class(algo_cfg) -> type[Algorithm]:
    return ALGORITHMS.get(str(algo_cfg.name))


def build_algorithm(algo_cfg, policy_cfg, spec: EnvSpec, device="cpu") -> Algorithm:
    """The algorithm named by ``algo_cfg.name`` with a fresh policy for ``spec``."""
    cls = algorithm_class(algo_cfg)
    problems = cls.problems(algo_cfg, policy_cfg, spec)
    if problems:
        raise ValueError("; ".join(problems))
    return cls(algo_cfg, build_policy(policy_cfg, spec), spec, device)


def check_algorithm(algo_cfg, policy_cfg, spec: EnvSpec | None = None) -> list[str]:
    """Config-time problems of this algorithm/policy pair (empty: fine)."""
    if str(algo_cfg.name) not in ALGORITHMS:
        return [f"algo.name={algo_cfg.name!r}: available {', '.join(ALGORITHMS.names())}"]
    return algorithm_class(algo_cfg).problems(algo_cfg, policy_cfg, spec)


def data_plan(algo_cfg) -> ReplayPlan | OnPolicyPlan:
    """The data plan of the run's algorithm (see :meth:`Algorithm.data_plan`)."""
    return algorithm_class(algo_cfg).data_plan(algo_cfg)
