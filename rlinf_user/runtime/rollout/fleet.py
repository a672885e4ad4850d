"""Several robots and simulators feeding one learner.

A *member* (:mod:`rlinf_user.config.fleet`) is one robot or simulator setup.

Members may differ (state size, cameras, active action dims). The learner trains one
policy on their *union*: the state is zero-padded to the largest member's and, when the
members differ, followed by a one-hot member id; cameras a member lacks are black; the
action covers every dim any member uses, and each member executes only its own. The
:class:`Adapter` does this on the worker, so every transition in the buffer has the same
schema.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlinf_user.config.fleet import Member, members, wants_member_id
from rlinf_user.env.spec import Col, EnvSpec

__all__ = ["Adapter", "Member", "members", "misfit", "union_spec", "wants_member_id"]

log = logging.getLogger(__name__)


def union_spec(specs: dict[int, EnvSpec], num_members: int, member_id: bool) -> EnvSpec:
    """One learner-side spec covering every member's (``specs``: member index -> spec)."""
    if not specs:
        raise ValueError("no fleet member is available to describe the env")
    cameras: dict[str, tuple] = {}
    for i, s in specs.items():
        for cam, hw in s.cameras.items():
            if cam in cameras and tuple(cameras[cam]) != tuple(hw):
                raise ValueError(f"camera {cam!r} is {tuple(hw)} on member {i} but {tuple(cameras[cam])} elsewhere")
            cameras[cam] = tuple(hw)
    contract = {s.contract_action_dim for s in specs.values()}
    if len(contract) != 1:
        raise ValueError(f"members disagree on the contract action size: {sorted(contract)}")
    env_state = max(s.state_dim for s in specs.values())
    extra = num_members if member_id else 0
    return EnvSpec(
        state_dim=env_state + extra,
        env_state_dim=env_state,
        member_id_dims=extra,
        cameras=cameras,
        active_dims=tuple(sorted({d for s in specs.values() for d in s.active_dims})),
        contract_action_dim=contract.pop(),
        instruction=any(s.instruction for s in specs.values()),
    )


def misfit(own: EnvSpec, fleet: EnvSpec) -> list[str]:
    """Why a member's env cannot join a run whose learner was built for ``fleet``."""
    problems = []
    if own.state_dim > fleet.env_state_dim:
        problems.append(f"state has {own.state_dim} values, the learner takes {fleet.env_state_dim}")
    for cam, hw in own.cameras.items():
        if tuple(fleet.cameras.get(cam, ())) != tuple(hw):
            problems.append(f"camera {cam!r} {tuple(hw)} is not among the learner's {dict(fleet.cameras)}")
    extra = sorted(set(own.active_dims) - set(fleet.active_dims))
    if extra:
        problems.append(f"action dims {extra} are not among the learner's {list(fleet.active_dims)}")
    return problems


@dataclass
class Adapter:
    """A member's observations into the fleet's form, the fleet's actions into its own."""

    own: EnvSpec
    fleet: EnvSpec
    index: int
    _mask: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        problems = misfit(self.own, self.fleet)
        if problems:
            raise ValueError("this env does not fit this run's learner: " + "; ".join(problems))
        self._mask = np.zeros(self.fleet.contract_action_dim, np.float32)
        self._mask[list(self.own.active_dims)] = 1.0

    @property
    def identity(self) -> bool:
        return (
            self.fleet.member_id_dims == 0
            and self.own.state_dim == self.fleet.state_dim
            and set(self.own.cameras) == set(self.fleet.cameras)
        )

    def obs(self, obs: dict[str, Any]) -> dict[str, Any]:
        """A batched observation (leading batch axis) in the fleet's form."""
        if self.identity:
            return obs
        state = np.asarray(obs[Col.STATE], np.float32)
        b = state.shape[0]
        out = np.zeros((b, self.fleet.state_dim), np.float32)
        out[:, : state.shape[1]] = state
        if self.fleet.member_id_dims:
            out[:, self.fleet.env_state_dim + self.index] = 1.0
        images = {}
        for cam, (h, w) in self.fleet.cameras.items():
            images[cam] = obs[Col.IMAGES][cam] if cam in obs[Col.IMAGES] else np.zeros((b, h, w, 3), np.uint8)
        adapted = {Col.STATE: out, Col.IMAGES: images}
        if "timestamps" in obs:
            stamps = obs["timestamps"]
            adapted["timestamps"] = {k: stamps[k] if k in stamps else np.zeros(b) for k in (*stamps, *images)}
        if Col.INSTRUCTION in obs:
            adapted[Col.INSTRUCTION] = obs[Col.INSTRUCTION]
        return adapted

    def env_action(self, contract_action: np.ndarray) -> np.ndarray:
        """The fleet-space contract action with the dims this member does not use zeroed."""
        return (contract_action * self._mask).astype(np.float32)
