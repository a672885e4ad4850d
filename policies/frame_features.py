"""A frozen encoder's feature maps computed where the frames are produced
(``policy.frame_features=true``).

With a frozen pretrained backbone (``policy.encoder=efficientnet|resnet10``, not fine-tuned)
the map of a frame never changes, so it is computed once: by the env worker as the frame
comes from the camera, and once per demonstration frame when demos are loaded. The
observation then carries ``features/<camera>`` (float16, (C, H/32, W/32)) in place of
``images/<camera>``; the policy acts on it, the replay buffer and its log store it, and the
learner's updates run only the spatial embeddings and heads. Per 128 x 128 camera a row
holds 10 KB (EfficientNet-Lite0, 320 x 4 x 4) or 16 KB (ResNet-10) instead of a 48 KB frame,
and an update's cost no longer grows with the image size. The frames themselves stay in
the env (a learned reward classifier, the supervisor and recordings see them); only the
rows sent to the learner drop them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from rlinf_user.env.spec import Col

log = logging.getLogger(__name__)


def frame_feature_settings(cfg) -> dict[str, Any] | None:
    """What builds the featurizer (encoder kind, weights), or None where the run computes
    no frame features. Refuses settings under which features cannot be computed once."""
    from rlinf_user.policies.encoders import encoder_kind
    from rlinf_user.policies.image_encoders import PRETRAINED

    p = cfg.policy
    if not bool(p.get("frame_features", False)):
        return None
    kind = encoder_kind(p)
    if kind not in PRETRAINED:
        raise ValueError(
            f"policy.frame_features=true needs a frozen pretrained encoder (policy.encoder=efficientnet or "
            f"resnet10), not {kind!r}: a learned CNN's features change with every update"
        )
    if bool(p.get("encoder_finetune", False)):
        raise ValueError(
            "policy.frame_features=true with policy.encoder_finetune=true: a fine-tuned backbone changes, so its "
            "maps cannot be computed once; set one of them false"
        )
    return {"encoder": kind, "weights": p.get("vision_weights")}


class FrameFeaturizer:
    """uint8 frames -> the frozen backbone's float16 maps, in batches of ``batch``."""

    def __init__(self, settings: dict[str, Any], device: str | torch.device = "cpu", batch: int = 64):
        from rlinf_user.policies.image_encoders import build_backbone, frozen

        self.kind = settings["encoder"]
        self.device = torch.device(device)
        self.batch = int(batch)
        self.net = frozen(build_backbone(self.kind, settings.get("weights"))).to(self.device)

    @torch.no_grad()
    def maps(self, frames: np.ndarray) -> np.ndarray:
        """(N, H, W, 3) uint8 -> (N, C, h, w) float16."""
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
            raise ValueError(f"frame features need uint8 (N, H, W, 3) frames, got {frames.dtype} {frames.shape}")
        out = []
        for i in range(0, len(frames), self.batch):
            x = torch.as_tensor(frames[i : i + self.batch], device=self.device)
            out.append(self.net(self.net.preprocess(x)).half().cpu().numpy())
        if not out:
            return np.zeros((0, self.net.out_channels, 1, 1), np.float16)
        return np.concatenate(out)

    def observation(self, obs: dict[str, Any]) -> dict[str, Any]:
        """An observation batch with ``features`` in place of ``images``."""
        out = {k: v for k, v in obs.items() if k != Col.IMAGES}
        out[Col.IMAGES] = {}
        out[Col.FEATURES] = {k: self.maps(v) for k, v in obs[Col.IMAGES].items()}
        return out

    def columns(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Transition columns with each ``<prefix>/images/<camera>`` replaced by
        ``<prefix>/features/<camera>`` (demonstrations, replay logs recorded with frames)."""
        out = {}
        for key, val in cols.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] in (Col.OBS, Col.NEXT_OBS) and parts[1] == Col.IMAGES:
                out[Col.feature(parts[0], parts[2])] = self.maps(val)
            else:
                out[key] = val
        return out
