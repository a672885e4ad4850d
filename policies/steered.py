"""A frozen flow policy steered through its input noise (the acting policy of ``algo=dsrl``).

DSRL (Wagenmaker et al. 2025, "Steering Your Diffusion Policy with Latent Space
Reinforcement Learning"): a pretrained flow policy maps an observation and an initial
noise ``w`` to actions by integrating its velocity field. Keep it frozen, and let a small
actor choose ``w`` from the observation; RL then trains only that actor (and its critics)
in the noise space, with no gradient through the big model and no change to its weights.

* The base is any policy with :class:`NoiseSteerable` (``flow``, ``pi0``, ``lite_vla``),
  built from ``base`` (its own policy config) and loaded from ``base_checkpoint`` (a run's
  ``best.pt``/checkpoint, or a run directory; a pi0/lite_vla folder comes in its own
  ``policy.checkpoint``). It is held outside the module tree: its weights are in neither
  this policy's ``state_dict`` nor its ``parameters()``, so they are never trained,
  published or saved; every process builds the same base from the same file.
* The noise actor is a tanh-Gaussian over the unit box ``u in [-1, 1]^(H x A)``, on an
  encoder of its own; the base receives ``w = noise_max * u``. A flow policy is trained
  from ``w ~ N(0, I)``, so ``noise_max`` (default 1.5) keeps the steering inside the range
  it has seen. ``u`` is what the replay stores (``Col.NOISE``) and the critics score.
* Deterministic acts (evaluation) take the actor's mean noise; a fresh actor's mean is
  about 0, which is the base's own deterministic action.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from omegaconf import OmegaConf

from rlinf_user.env.spec import Col, EnvSpec, index_obs, nest_columns, obs_to_torch
from rlinf_user.policies.actor_critic import TanhGaussianActor
from rlinf_user.policies.base import Policy, PolicyOutput, build_policy, policy_state_of
from rlinf_user.policies.encoders import EmbeddingEncoder, EncoderConfig, build_encoder

log = logging.getLogger(__name__)


@runtime_checkable
class NoiseSteerable(Protocol):
    """A flow policy whose initial noise can be given: ``noise_shape`` is ``(H, A)`` of one
    row's noise; ``act_from_noise`` integrates deterministically from it to ``(B, H, action_dim)``."""

    noise_shape: tuple[int, int]

    def act_from_noise(self, obs: dict[str, Any], noise: torch.Tensor) -> torch.Tensor: ...


@dataclass
class SteeredPolicyConfig(EncoderConfig):
    """``algo=dsrl`` wraps the configured flow policy in this one (``policy.base``)."""

    name: str = "steered"
    base: Any = None  # the frozen flow policy's own config
    base_checkpoint: str | None = None  # its weights: best.pt, a checkpoint, or a run directory
    noise_max: float = 1.5  # |w| per element; the flow was trained on w ~ N(0, I)
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    log_std_min: float = -5.0
    log_std_max: float = 2.0


def base_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], dict | None]:
    """The policy weights (and the env spec they were trained for) in ``path``: a run
    directory (its ``checkpoints/best.pt``, else its latest checkpoint) or a file."""
    p = Path(path)
    if p.is_dir():
        ckpts = p / "checkpoints"
        best = ckpts / "best.pt"
        latest = ckpts / "latest"
        if best.exists():
            p = best
        elif latest.exists():
            p = ckpts / latest.read_text().strip()
        else:
            raise ValueError(f"base_checkpoint={path}: a directory without checkpoints/best.pt or checkpoints/latest")
    if not p.is_file():
        raise ValueError(f"base_checkpoint={path}: no such file")
    state = torch.load(p, map_location="cpu", weights_only=True)
    return policy_state_of(state), state.get("spec")


