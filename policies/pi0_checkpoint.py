"""pi0 checkpoints from a local folder: openpi's PyTorch layout and LeRobot's.

openpi (``convert_jax_model_to_pytorch.py`` output)::

    <folder>/model.safetensors             keys without prefix: paligemma_with_expert.*, action_in_proj.*, ...
    <folder>/config.json                   {"action_dim", "action_horizon", "paligemma_variant", "action_expert_variant", "precision"}
    <folder>/assets/<asset_id>/norm_stats.json   {"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}

LeRobot (``PI0Policy.save_pretrained``)::

    <folder>/model.safetensors             the same keys under "model."
    <folder>/config.json                   {"type": "pi0", "chunk_size", "max_action_dim", "max_state_dim", ...}
    <folder>/policy_preprocessor.json      its steps; the normaliser step names its state file
    <folder>/policy_preprocessor_step_<i>_normalizer_processor.safetensors   "observation.state.mean", "action.std", ...

Differences between those files and a model built on stock transformers 5.x, handled
here: the tied text embedding is stored once, as ``paligemma.lm_head.weight``; the vision
tower's parameters sit under ``vision_tower.vision_model.`` in the files and directly under
``vision_tower.`` in transformers 5; the action expert's unused ``lm_head`` is dropped.
Anything else that does not match (a missing key, a shape) is refused naming the key.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlinf_user.policies.pi0_model import Pi0Config, Pi0Model

log = logging.getLogger(__name__)

VISION_FILE, VISION_MODEL = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.", "paligemma_with_expert.paligemma.model.vision_tower."
LM_HEAD = "paligemma_with_expert.paligemma.lm_head.weight"
EMBED = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
UNUSED = ("paligemma_with_expert.gemma_expert.lm_head.weight",)


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the configured model (the first bad key is named)."""


@dataclass
class NormStats:
    """Per-key statistics of normalised model inputs/outputs (openpi's ``NormStats``)."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None

    def normalize(self, x: np.ndarray, quantile: bool = False) -> np.ndarray:
        n = x.shape[-1]
        if quantile:
            lo, hi = self.q01[..., :n], self.q99[..., :n]
            return (x - lo) / (hi - lo + 1e-6) * 2.0 - 1.0
        return (x - self.mean[..., :n]) / (self.std[..., :n] + 1e-6)

    def unnormalize(self, x: np.ndarray, quantile: bool = False) -> np.ndarray:
        n = min(x.shape[-1], self.mean.shape[-1])
        x = x[..., :n]
        if quantile:
            lo, hi = self.q01[..., :n], self.q99[..., :n]
            return (x + 1.0) / 2.0 * (hi - lo + 1e-6) + lo
        return x * (self.std[..., :n] + 1e-6) + self.mean[..., :n]


def detect_layout(folder: Path) -> str:
    """``openpi`` or ``lerobot`` (or a clear error naming what is missing)."""
    folder = Path(folder)
    if not (folder / "model.safetensors").exists():
        raise FileNotFoundError(f"{folder}: no model.safetensors (a pi0 checkpoint folder from openpi or LeRobot holds one)")
    if (folder / "policy_preprocessor.json").exists():
        return "lerobot"
    if (folder / "config.json").exists() and "paligemma_variant" in json.loads((folder / "config.json").read_text()):
        return "openpi"
    raise FileNotFoundError(
        f"{folder}: model.safetensors without openpi's config.json (paligemma_variant, action_horizon) "
        f"or LeRobot's policy_preprocessor.json"
    )


def file_key_to_model(key: str) -> str:
    return VISION_MODEL + key[len(VISION_FILE) :] if key.startswith(VISION_FILE) else key


def model_key_to_file(key: str) -> str:
    return VISION_FILE + key[len(VISION_MODEL) :] if key.startswith(VISION_MODEL) else key


def config_from_folder(folder: Path, **overrides) -> Pi0Config:
    """The model config a checkpoint folder declares (sizes, horizon, padded dims)."""
    folder = Path(folder)
    layout = detect_layout(folder)  # names what is missing before anything is read
    meta = json.loads((folder / "config.json").read_text())
    if layout == "openpi":
        kw = dict(vlm=meta["paligemma_variant"].removesuffix("_lora"), expert=meta["action_expert_variant"].removesuffix("_lora"),
                  action_dim=int(meta["action_dim"]), state_dim=int(meta["action_dim"]), horizon=int(meta["action_horizon"]))  # fmt: skip
    else:
        kw = dict(vlm=meta.get("paligemma_variant", "gemma_2b"), expert=meta.get("action_expert_variant", "gemma_300m"),
                  action_dim=int(meta.get("max_action_dim", 32)), state_dim=int(meta.get("max_state_dim", 32)),
                  horizon=int(meta.get("chunk_size", 50)), num_steps=int(meta.get("num_inference_steps", 10)),
                  max_token_len=int(meta.get("tokenizer_max_length", 48)))  # fmt: skip
    for key in ("vision", "vocab_size", "num_cameras", "num_steps", "max_token_len"):
        if key in meta.get("rlinf_user", {}):
            kw[key] = meta["rlinf_user"][key]
    return Pi0Config(**{**kw, **overrides})


def load_weights(model: Pi0Model, folder: Path) -> None:
    """Loads ``model.safetensors`` of either layout into ``model``; refuses a file whose
    keys or shapes do not fit, naming the first mismatching key."""
    from safetensors.torch import load_file

    folder = Path(folder)
    raw = load_file(str(folder / "model.safetensors"))
    if detect_layout(folder) == "lerobot":
        raw = {k.removeprefix("model."): v for k, v in raw.items()}
    state = {file_key_to_model(k): v for k, v in raw.items() if k not in UNUSED}
    if EMBED not in state and LM_HEAD in state:
        state[EMBED] = state[LM_HEAD]  # the tied embedding is stored once
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointMismatch(f"{folder}/model.safetensors lacks {model_key_to_file(missing[0])} ({len(missing)} keys missing)")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise CheckpointMismatch(
            f"{folder}/model.safetensors has {model_key_to_file(unexpected[0])}, which the configured model does not "
            f"({len(unexpected)} unexpected keys): is the config the checkpoint's (sizes, pi0 vs pi0.5)?"
        )
    for k, v in expected.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise CheckpointMismatch(
                f"{folder}/model.safetensors: {model_key_to_file(k)} has shape {tuple(state[k].shape)}, the configured "
                f"model expects {tuple(v.shape)}"
            )
    model.load_state_dict({k: state[k].to(v.dtype) for k, v in expected.items()})


def load_norm_stats(folder: Path, asset_id: str | None = None) -> dict[str, NormStats]:
    """``{"state": NormStats, "actions": NormStats}`` from either layout."""
    folder = Path(folder)
    if detect_layout(folder) == "lerobot":
        return _lerobot_norm_stats(folder)
    every = sorted((folder / "assets").glob("*/norm_stats.json")) + sorted((folder / "assets").glob("*/*/norm_stats.json"))
    found = [f.parent.relative_to(folder / "assets").as_posix() for f in every]  # asset ids ("droid", "org/dataset")
    files = [f for f, a in zip(every, found) if asset_id is None or a == asset_id]
    if len(files) != 1:
        want = f"assets/{asset_id}/norm_stats.json" if asset_id else "one assets/<asset_id>/norm_stats.json"
        raise FileNotFoundError(f"{folder}: expected {want}, found {found or 'none'} (set policy.asset_id)")
    stats = json.loads(files[0].read_text())["norm_stats"]
    out = {}
    for key in ("state", "actions"):
        if key not in stats:
            raise CheckpointMismatch(f"{files[0]}: no norm_stats.{key}")
        s = stats[key]
        out[key] = NormStats(*(np.asarray(s[f], np.float32) if s.get(f) is not None else None for f in ("mean", "std", "q01", "q99")))
    return out


def _lerobot_norm_stats(folder: Path) -> dict[str, NormStats]:
    from safetensors.numpy import load_file

    steps = json.loads((folder / "policy_preprocessor.json").read_text()).get("steps", [])
    files = [s.get("state_file") for s in steps if "normalizer" in str(s.get("registry_name", ""))]
    files = [f for f in files if f]
    if not files:
        raise FileNotFoundError(f"{folder}/policy_preprocessor.json names no normaliser state file")
    t = load_file(str(folder / files[0]))
    out = {}
    for key, prefix in (("state", "observation.state"), ("actions", "action")):
        if f"{prefix}.mean" not in t:
            raise CheckpointMismatch(f"{folder / files[0]}: no {prefix}.mean")
        out[key] = NormStats(*(t.get(f"{prefix}.{f}") for f in ("mean", "std", "q01", "q99")))
    return out


def check_norm_stats(stats: dict[str, NormStats], state_dim: int, action_dim: int) -> None:
    """Refuses statistics narrower than the robot's state/action (or padded wider than the model)."""
    for key, need in (("state", state_dim), ("actions", action_dim)):
        n = stats[key].mean.shape[-1]
        if n < need:
            raise CheckpointMismatch(f"norm_stats.{key}.mean has {n} dims; the env needs {need}")


