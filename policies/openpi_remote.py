"""``policy=openpi_remote``: an openpi policy server (``scripts/serve_policy.py``) as the policy.

For users who already serve a pi0/pi0.5 checkpoint with openpi on a GPU box. The server's
wire format (openpi's ``websocket_policy_server`` and its ``openpi-client`` package):

* a websocket (no compression, no size limit); optional ``Authorization: Api-Key <key>``;
* on connect the server sends one binary frame: its metadata, msgpack;
* per request the client sends one observation dict, msgpack, and receives the action dict
  (``{"actions": (H, A), ...timing}``); an error arrives as a text frame (the traceback)
  and the server closes the connection;
* numpy arrays travel as msgpack maps ``{b"__ndarray__": True, b"data": raw bytes,
  b"dtype": dtype.str, b"shape": shape}``, numpy scalars as ``{b"__npgeneric__": True,
  b"data": value, b"dtype": dtype.str}``.

``openpi-client`` itself pins numpy<2 and cannot share this environment, so the format is
spoken here directly (the tests run against a server that implements it independently).

Which contract observation goes under which request key is configured, because each openpi
example names them differently (``policy.request``; e.g. LIBERO:
``{"observation/image": "images.front", "observation/wrist_image": "images.wrist",
"observation/state": "state", "prompt": "instruction"}``). The returned chunk's first
``action_dim`` columns are the contract's actions, clipped to [-1, 1]. Inference only: the
weights live on the server and do not update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import torch

from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.base import Policy, PolicyOutput


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "VOc":
            raise ValueError(f"cannot send an array of dtype {obj.dtype} to an openpi server")
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send {type(obj).__name__} to an openpi server")


def _unpack_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=tuple(obj[b"shape"]))
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_pack_default)


def unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, object_hook=_unpack_hook)


class OpenpiServerError(RuntimeError):
    """The server answered with an error (its traceback) or went away."""


class OpenpiClient:
    """One connection to an openpi policy server."""

    def __init__(self, uri: str, api_key: str | None = None, open_timeout: float = 10.0):
        from websockets.sync.client import connect

        headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        self._stack = contextlib.ExitStack()  # the connection is a context manager
        try:
            self.ws = self._stack.enter_context(
                connect(uri, compression=None, max_size=None, additional_headers=headers, open_timeout=open_timeout)
            )
        except (OSError, TimeoutError) as err:
            raise OpenpiServerError(f"no openpi policy server at {uri}: {err}") from err
        self.metadata = unpackb(self.ws.recv())

    def infer(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(packb(dict(obs)))
            reply = self.ws.recv()
        except ConnectionClosed as err:
            raise OpenpiServerError(f"the openpi server closed the connection: {err}") from err
        if isinstance(reply, str):
            raise OpenpiServerError(f"the openpi server failed:\n{reply}")
        return reply if isinstance(reply, dict) else unpackb(reply)

    def close(self) -> None:
        self._stack.close()


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


class OpenpiRemotePolicy(Policy):
    config = OpenpiRemotePolicyConfig

    def __init__(self, spec: EnvSpec, uri: str, request: Mapping[str, str], api_key: str | None = None,
                 horizon: int | None = None):  # fmt: skip
        super().__init__(spec)
        if not request:
            raise ValueError("policy=openpi_remote needs policy.request: {openpi key: state | instruction | images.<camera>}")
        for path in request.values():
            if path.startswith("images.") and path.split(".", 1)[1] not in spec.cameras:
                raise ValueError(f"policy.request maps {path!r}, but the env has cameras {sorted(spec.cameras)}")
        self.request = dict(request)
        self.client = OpenpiClient(uri, api_key)
        self.fixed_horizon = int(horizon) if horizon else None  # None: the whole chunk the server returns
        self.horizon = self.fixed_horizon or 1

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> OpenpiRemotePolicy:
        uri = str(policy_cfg.get("server") or "")
        if not uri:
            raise ValueError("policy=openpi_remote needs policy.server=ws://<host>:<port> (openpi's serve_policy.py)")
        request = dict(policy_cfg.get("request") or DEFAULT_REQUEST)
        return cls(spec, uri if uri.startswith("ws") else f"ws://{uri}", request, policy_cfg.get("api_key"), policy_cfg.get("horizon"))

    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        """One request per row; the reply's chunk (its first ``policy.horizon`` steps, or all
        of it). A shorter reply is refused: a chunk is never padded with invented actions."""
        b = len(obs[Col.STATE])
        chunks = []
        for i in range(b):
            reply = self.client.infer({key: _lookup(obs, path, i) for key, path in self.request.items()})
            actions = np.asarray(reply.get("actions"), np.float32)
            if actions.ndim == 1:
                actions = actions[None]
            h = self.fixed_horizon or len(actions)
            if actions.ndim != 2 or actions.shape[0] < h or actions.shape[1] < self.spec.action_dim or (chunks and h != len(chunks[0])):
                raise OpenpiServerError(
                    f"the openpi server returned actions of shape {actions.shape}; need "
                    f"({h}, >= {self.spec.action_dim}) (policy.horizon: steps of each chunk to execute)"
                )
            if not np.isfinite(actions).all():
                raise OpenpiServerError("the openpi server returned non-finite actions")
            chunks.append(actions[:h, : self.spec.action_dim])
        self.horizon = len(chunks[0])
        return PolicyOutput(torch.from_numpy(np.clip(np.stack(chunks), -1.0, 1.0)))

    def close(self) -> None:
        self.client.close()