class SteeredPolicy(Policy):
    """Reparameterised over the noise (SAC trains the actor); the base acts."""

    config = SteeredPolicyConfig

    def __init__(self, spec: EnvSpec, base: Policy, encoder, hidden, noise_max: float = 1.5,
                 log_std_min: float = -5.0, log_std_max: float = 2.0):  # fmt: skip
        super().__init__(spec)
        if not isinstance(base, NoiseSteerable):
            raise ValueError(f"{type(base).__name__} cannot be steered through its noise (a flow policy can: flow, pi0, lite_vla)")
        if not noise_max > 0:
            raise ValueError(f"noise_max={noise_max}: > 0")
        object.__setattr__(self, "base", base.eval().requires_grad_(False))  # not a submodule: never trained, published or saved
        h, a = base.noise_shape
        self.noise_shape = (int(h), int(a))
        self.noise_dim = int(h) * int(a)
        self.noise_max = float(noise_max)
        self.encoder = encoder
        self.hidden = list(hidden)
        self.actor = TanhGaussianActor(encoder.out_dim, self.noise_dim, hidden, log_std_min, log_std_max)

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> SteeredPolicy:
        base_cfg = policy_cfg.get("base")
        if base_cfg is None:
            raise ValueError("policy=steered needs policy.base: the flow policy to steer (algo=dsrl sets it)")
        base = build_policy(base_cfg, spec)
        if policy_cfg.get("base_checkpoint"):
            weights, trained = base_weights(policy_cfg.base_checkpoint)
            if trained is not None and EnvSpec.from_dict(trained) != spec:
                raise ValueError(f"base_checkpoint={policy_cfg.base_checkpoint} was trained for {EnvSpec.from_dict(trained)}, "
                                 f"not this env's {spec}")  # fmt: skip
            try:
                base.load_state_dict(weights)
            except RuntimeError as err:
                raise ValueError(f"base_checkpoint={policy_cfg.base_checkpoint} does not fit policy={base_cfg.name}: "
                                 f"{' '.join(str(err).split())[:300]}") from err  # fmt: skip
        enc_cfg = OmegaConf.to_container(policy_cfg, resolve=True) if OmegaConf.is_config(policy_cfg) else dict(policy_cfg)
        enc_cfg["encoder"] = enc_cfg.get("encoder") or ("cnn" if spec.cameras else "mlp")
        if enc_cfg["encoder"] == "base":
            if not hasattr(base, "embed"):
                raise ValueError(f"algo.noise_encoder.encoder=base reads the base's embedding of the observation; "
                                 f"policy={base_cfg.name} has none (pi0 and lite_vla do)")  # fmt: skip
            enc_cfg["embedding_dim"] = int(base.embedding_dim)
        encoder = build_encoder(OmegaConf.create({k: v for k, v in enc_cfg.items() if k != "base"}), spec)
        return cls(spec, base, encoder, list(policy_cfg.hidden), float(policy_cfg.noise_max),
                   float(policy_cfg.log_std_min), float(policy_cfg.log_std_max))  # fmt: skip

    @property
    def horizon(self) -> int:
        """The actions of a chunk executed: the base's (a served flow may run fewer than its
        noise's H)."""
        return int(getattr(self.base, "horizon", self.noise_shape[0]))

    def _apply(self, fn, recurse: bool = True):
        """``.to(device)`` and friends reach the base too (it is not a submodule)."""
        self.base._apply(fn, recurse)
        return super()._apply(fn, recurse)

    def sample_features(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A unit-box noise ``u`` (reparameterised) and its log-probability (SAC's actor)."""
        return self.actor.sample(feats)

    def log_prob_features(self, feats: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return self.actor.log_prob_of(feats, u)

    @property
    def reads_embedding(self) -> bool:
        """The noise actor reads the base's embedding (``encoder=base``): rows carry it."""
        return isinstance(getattr(self.encoder, "inner", self.encoder), EmbeddingEncoder)

    @torch.no_grad()
    def actions_for(self, obs: dict[str, Any], u: torch.Tensor, prefix=None) -> torch.Tensor:
        """What the base does from the unit-box noise ``u`` ``(B, H x A)``: ``(B, H, action_dim)``."""
        noise = (self.noise_max * u).view(u.shape[0], *self.noise_shape)
        if prefix is not None:
            return self.base.act_from_noise(obs, noise, prefix=prefix)
        return self.base.act_from_noise(obs, noise)

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> PolicyOutput:
        prefix, extras = None, {}
        if self.reads_embedding:  # one pass of the VLM serves the embedding and the denoising
            if Col.EMBEDDING not in obs:
                # eager: one prefix pass for both; where the base replays captured chunks
                # (a GPU), the embedding and the flow are two replays of their own
                graphs = getattr(self.base, "chunk_graphs", None)
                replayed = graphs is not None and graphs(obs[Col.STATE].device) is not None
                prefix = None if replayed else self.base.prefix(obs)
                obs = {**obs, Col.EMBEDDING: self.base.embed(obs, prefix)}
            extras[EMBEDDING_COLUMN] = obs[Col.EMBEDDING]  # the row's obs/embedding
        feats = self.encoder(obs)
        if deterministic:
            u = torch.tanh(self.actor(feats)[0])
            return PolicyOutput(self.actions_for(obs, u, prefix), {Col.NOISE: u, **extras})
        u, log_prob = self.actor.sample(feats)
        return PolicyOutput(self.actions_for(obs, u, prefix), {Col.NOISE: u, Col.LOG_PROB: log_prob, **extras})

    def row_embedder(self) -> RowEmbedder | None:
        """What adds the base's embedding to the rows where they are stored (None: the
        noise actor does not read it)."""
        return RowEmbedder(self.base) if self.reads_embedding else None


EMBEDDING_COLUMN = f"{Col.OBS}/{Col.EMBEDDING}"


class RowEmbedder:
    """Adds ``obs/embedding`` and ``next_obs/embedding`` to transition columns that lack
    them: the frozen base's :meth:`embed` of each row's observations, computed once, where
    the rows are stored (the learner's replay, demonstrations as they load), in batches
    of ``batch``. The acting policy sends ``obs/embedding`` with each row (it computed it to
    act); a row's ``next_obs`` is, unless its episode ended, the observation of the same
    env's next row, whose embedding is copied where the states match; the rest are
    computed. An update never runs the VLM: 128 rows of lite_vla take 2.1 s on one core."""

    def __init__(self, base: Policy, batch: int = 64):
        self.base = base
        self.batch = int(batch)
        self.computed = 0  # observations embedded here (copied ones not counted)

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec | dict) -> RowEmbedder | None:
        """A replay process's own: the steered policy built from its config (the base loaded
        from its checkpoint); None where its noise actor does not read the embedding."""
        spec = spec if isinstance(spec, EnvSpec) else EnvSpec.from_dict(spec)
        return SteeredPolicy.from_config(OmegaConf.create(policy_cfg), spec).row_embedder()

    def __call__(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(cols)
        for prefix in (Col.OBS, Col.NEXT_OBS):
            key = f"{prefix}/{Col.EMBEDDING}"
            if key not in out and Col.state(prefix) in out:
                out[key] = self._embed_rows(out, prefix)
        return out

    def _embed_rows(self, cols: dict[str, np.ndarray], prefix: str) -> np.ndarray:
        n = len(cols[Col.state(prefix)])
        emb = np.zeros((n, int(self.base.embedding_dim)), np.float32)
        todo = np.ones(n, bool)
        if prefix == Col.NEXT_OBS and f"{Col.OBS}/{Col.EMBEDDING}" in cols:
            self._copy_successors(cols, emb, todo)
        rows = np.flatnonzero(todo)
        if len(rows):
            obs = nest_columns({k: v for k, v in cols.items() if k.startswith(prefix + "/")})[prefix]
            dev = next(self.base.parameters()).device
            for i in range(0, len(rows), self.batch):
                idx = rows[i : i + self.batch]
                emb[idx] = self.base.embed(obs_to_torch(index_obs(obs, idx), dev)).cpu().numpy()
            self.computed += len(rows)
        return emb

    @staticmethod
    def _copy_successors(cols: dict[str, np.ndarray], emb: np.ndarray, todo: np.ndarray) -> None:
        """``next_obs`` embeddings copied from the rows that start there (same env, next step)."""
        if Col.ENV_ID not in cols or Col.STEP not in cols:
            return
        ended = (cols[Col.TERMINATED] > 0) | (cols.get(Col.TRUNCATED, np.zeros_like(cols[Col.TERMINATED])) > 0)
        env, step = cols[Col.ENV_ID].astype(np.int64), cols[Col.STEP].astype(np.int64)
        order = np.lexsort((step, env))  # rows by (env, step); the successor of j starts at (env_j, step_j + 1)
        keys = np.stack([env[order], step[order]], 1)
        want = np.stack([env, step + 1], 1)
        pos = np.clip(_searchsorted_rows(keys, want), 0, len(order) - 1)
        k = order[pos]
        hit = (env[k] == env) & (step[k] == step + 1) & ~ended.reshape(-1)
        states, nexts = cols[Col.state(Col.OBS)], cols[Col.state(Col.NEXT_OBS)]
        hit &= np.all(states[k].reshape(len(k), -1) == nexts.reshape(len(k), -1), axis=1)
        emb[hit] = cols[f"{Col.OBS}/{Col.EMBEDDING}"][k[hit]]
        todo[hit] = False


def _searchsorted_rows(keys: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per row of ``want`` (pairs), the first index of the lexicographically sorted pairs
    ``keys`` that is not below it."""
    shift = int(max(keys[:, 1].max(initial=0), want[:, 1].max(initial=0))) + 1
    return np.searchsorted(keys[:, 0] * shift + keys[:, 1], want[:, 0] * shift + want[:, 1])
