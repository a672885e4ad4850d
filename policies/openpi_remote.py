"""``policy=openpi_remote``: an openpi policy server (``scripts/serve_policy.py``) as the policy.

For users who already serve a pi0/pi0.5 checkpoint with openpi on a GPU box; the wire format,
timeouts and reconnection are :mod:`rlinf_user.policies.openpi_client`'s.

Which contract observation goes under which request key is configured, because each openpi
example names them differently (``policy.request``; e.g. LIBERO:
``{"observation/image": "images.front", "observation/wrist_image": "images.wrist",
"observation/state": "state", "prompt": "instruction"}``); a mapping that asks for a camera
or an instruction the env does not have is refused when the policy is built. The returned
chunk must have the contract's ``action_dim`` columns in [-1, 1]: surplus columns and values
out of range are refused unless ``policy.surplus_actions=drop`` / ``policy.out_of_range=clip``
say otherwise (the edge's limits still hold whatever the policy says). Inference only: the
weights live on the server and do not update.

Steering (``algo=dsrl`` over a served pi0): openpi's ``Policy.infer(obs, noise=...)`` takes
the flow's initial noise, in the model's own space (``action_horizon x action_dim``, e.g.
50 x 32 for pi0), but openpi's server calls ``infer(obs)`` only. A server started with
``scripts/serve_openpi_steerable.py`` (openpi's ``serve_policy.py`` with the policy
wrapped) passes a request's ``noise`` entry through and says ``noise_shape`` in its
metadata. ``policy.noise_shape=[H, D]`` makes this policy steerable (``act_from_noise``
sends the noise with each observation); a server whose metadata names another shape, or
none, is refused at the first connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.base import Policy, PolicyOutput
from rlinf_user.policies.openpi_client import OpenpiClient, OpenpiServerError, Timeouts

__all__ = ["DEFAULT_REQUEST", "OpenpiRemotePolicy", "OpenpiRemotePolicyConfig", "OpenpiServerError"]

RANGE_SLACK = 1e-4  # float noise at the edges of [-1, 1] is not "out of range"


def _lookup(obs: Mapping[str, Any], path: str, i: int) -> Any:
    """``state``, ``instruction`` or ``images.<camera>`` of row ``i``."""
    if path == "instruction":
        texts = obs.get(Col.INSTRUCTION)
        if texts is None:
            raise KeyError("policy.request asks for the instruction, but the env gives none (set env.instruction)")
        return str(texts[i])
    if path == "state":
        return np.asarray(obs[Col.STATE][i].cpu().numpy() if torch.is_tensor(obs[Col.STATE]) else obs[Col.STATE][i], np.float32)
    if path.startswith("images."):
        cam = path.split(".", 1)[1]
        if cam not in obs[Col.IMAGES]:
            raise KeyError(f"policy.request asks for camera {cam!r}; the env has {sorted(obs[Col.IMAGES])}")
        img = obs[Col.IMAGES][cam][i]
        return np.asarray(img.cpu().numpy() if torch.is_tensor(img) else img, np.uint8)
    raise KeyError(f"policy.request value {path!r}: use state, instruction or images.<camera>")


#: the request of openpi's DROID/LIBERO-style examples (two cameras, the state, the prompt)
DEFAULT_REQUEST = {
    "observation/image": "images.front", "observation/wrist_image": "images.wrist",
    "observation/state": "state", "prompt": "instruction",
}  # fmt: skip


@dataclass
class OpenpiRemotePolicyConfig:
    """``policy=openpi_remote``: an openpi policy server (serve_policy.py) answers."""

    name: str = "openpi_remote"
    server: str | None = None  # ws://<host>:<port>
    api_key: str | None = None
    horizon: int | None = None  # actions of each answered chunk executed (None: all)
    # openpi request key -> state | instruction | images.<camera>; None: DEFAULT_REQUEST. A
    # mapping given on the command line replaces the default whole (a default mapping here
    # would be merged with it, keeping keys for cameras the env may not have)
    request: Any = None
    surplus_actions: str = "refuse"  # refuse | drop: a reply with more columns than the env's actions
    out_of_range: str = "refuse"  # refuse | clip: a reply with values outside [-1, 1]
    timeouts: Timeouts = field(default_factory=Timeouts)
    # [H, D]: the initial noise the server's flow takes (scripts/serve_openpi_steerable.py);
    # None: not steerable
    noise_shape: Any = None
    noise_key: str = "noise"  # the request entry the steerable server reads the noise from
    connect: str = "now"  # now | first_use: the learner of algo=dsrl builds it for its shapes only


def _check_request(request: Mapping[str, str], spec: EnvSpec) -> None:
    """Every value names something this env gives, or the policy is not built."""
    for key, path in request.items():
        path = str(path)
        if path == "instruction":
            if not spec.instruction:
                raise ValueError(f"policy.request maps {key!r} to the instruction, but the env gives none "
                                 "(set env.instruction=..., or leave the key out of policy.request)")  # fmt: skip
        elif path.startswith("images."):
            if path.split(".", 1)[1] not in spec.cameras:
                raise ValueError(f"policy.request maps {path!r}, but the env has cameras {sorted(spec.cameras)}")
        elif path != "state":
            raise ValueError(f"policy.request value {path!r} (key {key!r}): use state, instruction or images.<camera>")


class OpenpiRemotePolicy(Policy):
    config = OpenpiRemotePolicyConfig

    def __init__(self, spec: EnvSpec, uri: str, request: Mapping[str, str], api_key: str | None = None,
                 horizon: int | None = None, surplus_actions: str = "refuse", out_of_range: str = "refuse",
                 timeouts: Timeouts | None = None, noise_shape=None, noise_key: str = "noise",
                 connect: str = "now"):  # fmt: skip
        super().__init__(spec)
        if not request:
            raise ValueError("policy=openpi_remote needs policy.request: {openpi key: state | instruction | images.<camera>}")
        if surplus_actions not in ("refuse", "drop"):
            raise ValueError(f"policy.surplus_actions={surplus_actions!r}: refuse or drop")
        if out_of_range not in ("refuse", "clip"):
            raise ValueError(f"policy.out_of_range={out_of_range!r}: refuse or clip")
        _check_request(request, spec)
        self.request = {str(k): str(v) for k, v in request.items()}
        self.surplus_actions, self.out_of_range = surplus_actions, out_of_range
        if connect not in ("now", "first_use"):
            raise ValueError(f"policy.connect={connect!r}: now or first_use")
        if noise_shape is not None and (len(noise_shape) != 2 or min(int(x) for x in noise_shape) < 1):
            raise ValueError(f"policy.noise_shape={list(noise_shape)}: [action_horizon, model action_dim]")
        self._noise_shape = None if noise_shape is None else (int(noise_shape[0]), int(noise_shape[1]))
        self.noise_key = str(noise_key)
        self.uri, self.api_key, self.timeouts = uri, api_key, timeouts
        self._client: OpenpiClient | None = None
        if connect == "now":
            self._connect()
        self.fixed_horizon = int(horizon) if horizon else None  # None: the whole chunk the server returns
        self.horizon = self.fixed_horizon or 1

    @property
    def client(self) -> OpenpiClient:
        if self._client is None:
            self._connect()
        return self._client

    def _connect(self) -> None:
        client = OpenpiClient(self.uri, self.api_key, self.timeouts)
        if self._noise_shape is not None:
            said = client.metadata.get("noise_shape") if isinstance(client.metadata, Mapping) else None
            if said is None or tuple(int(x) for x in said) != self._noise_shape:
                client.close()
                raise OpenpiServerError(
                    f"policy.noise_shape={list(self._noise_shape)}, but the openpi server at {self.uri} "
                    + ("takes no noise (start it with scripts/serve_openpi_steerable.py)" if said is None
                       else f"takes noise of shape {list(said)}")  # fmt: skip
                )
        self._client = client

    @property
    def noise_shape(self) -> tuple[int, int]:
        """The served flow's initial noise, one row's (steered by ``algo=dsrl``)."""
        if self._noise_shape is None:
            raise AttributeError("policy=openpi_remote is steerable with policy.noise_shape=[H, D] set")
        return self._noise_shape

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> OpenpiRemotePolicy:
        uri = str(policy_cfg.get("server") or "")
        if not uri:
            raise ValueError("policy=openpi_remote needs policy.server=ws://<host>:<port> (openpi's serve_policy.py)")
        request = dict(policy_cfg.get("request") or DEFAULT_REQUEST)
        t = policy_cfg.get("timeouts") or {}
        timeouts = Timeouts(**{k: float(v) for k, v in dict(t).items()})
        for k, v in vars(timeouts).items():
            if not v > 0:
                raise ValueError(f"policy.timeouts.{k}={v}: seconds, > 0")
        noise_shape = policy_cfg.get("noise_shape")
        return cls(spec, uri if uri.startswith("ws") else f"ws://{uri}", request, policy_cfg.get("api_key"),
                   policy_cfg.get("horizon"), str(policy_cfg.get("surplus_actions", "refuse")),
                   str(policy_cfg.get("out_of_range", "refuse")), timeouts,
                   None if noise_shape is None else list(noise_shape), str(policy_cfg.get("noise_key", "noise")),
                   str(policy_cfg.get("connect", "now")))  # fmt: skip

    def _chunk(self, reply: Mapping[str, Any], want: int | None) -> np.ndarray:
        """The reply's actions as ``(h, action_dim)``, or an error saying what does not fit."""
        a = self.spec.action_dim
        where = f"the openpi server at {self.uri}"
        if "actions" not in reply:
            raise OpenpiServerError(f"{where} answered without 'actions' (keys: {sorted(map(str, reply))})")
        actions = np.asarray(reply["actions"], np.float32)
        if actions.ndim == 1:
            actions = actions[None]
        h = want or (self.fixed_horizon or (len(actions) if actions.ndim == 2 else 0))
        if actions.ndim != 2 or actions.shape[0] < h or actions.shape[1] < a:
            raise OpenpiServerError(f"{where} returned actions of shape {actions.shape}; need ({h}, {a}) "
                                    "(policy.horizon: steps of each chunk to execute)")  # fmt: skip
        if actions.shape[1] > a and self.surplus_actions == "refuse":
            raise OpenpiServerError(
                f"{where} returned {actions.shape[1]} action columns; this env takes {a} "
                f"(policy.surplus_actions=drop keeps the first {a}, if those are the env's actions)"
            )
        actions = actions[:h, :a]
        if not np.isfinite(actions).all():
            raise OpenpiServerError(f"{where} returned non-finite actions")
        worst = float(np.abs(actions).max(initial=0.0))
        if worst > 1.0 + RANGE_SLACK:
            if self.out_of_range == "refuse":
                raise OpenpiServerError(
                    f"{where} returned actions up to {worst:.3g} in size; the env's actions are in [-1, 1] "
                    "(scaled to its limits): map the server's units, or policy.out_of_range=clip"
                )
        return np.clip(actions, -1.0, 1.0)

    def _ask(self, obs: dict[str, Any], noise: torch.Tensor | None = None) -> torch.Tensor:
        """One request per row; the reply's chunk (its first ``policy.horizon`` steps, or all
        of it). A shorter reply is refused: a chunk is never padded with invented actions."""
        chunks: list[np.ndarray] = []
        for i in range(len(obs[Col.STATE])):
            request = {key: _lookup(obs, path, i) for key, path in self.request.items()}
            if noise is not None:
                request[self.noise_key] = noise[i].detach().cpu().numpy().astype(np.float32)
            chunks.append(self._chunk(self.client.infer(request), len(chunks[0]) if chunks else None))
        self.horizon = len(chunks[0])
        return torch.from_numpy(np.stack(chunks))

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        return PolicyOutput(self._ask(obs))

    @torch.no_grad()
    def act_from_noise(self, obs: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
        """The served flow from the given initial noise ``(B, H, D)``: ``(B, h, action_dim)``."""
        if tuple(noise.shape[1:]) != self.noise_shape:
            raise ValueError(f"noise of shape {tuple(noise.shape[1:])}; the served flow takes {self.noise_shape}")
        return self._ask(obs, noise)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
