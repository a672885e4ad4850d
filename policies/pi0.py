"""``policy=pi0``: the pi0-style flow VLA (:mod:`rlinf_user.policies.pi0_model`) behind the
policy interface.

It acts on contract observations: each env camera (uint8 HxWx3) is resized with padding to
the model's image size and scaled to [-1, 1] (openpi's ``resize_with_pad``), model image
slots the env has no camera for are masked out; the state is normalised with the
checkpoint's statistics and zero-padded to the model's state width; the observation's
``instruction`` (or ``policy.prompt``) is tokenised (:mod:`rlinf_user.policies.vla_text`).
It returns a chunk of ``H`` actions: the model's first ``action_dim`` outputs,
un-normalised, clipped to the contract's [-1, 1]. Extras: the initial ``noise`` of the
flow (what a flow log-prob or a replay of the sample needs).

``policy.checkpoint=<folder>`` loads an openpi or LeRobot pi0 folder (its config decides the
sizes); without one, ``policy.size`` (``tiny`` | ``small`` | ``pi0``) builds a randomly initialised model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rlinf_user.env.spec import EnvSpec
from rlinf_user.policies.base import Policy, PolicyOutput
from rlinf_user.policies.pi0_checkpoint import NormStats, check_norm_stats, load_pi0
from rlinf_user.policies.pi0_model import Pi0Config, Pi0Model
from rlinf_user.policies.vla_text import PromptTokenizer, open_tokenizer


def resize_with_pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, size, size) in [-1, 1]: the aspect ratio kept, the
    short side centred and padded with -1 (black)."""
    x = images.permute(0, 3, 1, 2).float() / 127.5 - 1.0
    h, w = x.shape[-2:]
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    if (nh, nw) != (h, w):
        x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)
    top, left = (size - nh) // 2, (size - nw) // 2
    return F.pad(x, (left, size - nw - left, top, size - nh - top), value=-1.0)


def identity_stats(dim: int) -> NormStats:
    return NormStats(np.zeros(dim, np.float32), np.ones(dim, np.float32) - 1e-6)


class Pi0Policy(Policy):
    def __init__(self, spec: EnvSpec, model: Pi0Model, norm: dict[str, NormStats], prompt: PromptTokenizer,
                 cameras: list[str], default_prompt: str = ""):  # fmt: skip
        super().__init__(spec)
        cfg = model.cfg
        if spec.action_dim > cfg.action_dim or spec.state_dim > cfg.state_dim:
            raise ValueError(
                f"the env's state ({spec.state_dim}) / action ({spec.action_dim}) dims exceed the model's "
                f"padded widths ({cfg.state_dim} / {cfg.action_dim})"
            )
        if prompt.vocab_size > cfg.vocab_size:
            raise ValueError(f"the tokenizer has {prompt.vocab_size} ids, the model's vocabulary {cfg.vocab_size}")
        check_norm_stats(norm, spec.state_dim, spec.action_dim)
        unknown = [c for c in cameras if c not in spec.cameras]
        if unknown or len(cameras) > cfg.num_cameras:
            raise ValueError(
                f"policy.cameras={cameras}: the env has {sorted(spec.cameras)} and the model {cfg.num_cameras} image slots"
            )
        self.model = model
        self.norm = norm
        self.prompt = prompt
        self.cameras = list(cameras)
        self.default_prompt = default_prompt
        self.horizon = cfg.horizon
        self.image_size = model.paligemma_with_expert.paligemma.config.vision_config.image_size
        for key in ("state", "actions"):  # the statistics travel with the weights
            s = norm[key]
            self.register_buffer(f"{key}_mean", torch.as_tensor(s.mean, dtype=torch.float32))
            self.register_buffer(f"{key}_std", torch.as_tensor(s.std, dtype=torch.float32))

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> Pi0Policy:
        get = policy_cfg.get if hasattr(policy_cfg, "get") else lambda k, d=None: getattr(policy_cfg, k, d)
        over = {k: int(get(k)) for k in ("horizon", "num_steps") if get(k) is not None}
        if get("checkpoint"):
            model, norm = load_pi0(get("checkpoint"), get("asset_id"), **over)
        else:
            size = str(get("size") or "tiny")
            if size not in ("tiny", "small", "pi0"):
                raise ValueError(f"policy.size={size!r}: tiny, small or pi0 (or set policy.checkpoint=<folder>)")
            cfg = getattr(Pi0Config, size)(**over)
            model = Pi0Model(cfg)
            norm = {"state": identity_stats(cfg.state_dim), "actions": identity_stats(cfg.action_dim)}
        cameras = list(get("cameras") or sorted(spec.cameras))[: model.cfg.num_cameras]
        prompt = PromptTokenizer(open_tokenizer(get("tokenizer")), model.cfg.max_token_len)
        return cls(spec, model, norm, prompt, cameras, str(get("prompt") or ""))

    # -- inputs ---------------------------------------------------------------------------
    def model_inputs(self, obs: dict[str, Any]):
        state = obs["state"].float()
        b, dev = state.shape[0], state.device
        images, masks = [], []
        for i in range(self.model.cfg.num_cameras):
            if i < len(self.cameras):
                images.append(resize_with_pad(obs["images"][self.cameras[i]].to(dev), self.image_size))
                masks.append(torch.ones(b, dtype=torch.bool, device=dev))
            else:  # a slot this env has no camera for: a black image, masked out
                images.append(torch.full((b, 3, self.image_size, self.image_size), -1.0, device=dev))
                masks.append(torch.zeros(b, dtype=torch.bool, device=dev))
        prompts = obs.get("instruction") or [self.default_prompt] * b
        tokens, token_mask = self.prompt(list(prompts), dev)
        n = state.shape[-1]
        s = (state - self.state_mean[:n]) / (self.state_std[:n] + 1e-6)
        s = F.pad(s, (0, self.model.cfg.state_dim - n))
        return images, masks, tokens, token_mask, s

    def normalise_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions (..., action_dim) -> the model's normalised, padded targets."""
        n = actions.shape[-1]
        a = (actions - self.actions_mean[:n]) / (self.actions_std[:n] + 1e-6)
        return F.pad(a, (0, self.model.cfg.action_dim - n))

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        images, masks, tokens, token_mask, state = self.model_inputs(obs)
        b, cfg = state.shape[0], self.model.cfg
        noise = torch.zeros if deterministic else torch.randn
        x0 = noise(b, cfg.horizon, cfg.action_dim, device=state.device)
        out, _ = self.model.sample_actions(images, masks, tokens, token_mask, state, noise=x0)
        n = self.spec.action_dim
        actions = out[..., :n] * (self.actions_std[:n] + 1e-6) + self.actions_mean[:n]
        return PolicyOutput(actions.clamp(-1.0, 1.0), {"noise": x0})

    def flow_loss(self, obs: dict[str, Any], chunk: torch.Tensor) -> torch.Tensor:
        """Flow-matching loss toward env action chunks ``(B, H, action_dim)``."""
        images, masks, tokens, token_mask, state = self.model_inputs(obs)
        return self.model.flow_loss(images, masks, tokens, token_mask, state, self.normalise_actions(chunk)).mean()
