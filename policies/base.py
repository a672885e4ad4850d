"""The policy interface, its capabilities and its registry.

A :class:`Policy` acts on a batch of contract observations (see
:mod:`rlinf_user.env.spec`) and returns a :class:`PolicyOutput`: actions over a horizon of
``H`` steps (a chunk; ``H = 1`` for per-step policies) plus named extras an algorithm may
need at training time (``log_prob``, ``value``, ``sample``).

Algorithms ask for what they need through small capability protocols
(:class:`Reparameterised`, :class:`ScoresActions`, :class:`HasValue`, :class:`BCTrainable`)
and never reach into a particular network. Policies are registered by name in
:data:`POLICIES` and built with :func:`build_policy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from rlinf_user.env.spec import EnvSpec
from rlinf_user.registry import Registry

POLICIES = Registry(
    "policy",
    {
        "mlp": "rlinf_user.policies.gaussian:GaussianPolicy",
        "cnn": "rlinf_user.policies.gaussian:GaussianPolicy",
        "gaussian_ac": "rlinf_user.policies.gaussian_ac:GaussianActorCritic",
        "flow": "rlinf_user.policies.flow:FlowPolicy",
        "pi0": "rlinf_user.policies.pi0:Pi0Policy",
        "lite_vla": "rlinf_user.policies.lite_vla:LiteVLAPolicy",
        "token_vla": "rlinf_user.policies.token_vla:TokenVLAPolicy",
        "openpi_remote": "rlinf_user.policies.openpi_remote:OpenpiRemotePolicy",
        "steered": "rlinf_user.policies.steered:SteeredPolicy",
    },
    entry_points="rlinf_user.policies",
)


@dataclass
class PolicyOutput:
    """``actions``: ``(B, H, A)`` in [-1, 1] over the spec's active dims; ``extras``: named
    per-row tensors (``log_prob`` ``(B,)``, ``value`` ``(B,)``, ``sample`` ``(B, H, A)``)."""

    actions: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


class PolicyUnavailable(RuntimeError):
    """A policy served elsewhere cannot answer: its server failed, hung, or went away for
    good. Evaluation stops and keeps what it finished; the CLI says it in one line."""


class EpisodeInterrupted(RuntimeError):
    """A served policy's connection broke and is back: the request in flight was lost, so
    the episodes in flight end (truncated, not counted) and run again; the run goes on."""


class Policy(nn.Module):
    """Base class: ``spec`` is what it was built for; ``horizon`` the chunk length."""

    horizon: int = 1

    def __init__(self, spec: EnvSpec):
        super().__init__()
        self.spec = spec

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> Policy:  # pragma: no cover
        raise NotImplementedError


@runtime_checkable
class Reparameterised(Protocol):
    """Reparameterised sampling with log-probability from encoder features (the SAC family):
    ``encoder`` is shared with the critics, ``sample_features`` carries the gradient."""

    encoder: nn.Module

    def sample_features(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class ScoresActions(Protocol):
    """Log-probability and entropy of a recorded ``sample`` (on-policy ratio terms)."""

    def log_prob(self, obs: dict[str, Any], sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class HasValue(Protocol):
    """A state-value estimate ``(B,)``."""

    def value(self, obs: dict[str, Any]) -> torch.Tensor: ...


@runtime_checkable
class BCTrainable(Protocol):
    """A supervised loss toward target actions ``(B, A)`` (behaviour cloning, HG-DAgger)."""

    def bc_loss(self, obs: dict[str, Any], target: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class WeightedRegression(Protocol):
    """A per-row loss ``(B,)`` pulling the policy toward given actions from encoder features,
    for actors that weight the data's actions (IQL's advantage-weighted regression)."""

    encoder: nn.Module

    def fit_features(self, feats: torch.Tensor, action: torch.Tensor, min_std: float | None = 0.0,
                     std_head_only: bool = False) -> torch.Tensor: ...  # fmt: skip


CAPABILITIES = {
    "reparameterised sampling with log-prob": Reparameterised,
    "log-prob of recorded samples": ScoresActions,
    "a value function": HasValue,
    "behaviour cloning": BCTrainable,
    "weighted regression onto given actions": WeightedRegression,
}


def build_policy(policy_cfg, spec: EnvSpec) -> Policy:
    """The policy named by ``policy_cfg.name`` for ``spec``."""
    return POLICIES.get(str(policy_cfg.name)).from_config(policy_cfg, spec)


def policy_class(policy_cfg) -> type:
    return POLICIES.get(str(policy_cfg.name))


def first_step(out: PolicyOutput) -> torch.Tensor:
    """The first action of each chunk, ``(B, A)``."""
    return out.actions[:, 0]


def policy_state_of(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The policy weights inside a checkpoint: ``best.pt`` holds them as ``policy``; a
    learner checkpoint as the algorithm's ``policy`` entry (or, before the algorithm
    interface, as the ``policy.`` keys of the SAC agent's ``model``, or its ``policy_avg.``
    ones where it published an average of its actor)."""
    if "policy" in checkpoint:
        return checkpoint["policy"]
    agent = checkpoint["agent"]
    if "policy" in agent:
        return agent["policy"]
    # the acting policy: SAC's moving average of its actor where it keeps one (policy_ema)
    prefix = "policy_avg." if any(k.startswith("policy_avg.") for k in agent["model"]) else "policy."
    return {k[len(prefix) :]: v for k, v in agent["model"].items() if k.startswith(prefix)}
