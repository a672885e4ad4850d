"""What a policy is built for and what a transition holds, defined once.

:class:`EnvSpec` is the learner-side description of an environment (or a fleet's union of
them): state size, cameras, whether observations carry a language instruction, the action
dims the policy acts on and the horizon of its action chunks. Env workers, replay,
learners, datasets, the rollout server and checkpoints all use it.

:class:`Col` names the columns of a transition chunk. A chunk is a dict of numpy arrays
sharing a leading axis; observation columns are flat paths (``obs/state``,
``obs/images/<camera>``, ``obs/instruction``, the same under ``next_obs/``).

An observation *batch* is the contract observation with a leading batch axis on every
array (``{"state": (B, D), "images": {cam: (B, H, W, 3)}, "instruction": (B,) str}``);
:func:`obs_to_torch` is the one conversion to tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlinf_user.env.contract import ACTION_DIM, MAX_INSTRUCTION_CHARS


class Col:
    """Transition column names."""

    OBS = "obs"
    NEXT_OBS = "next_obs"
    STATE = "state"
    IMAGES = "images"
    # per camera, a frozen encoder's feature map computed where the frame was produced
    # (policy.frame_features): float16 (C, h, w); rows that carry it carry no frames
    FEATURES = "features"
    # a frozen base policy's embedding of the observation (algo=dsrl with
    # algo.noise_encoder.encoder=base): the acting policy's extra for ``obs/``, computed
    # where rows are stored for ``next_obs/``; float32 (D,)
    EMBEDDING = "embedding"
    INSTRUCTION = "instruction"
    ACTION = "action"
    REWARD = "reward"
    TERMINATED = "terminated"
    TRUNCATED = "truncated"
    POLICY_VERSION = "policy_version"
    INTERVENTION = "intervention"
    ENV_ID = "env_id"
    # on-policy extras, recorded by the env worker from the policy's output
    LOG_PROB = "log_prob"
    VALUE = "value"
    SAMPLE = "sample"  # the policy's raw sample before clipping to the action box
    STEP = "step"  # per-env sequence number of the step within the worker's stream
    GROUP = "group"  # reset-seed group of the episode (GRPO)
    STEP_REWARDS = "step_rewards"  # action-level credit: each executed action's reward (rows x H)
    CHUNK_STEPS = "chunk_steps"  # action-level credit: actions of the row's chunk that ran
    # replay extra (algo=dsrl): the unit-box noise a steered flow policy acted from (rows x H*A)
    NOISE = "noise"
    # added by the learner's side, never sent by an env worker
    ADVANTAGE = "advantage"  # on-policy credit (GAE, GRPO's group scores)
    RETURN = "return"  # the value target that goes with it
    DISCOUNT = "discount"  # n-step replay: the bootstrap's factor gamma^k (0 after a terminal state)
    FROM_DEMOS = "from_demos"  # replay: the row was drawn on the demonstrations' side of the batch

    REQUIRED = (f"{OBS}/{STATE}", f"{NEXT_OBS}/{STATE}", ACTION, REWARD, TERMINATED)

    @staticmethod
    def state(prefix: str) -> str:
        return f"{prefix}/{Col.STATE}"

    @staticmethod
    def image(prefix: str, camera: str) -> str:
        return f"{prefix}/{Col.IMAGES}/{camera}"

    @staticmethod
    def instruction(prefix: str) -> str:
        return f"{prefix}/{Col.INSTRUCTION}"

    @staticmethod
    def feature(prefix: str, camera: str) -> str:
        return f"{prefix}/{Col.FEATURES}/{camera}"


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """The learner-side env description (a fleet's union when several members feed it)."""

    state_dim: int
    cameras: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    active_dims: tuple[int, ...] = tuple(range(ACTION_DIM))
    contract_action_dim: int = ACTION_DIM
    env_state_dim: int | None = None  # the members' state before a fleet's member-id dims
    member_id_dims: int = 0
    instruction: bool = False  # observations carry a language instruction
    action_horizon: int = 1  # steps per action chunk the policy returns

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", {str(k): (int(v[0]), int(v[1])) for k, v in sorted(dict(self.cameras).items())})
        object.__setattr__(self, "active_dims", tuple(int(d) for d in self.active_dims))
        if self.env_state_dim is None:
            object.__setattr__(self, "env_state_dim", int(self.state_dim) - int(self.member_id_dims))
        if self.state_dim < 1 or not self.active_dims or self.action_horizon < 1:
            raise ValueError(f"an EnvSpec needs state_dim >= 1, active dims and a horizon >= 1: {self}")
        bad = [d for d in self.active_dims if not 0 <= d < self.contract_action_dim]
        if bad:
            raise ValueError(f"active action dims {bad} outside the {self.contract_action_dim}-D contract action")

    @property
    def action_dim(self) -> int:
        """Dims the policy acts on (the active ones)."""
        return len(self.active_dims)

    @classmethod
    def of_env(cls, env) -> EnvSpec:
        """The spec of one contract env or a batch of them (:mod:`rlinf_user.env.vector`)."""
        space = env.observation_space
        single = env.envs[0] if hasattr(env, "envs") else env
        active = [i for i, a in enumerate(single.action_spec.active) if a]
        return cls(
            state_dim=int(space["state"].shape[0]),
            cameras={k: tuple(v.shape[:2]) for k, v in space["images"].spaces.items()},
            active_dims=tuple(active),
            contract_action_dim=int(env.action_space.shape[0]),
            instruction=Col.INSTRUCTION in space.spaces,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain types (checkpoints, json); :meth:`from_dict` reads it back."""
        d = dataclasses.asdict(self)
        d["cameras"] = {k: list(v) for k, v in self.cameras.items()}
        d["active_dims"] = list(self.active_dims)
        d["action_dim"] = self.action_dim
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EnvSpec:
        """From :meth:`to_dict` (or a checkpoint written before this class: same keys)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in dict(d).items() if k in names}
        kw["cameras"] = {k: tuple(v) for k, v in dict(kw.get("cameras", {})).items()}
        kw["active_dims"] = tuple(kw.get("active_dims", range(int(d.get("action_dim", ACTION_DIM)))))
        return cls(**kw)

    def replace(self, **changes) -> EnvSpec:
        return dataclasses.replace(self, **changes)

    def expand_action(self, policy_action: np.ndarray) -> np.ndarray:
        """Policy output over the active dims -> the full contract action (zeros elsewhere)."""
        out = np.zeros((*policy_action.shape[:-1], self.contract_action_dim), dtype=np.float32)
        out[..., list(self.active_dims)] = policy_action
        return out

    def policy_action(self, contract_action: np.ndarray) -> np.ndarray:
        """The active dims of contract actions (demonstrations, human corrections)."""
        a = np.asarray(contract_action, dtype=np.float32)
        return a if len(self.active_dims) == a.shape[-1] else a[..., list(self.active_dims)]


def instruction_array(texts, n: int | None = None) -> np.ndarray:
    """Instructions as a unicode array as wide as the longest (storable without pickle)."""
    arr = np.asarray(["" if t is None else str(t) for t in texts], dtype=str)
    if arr.dtype.itemsize // 4 > MAX_INSTRUCTION_CHARS:
        raise ValueError(f"an instruction is longer than {MAX_INSTRUCTION_CHARS} characters")
    if n is not None and len(arr) != n:
        raise ValueError(f"{len(arr)} instructions for a batch of {n}")
    return arr


def batch_size(obs: Mapping[str, Any]) -> int:
    return int(np.asarray(obs[Col.STATE]).shape[0])


def index_obs(obs: Mapping[str, Any], i) -> dict[str, Any]:
    """Row(s) ``i`` of an observation batch (an int drops the batch axis)."""
    out: dict[str, Any] = {Col.STATE: obs[Col.STATE][i], Col.IMAGES: {k: v[i] for k, v in obs[Col.IMAGES].items()}}
    if "timestamps" in obs:
        out["timestamps"] = {k: v[i] for k, v in obs["timestamps"].items()}
    if Col.FEATURES in obs:
        out[Col.FEATURES] = {k: v[i] for k, v in obs[Col.FEATURES].items()}
    if Col.EMBEDDING in obs:
        out[Col.EMBEDDING] = obs[Col.EMBEDDING][i]
    if Col.INSTRUCTION in obs:
        out[Col.INSTRUCTION] = obs[Col.INSTRUCTION][i]
    return out


def stack_obs(rows) -> dict[str, Any]:
    """Single observations -> one batch."""
    rows = list(rows)
    out: dict[str, Any] = {
        Col.STATE: np.stack([o[Col.STATE] for o in rows]),
        Col.IMAGES: {k: np.stack([o[Col.IMAGES][k] for o in rows]) for k in rows[0][Col.IMAGES]},
    }
    if "timestamps" in rows[0]:
        out["timestamps"] = {k: np.stack([o["timestamps"][k] for o in rows]) for k in rows[0]["timestamps"]}
    if Col.FEATURES in rows[0]:
        out[Col.FEATURES] = {k: np.stack([o[Col.FEATURES][k] for o in rows]) for k in rows[0][Col.FEATURES]}
    if Col.INSTRUCTION in rows[0]:
        out[Col.INSTRUCTION] = instruction_array([o[Col.INSTRUCTION] for o in rows])
    return out


def concat_obs(parts) -> dict[str, Any]:
    """Observation batches -> one batch (rows in order)."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    out: dict[str, Any] = {
        Col.STATE: np.concatenate([p[Col.STATE] for p in parts]),
        Col.IMAGES: {k: np.concatenate([p[Col.IMAGES][k] for p in parts]) for k in parts[0][Col.IMAGES]},
    }
    if Col.FEATURES in parts[0]:
        out[Col.FEATURES] = {k: np.concatenate([p[Col.FEATURES][k] for p in parts]) for k in parts[0][Col.FEATURES]}
    if Col.INSTRUCTION in parts[0]:
        out[Col.INSTRUCTION] = np.concatenate([np.asarray(p[Col.INSTRUCTION]) for p in parts])
    return out


def flat_obs(prefix: str, obs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """An observation batch as transition columns under ``prefix``."""
    out = {Col.state(prefix): np.asarray(obs[Col.STATE])}
    for k, v in obs[Col.IMAGES].items():
        out[Col.image(prefix, k)] = np.asarray(v)
    for k, v in obs.get(Col.FEATURES, {}).items():
        out[Col.feature(prefix, k)] = np.asarray(v)
    if Col.EMBEDDING in obs:
        out[f"{prefix}/{Col.EMBEDDING}"] = np.asarray(obs[Col.EMBEDDING])
    if Col.INSTRUCTION in obs:
        out[Col.instruction(prefix)] = instruction_array(obs[Col.INSTRUCTION])
    return out


def nest_columns(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Transition columns -> ``{"obs": batch, "next_obs": batch, "action": ..., ...}``."""
    out: dict[str, Any] = {}
    for key, val in flat.items():
        parts = key.split("/")
        if parts[0] in (Col.OBS, Col.NEXT_OBS):
            obs = out.setdefault(parts[0], {Col.IMAGES: {}})
            if parts[1] in (Col.IMAGES, Col.FEATURES):
                obs.setdefault(parts[1], {})[parts[2]] = val
            else:
                obs[parts[1]] = val
        else:
            out[key] = val
    return out


def obs_to_torch(obs: Mapping[str, Any], device="cpu") -> dict[str, Any]:
    """An observation batch as tensors on ``device`` (instructions stay strings)."""
    import torch

    out: dict[str, Any] = {
        Col.STATE: torch.as_tensor(np.asarray(obs[Col.STATE]), device=device).float(),
        Col.IMAGES: {k: torch.as_tensor(np.asarray(v), device=device) for k, v in obs[Col.IMAGES].items()},
    }
    if Col.FEATURES in obs:
        out[Col.FEATURES] = {k: torch.as_tensor(np.asarray(v), device=device) for k, v in obs[Col.FEATURES].items()}
    if Col.EMBEDDING in obs:
        out[Col.EMBEDDING] = torch.as_tensor(np.asarray(obs[Col.EMBEDDING]), device=device).float()
    if Col.INSTRUCTION in obs:
        out[Col.INSTRUCTION] = [str(t) for t in np.asarray(obs[Col.INSTRUCTION]).reshape(-1)]
    return out


def index_obs_torch(obs: Mapping[str, Any], idx) -> dict[str, Any]:
    """Rows ``idx`` (a tensor of indices) of a batch from :func:`obs_to_torch`."""
    out: dict[str, Any] = {Col.STATE: obs[Col.STATE][idx], Col.IMAGES: {k: v[idx] for k, v in obs[Col.IMAGES].items()}}
    if Col.FEATURES in obs:
        out[Col.FEATURES] = {k: v[idx] for k, v in obs[Col.FEATURES].items()}
    if Col.EMBEDDING in obs:
        out[Col.EMBEDDING] = obs[Col.EMBEDDING][idx]
    if Col.INSTRUCTION in obs:
        texts = obs[Col.INSTRUCTION]
        out[Col.INSTRUCTION] = [texts[int(i)] for i in idx.tolist()]
    return out


def columns_to_torch(flat: Mapping[str, np.ndarray], device="cpu") -> dict[str, Any]:
    """Transition columns -> nested tensors (observations via :func:`obs_to_torch`;
    float64 and bool columns as float32)."""
    import torch

    nested = nest_columns(flat)
    out: dict[str, Any] = {}
    for key, val in nested.items():
        if key in (Col.OBS, Col.NEXT_OBS):
            out[key] = obs_to_torch(val, device)
        else:
            t = torch.as_tensor(np.asarray(val), device=device)
            out[key] = t.float() if t.dtype in (torch.float64, torch.bool) else t
    return out