def save_openpi(model: Pi0Model, folder: Path, norm_stats: dict[str, NormStats], asset_id: str = "rlinf_user",
                variants: tuple[str, str] | None = None) -> Path:  # fmt: skip
    """Writes ``model`` in openpi's PyTorch layout (the one :func:`load_weights` reads)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    (folder / "assets" / asset_id).mkdir(parents=True, exist_ok=True)
    state = {model_key_to_file(k): v.detach().contiguous() for k, v in model.state_dict().items() if k != EMBED}
    save_file(state, str(folder / "model.safetensors"))
    cfg = model.cfg
    vlm, exp = variants or (cfg.vlm, cfg.expert)
    meta = {"action_dim": cfg.action_dim, "action_horizon": cfg.horizon, "paligemma_variant": vlm,
            "action_expert_variant": exp, "precision": "float32",
            "rlinf_user": {"vision": cfg.vision, "vocab_size": cfg.vocab_size, "num_cameras": cfg.num_cameras,
                           "num_steps": cfg.num_steps, "max_token_len": cfg.max_token_len}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(meta, indent=2))
    stats = {k: {f: (None if getattr(s, f) is None else np.asarray(getattr(s, f)).tolist()) for f in ("mean", "std", "q01", "q99")}
             for k, s in norm_stats.items()}  # fmt: skip
    (folder / "assets" / asset_id / "norm_stats.json").write_text(json.dumps({"norm_stats": stats}, indent=2))
    return folder


def load_pi0(folder: Path, asset_id: str | None = None, **overrides) -> tuple[Pi0Model, dict[str, NormStats]]:
    """A model built from the folder's own config, its weights and norm statistics."""
    cfg = config_from_folder(folder, **overrides)
    model = Pi0Model(cfg)
    load_weights(model, folder)
    return model, load_norm_stats(folder, asset_id)
