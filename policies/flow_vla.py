"""A flow VLA (:class:`rlinf_user.policies.flow_core.JointFlowModel`) behind the policy interface.

Shared by ``policy=pi0`` and ``policy=lite_vla``; a subclass says how a camera frame becomes
a model image (:meth:`FlowVLAPolicy.preprocess`) and how it is built from its config.

* **Inputs**: each configured camera (uint8 HxWx3) is preprocessed, model image slots the
  env has no camera for are masked out; the state is normalised with the statistics that
  travel with the weights and zero-padded to the model's width; the observation's
  ``instruction`` (else ``policy.prompt``) is tokenised, an over-budget one refused.
* **Acting**: a chunk of ``H`` actions, the model's first ``action_dim`` outputs
  un-normalised and clipped to the contract's [-1, 1]. Deterministic acting integrates the
  ODE from zero noise. Stochastic acting samples the Flow-Noise chain (piRL): every
  denoising step adds Gaussian noise whose std a small head (:class:`NoiseHead`) reads from
  the expert, so the chain has a log-density. Extras: ``sample`` (the chain, K + 1 steps of
  the normalised padded chunk), ``log_prob`` (per executed element, summed over the K
  transitions: PPO clips each element's ratio), ``value``.
* **Value**: an MLP over the expert's output at the state token (it sees the prefix and
  the state, not the noisy actions), its input detached from the expert by default.
* **Training**: ``policy.finetune`` = ``expert`` (vision tower and VLM frozen: the prefix
  runs without gradients), ``lora`` (LoRA adapters on the VLM's attention projections,
  peft) or ``full``. The expert, the projections and the heads always train.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.policies.base import Policy, PolicyOutput
from rlinf_user.policies.chunk_graph import ChunkGraphs, graph_mode, storage_fingerprint
from rlinf_user.policies.flow_core import JointFlowModel, NoiseHead, value_mlp, value_out
from rlinf_user.policies.pi0_checkpoint import NormStats, check_norm_stats
from rlinf_user.policies.vla_text import PromptTokenizer

FINETUNE = ("expert", "lora", "full")


def apply_finetune(mode: str, frozen: list[torch.nn.Module], lora_target: torch.nn.Module | None, rank: int = 8) -> None:
    """``full``: everything trains; otherwise ``frozen`` is frozen, and ``lora`` adds peft's
    LoRA adapters to the attention projections of ``lora_target`` (they train)."""
    if mode == "full":
        return
    for m in frozen:
        m.requires_grad_(False)
    if mode == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        conf = LoraConfig(r=int(rank), lora_alpha=2 * int(rank), target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        inject_adapter_in_model(conf, lora_target)


def cfg_getter(policy_cfg):
    return policy_cfg.get if hasattr(policy_cfg, "get") else lambda k, d=None: getattr(policy_cfg, k, d)


@dataclass
class FlowVLAPolicyConfig:
    """The keys every flow VLA (``pi0``, ``lite_vla``) shares."""

    horizon: int | None = None  # actions per chunk (None: the model's)
    num_steps: int | None = None  # denoising steps per chunk (None: the model's)
    cameras: list[str] | None = None  # env cameras for the model's image slots, in order (None: all, sorted)
    prompt: str = ""  # the instruction when the env gives none
    # training (HG-DAgger's flow-matching loss, PPO): expert = vision + VLM frozen;
    # lora = LoRA adapters (rank lora_rank) on the VLM's attention; full = everything
    finetune: str = "expert"
    lora_rank: int = 8
    noise_std: list[float] = field(default_factory=lambda: [0.08, 0.16])  # Flow-Noise step std bounds (PPO)
    detach_critic: bool = True  # the value head's input carries no gradient into the expert
    compile: str | None = None  # torch.compile the denoising step (an inductor mode or a backend)
    # acting on a GPU: the whole chunk as one CUDA-graph replay per input shape (auto: on a
    # CUDA device, eager elsewhere; on: refused off a GPU; off: eager). policies/chunk_graph.py
    cuda_graph: str = "auto"
    value_per_action: bool = False  # a value per action of a chunk (set by algo.credit=action)


class FlowVLAPolicy(Policy):
    """Scores recorded chains, has a value function, BC-trainable on action chunks."""

    def __init__(self, spec: EnvSpec, model: JointFlowModel, norm: dict[str, NormStats], prompt: PromptTokenizer,
                 cameras: list[str], default_prompt: str = "", *, num_cameras: int, expert_width: int,
                 finetune: str = "expert", noise_std: tuple[float, float] = (0.08, 0.16),
                 detach_critic: bool = True, lora_rank: int = 8, value_per_action: bool = False,
                 compile: str | None = None, cuda_graph: str | bool | None = "auto"):  # fmt: skip
        super().__init__(spec)
        cfg = model.cfg
        if spec.action_dim > cfg.action_dim or spec.state_dim > cfg.state_dim:
            raise ValueError(
                f"the env's state ({spec.state_dim}) / action ({spec.action_dim}) dims exceed the model's "
                f"padded widths ({cfg.state_dim} / {cfg.action_dim}); a VLA reads cameras and the robot's own state: "
                "give the env a camera (a ManiSkill env with env.cameras=[...] leaves the objects' poses out of its state)"
            )
        if prompt.vocab_size > self.vocab_size_of(model):
            raise ValueError(f"the tokenizer has {prompt.vocab_size} ids, the model's vocabulary {self.vocab_size_of(model)}")
        check_norm_stats(norm, spec.state_dim, spec.action_dim)
        unknown = [c for c in cameras if c not in spec.cameras]
        if unknown or len(cameras) > num_cameras:
            raise ValueError(f"policy.cameras={cameras}: the env has {sorted(spec.cameras)} and the model {num_cameras} image slots")
        if finetune not in FINETUNE:
            raise ValueError(f"policy.finetune={finetune!r}: one of {', '.join(FINETUNE)}")
        self.model = model
        self.norm = norm
        self.prompt = prompt
        self.cameras = list(cameras)
        self.num_cameras = int(num_cameras)
        self.default_prompt = default_prompt
        self.horizon = cfg.horizon
        self.finetune = finetune
        self.detach_critic = bool(detach_critic)
        self.noise_head = NoiseHead(expert_width, cfg.action_dim, spec.action_dim, *noise_std)
        # action-level credit: a value per action of the chunk (from the chunk's observation)
        self.value_head = value_mlp(expert_width, out=cfg.horizon if value_per_action else 1)
        for key in ("state", "actions"):  # the statistics travel with the weights
            s = norm[key]
            self.register_buffer(f"{key}_mean", torch.as_tensor(s.mean, dtype=torch.float32))
            self.register_buffer(f"{key}_std", torch.as_tensor(s.std, dtype=torch.float32))
        self.fresh_stats = bool(np.all(norm[Col.STATE].mean == 0) and np.allclose(norm[Col.STATE].std, 1, atol=1e-5))
        self.set_finetune(finetune, lora_rank)
        self.cuda_graph = graph_mode(cuda_graph)
        if compile and self.cuda_graph == "on":
            raise ValueError(f"policy.compile={compile} and policy.cuda_graph=on: choose one (a compiled step with "
                             "mode=reduce-overhead captures its own graphs)")  # fmt: skip
        if compile:  # after the adapters: the compiled step is the model as it trains
            model.compile_denoising(str(compile))
            self.cuda_graph = "off"
        self._graphs: ChunkGraphs | None = None

    @staticmethod
    def vocab_size_of(model) -> int:
        return int(model.cfg.vocab_size)

    # -- what trains ------------------------------------------------------------------------
    def frozen_modules(self) -> list[torch.nn.Module]:  # pragma: no cover
        """The vision tower and VLM (frozen with ``finetune=expert``)."""
        raise NotImplementedError

    def lora_targets(self) -> torch.nn.Module:  # pragma: no cover
        """The module whose attention projections get LoRA adapters."""
        raise NotImplementedError

    def set_finetune(self, mode: str, rank: int = 8) -> None:
        apply_finetune(mode, self.frozen_modules(), self.lora_targets() if mode == "lora" else None, rank)

    def prefix_grad(self) -> bool:
        return self.finetune != "expert" and torch.is_grad_enabled()

    # -- inputs ---------------------------------------------------------------------------
    def preprocess(self, frames: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """(B, H, W, 3) uint8 -> the model's image tensor (B, 3, S, S)."""
        raise NotImplementedError

    def raw_inputs(self, obs: dict[str, Any]) -> list[torch.Tensor]:
        """The host's part of the inputs: ``[state, tokens, token_mask, *frames]`` on the
        state's device (the instruction tokenised; the frames as the cameras gave them)."""
        state = obs[Col.STATE].float()
        b, dev = state.shape[0], state.device
        prompts = obs.get(Col.INSTRUCTION) or [self.default_prompt] * b
        tokens, token_mask = self.prompt(list(prompts), dev)
        return [state, tokens, token_mask, *(obs[Col.IMAGES][c].to(dev) for c in self.cameras)]

    def device_inputs(self, state, tokens, token_mask, *frames):
        """The model's inputs from :meth:`raw_inputs`, all on the device: each camera
        preprocessed (model slots the env has no camera for left out of the prefix, so
        nothing is read back to the host), the state normalised and padded."""
        b, dev = state.shape[0], state.device
        images = [self.preprocess(f) for f in frames] + [None] * (self.num_cameras - len(frames))
        masks = [torch.ones(b, dtype=torch.bool, device=dev)] * len(frames) + [None] * (self.num_cameras - len(frames))
        n = state.shape[-1]
        s = (state - self.state_mean[:n]) / (self.state_std[:n] + 1e-6)
        s = F.pad(s, (0, self.model.cfg.state_dim - n))
        return images, masks, tokens, token_mask, s

    def model_inputs(self, obs: dict[str, Any]):
        return self.device_inputs(*self.raw_inputs(obs))

    def prefix(self, obs: dict[str, Any]):
        """(cache, pad, normalised state) of a batch of observations."""
        images, masks, tokens, token_mask, state = self.model_inputs(obs)
        with torch.set_grad_enabled(self.prefix_grad()):
            cache, pad = self.model.prefix(images, masks, tokens, token_mask)
        return cache, pad, state

    def normalise_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions (..., action_dim) -> the model's normalised, padded targets."""
        n = actions.shape[-1]
        a = (actions - self.actions_mean[:n]) / (self.actions_std[:n] + 1e-6)
        return F.pad(a, (0, self.model.cfg.action_dim - n))

    def env_actions(self, x: torch.Tensor) -> torch.Tensor:
        n = self.spec.action_dim
        return (x[..., :n] * (self.actions_std[:n] + 1e-6) + self.actions_mean[:n]).clamp(-1.0, 1.0)

    # -- acting ---------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        raw = self.raw_inputs(obs)
        if deterministic:  # the ODE from zero noise
            cfg = self.model.cfg
            noise = torch.zeros(raw[0].shape[0], cfg.horizon, cfg.action_dim, device=raw[0].device)
            (actions,) = self._chunk("flow", self._flow_chunk, [raw[0], noise, *raw[1:]])
            return PolicyOutput(actions, {})
        actions, sample, logp, value = self._chunk("chain", self._chain_chunk, raw)
        return PolicyOutput(actions, {Col.SAMPLE: sample, Col.LOG_PROB: logp, Col.VALUE: value})

    def _flow_chunk(self, state, noise, tokens, token_mask, *frames) -> tuple[torch.Tensor]:
        """One deterministic chunk from raw inputs and the initial noise (all tensors: what
        a CUDA graph captures)."""
        cache, pad, s = self._raw_prefix(state, tokens, token_mask, *frames)
        return (self.env_actions(self.model.denoise(cache, pad, s, noise)[-1]),)

    def _chain_chunk(self, state, tokens, token_mask, *frames) -> tuple[torch.Tensor, ...]:
        """One Flow-Noise chunk (its noise drawn inside): actions, the chain (B, K + 1, H, A),
        the per-element log-prob and the value."""
        cache, pad, s = self._raw_prefix(state, tokens, token_mask, *frames)
        cfg = self.model.cfg
        noise = torch.randn(s.shape[0], cfg.horizon, cfg.action_dim, device=s.device)
        chain, logp = self.model.denoise(cache, pad, s, noise, noise_head=self.noise_head)
        sample = chain.transpose(0, 1).contiguous()  # (B, K + 1, H, A)
        return self.env_actions(chain[-1]), sample, logp.flatten(1), self._value(cache, pad, s)

    def _raw_prefix(self, state, tokens, token_mask, *frames):
        """(cache, pad, normalised state) from :meth:`raw_inputs`: what every chunk starts with."""
        images, masks, tokens, token_mask, s = self.device_inputs(state, tokens, token_mask, *frames)
        cache, pad = self.model.prefix(images, masks, tokens, token_mask)
        return cache, pad, s

    def _chunk(self, kind: str, fn, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """``fn(*inputs)``: replayed from a captured graph where :meth:`chunk_graphs` gives
        one and it fits, else eagerly."""
        graphs = self.chunk_graphs(inputs[0].device)
        out = None if graphs is None else graphs.run(kind, fn, inputs, storage_fingerprint(self))
        return list(fn(*inputs)) if out is None else out

    def chunk_graphs(self, device: torch.device) -> ChunkGraphs | None:
        """The captured chunks acting on ``device`` uses (``policy.cuda_graph``), or None:
        eager (off, training, gradients on, or not a GPU under auto). ``on`` off a GPU is
        refused by name."""
        if self.cuda_graph == "off" or self.training or torch.is_grad_enabled():
            return None
        if device.type != "cuda":
            if self.cuda_graph == "on":
                raise ValueError(f"policy.cuda_graph=on: CUDA graphs need a CUDA device, and this policy acts on "
                                 f"{device}; use policy.cuda_graph=auto (graphs on a GPU, eager elsewhere) or off")  # fmt: skip
            return None
        if self._graphs is None:
            self._graphs = ChunkGraphs()
        return self._graphs

    @property
    def noise_shape(self) -> tuple[int, int]:
        """The initial noise ``algo=dsrl`` steers: ``(horizon, env action dims)``. The model's
        padded dims (pi0's 32 for a 3-D reach) start from zero, their noise's mean, as the
        deterministic flow's do: they carry no action the env runs, and steering all 256 dims
        (chunks of 8) let the noise critic diverge on franky-sim (docs/results.md)."""
        return (int(self.model.cfg.horizon), int(self.spec.action_dim))

    @torch.no_grad()
    def act_from_noise(self, obs: dict[str, Any], noise: torch.Tensor, prefix=None) -> torch.Tensor:
        """The deterministic flow (no Flow-Noise steps) from the given initial noise: the env's
        dims (``noise_shape``), or the model's full width. ``prefix``: this batch's
        :meth:`prefix`, where the caller has it already (:meth:`embed` took it)."""
        width = int(self.model.cfg.action_dim)
        if noise.shape[-1] != width:
            noise = F.pad(noise, (0, width - noise.shape[-1]))
        if prefix is None:  # the whole chunk, replayed from a graph where one serves
            raw = self.raw_inputs(obs)
            return self._chunk("flow", self._flow_chunk, [raw[0], noise.to(raw[0].dtype), *raw[1:]])[0]
        cache, pad, state = prefix
        return self.env_actions(self.model.denoise(cache, pad, state, noise.to(state.dtype))[-1])

    @property
    def embedding_dim(self) -> int:
        """Width of :meth:`embed`: the action expert's."""
        return int(self.model.state_proj.out_features)

    @torch.no_grad()
    def embed(self, obs: dict[str, Any], prefix=None) -> torch.Tensor:
        """What the frozen model makes of an observation (B, width): the expert's output at the
        state token, after the images, the instruction and the state (the value head's input).
        ``algo=dsrl``'s noise actor reads it (``algo.noise_encoder.encoder=base``)."""
        if prefix is None:  # replayed from a graph where one serves
            return self._chunk("embed", self._embed_chunk, self.raw_inputs(obs))[0]
        cache, pad, state = prefix
        return self.model.state_features(cache, pad, state).float()

    def _embed_chunk(self, state, tokens, token_mask, *frames) -> tuple[torch.Tensor]:
        cache, pad, s = self._raw_prefix(state, tokens, token_mask, *frames)
        return (self.model.state_features(cache, pad, s).float(),)

    # -- training -------------------------------------------------------------------------
    def log_prob(self, obs: dict[str, Any], sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-element log-prob (B, H * action_dim) of recorded chains ``sample`` (B, K + 1,
        H, A) under the current weights, and the per-element entropy of the step noise."""
        cache, pad, state = self.prefix(obs)
        logp, ent = self.model.chain_log_prob(cache, pad, state, sample.transpose(0, 1), self.noise_head)
        return logp.flatten(1), ent.flatten(1)

    def value(self, obs: dict[str, Any]) -> torch.Tensor:
        cache, pad, state = self.prefix(obs)
        return self._value(cache, pad, state)

    def _value(self, cache, pad, state) -> torch.Tensor:
        feats = self.model.state_features(cache, pad, state)
        feats = feats.to(next(self.value_head.parameters()).dtype)  # the head may be bfloat16 with the model
        return value_out(self.value_head(feats.detach() if self.detach_critic else feats)).float()

    def log_prob_and_value(self, obs: dict[str, Any], sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`log_prob` and :meth:`value` over one prefix pass (PPO needs both per
        minibatch; the prefix, the vision tower and the VLM, is most of the cost)."""
        cache, pad, state = self.prefix(obs)
        logp, ent = self.model.chain_log_prob(cache, pad, state, sample.transpose(0, 1), self.noise_head)
        return logp.flatten(1), ent.flatten(1), self._value(cache, pad, state)

    def flow_loss(self, obs: dict[str, Any], chunk: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Flow-matching loss toward env action chunks ``(B, H, action_dim)``; ``valid``
        ``(B, H)`` masks steps without a label (past an episode's end, or not the human's)."""
        images, masks, tokens, token_mask, state = self.model_inputs(obs)
        per_elem = self.model.flow_loss(images, masks, tokens, token_mask, state, self.normalise_actions(chunk),
                                        prefix_grad=self.prefix_grad())  # fmt: skip
        err = per_elem[..., : self.spec.action_dim].mean(-1)  # (B, H)
        if valid is None:
            return err.mean()
        w = valid.float()
        return (err * w).sum() / w.sum().clamp_min(1.0)

    def bc_loss(self, obs: dict[str, Any], target: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Behaviour cloning: ``target`` is a chunk ``(B, H, A)`` or single actions ``(B, A)``
        (then only each chunk's first step is supervised)."""
        if target.dim() == 2:
            chunk = target[:, None].expand(-1, self.horizon, -1)
            first = torch.zeros(chunk.shape[:2], dtype=torch.bool, device=target.device)
            first[:, 0] = True
            valid = first if valid is None else valid
            return self.flow_loss(obs, chunk, valid)
        return self.flow_loss(obs, target, valid)

    def fit_normalizer(self, states: torch.Tensor) -> None:
        """State statistics from the demonstrations (BC's first update), unless the weights
        came with statistics of their own (a checkpoint's)."""
        if not self.fresh_stats:
            return
        n = states.shape[-1]
        mean, std = states.float().mean(0), states.float().std(0).clamp_min(1e-3)
        with torch.no_grad():
            self.state_mean[:n], self.state_std[:n] = mean, std
        self.norm[Col.STATE].mean[:n], self.norm[Col.STATE].std[:n] = mean.cpu().numpy(), std.cpu().numpy()

    @classmethod
    def common_kwargs(cls, policy_cfg) -> dict[str, Any]:
        get = cfg_getter(policy_cfg)
        std = get("noise_std") or (0.08, 0.16)
        return dict(finetune=str(get("finetune") or "expert"), noise_std=(float(std[0]), float(std[1])),
                    detach_critic=bool(get("detach_critic", True)), lora_rank=int(get("lora_rank") or 8),
                    value_per_action=bool(get("value_per_action", False)), compile=get("compile"),
                    cuda_graph=get("cuda_graph", "auto"))  # fmt: skip
