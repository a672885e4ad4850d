"""Observation augmentation: DrQ's random shifts of frames (replicate-padding then random
cropping), and Gaussian noise on a frozen encoder's feature maps where the rows carry those
instead of frames (``policy.frame_features``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlinf_user.env.spec import Col


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """Shift each uint8/float image in ``(B, H, W, C)`` by up to ``pad`` pixels.

    Implemented with one ``grid_sample`` call (as in DrQ-v2), so it stays on the device.
    """
    if pad <= 0:
        return images
    b, h, w, c = images.shape
    x = images.permute(0, 3, 1, 2).float()
    x = F.pad(x, (pad, pad, pad, pad), mode="replicate")

    def coords(n: int) -> torch.Tensor:  # the first n sample points of the padded axis, in [-1, 1]
        eps = 1.0 / (n + 2 * pad)
        return torch.linspace(-1.0 + eps, 1.0 - eps, n + 2 * pad, device=x.device)[:n]

    # grid[..., 0] is x (along the width), grid[..., 1] is y: each axis its own length, so a
    # frame that is not square keeps its shape
    base = torch.stack([coords(w).expand(h, w), coords(h).unsqueeze(1).expand(h, w)], dim=-1).unsqueeze(0)
    # pixels to grid units per axis, as scalars: no host-to-device copy (a captured update holds none)
    shift = torch.randint(0, 2 * pad + 1, (b, 1, 1, 2), device=x.device).float()
    shift = torch.cat([shift[..., :1] * (2.0 / (w + 2 * pad)), shift[..., 1:] * (2.0 / (h + 2 * pad))], dim=-1)
    out = F.grid_sample(x, base + shift, padding_mode="zeros", align_corners=False)
    out = out.permute(0, 2, 3, 1)
    return out.round().clamp(0, 255).to(images.dtype) if images.dtype == torch.uint8 else out


def augment_obs(obs: dict, pad: int, cameras=None) -> dict:
    """``obs`` with its frames shifted; only ``cameras`` where given (the frames an encoder
    reads: an encoder of the state, or of a frozen base's embedding, reads none)."""
    if pad <= 0 or not obs.get(Col.IMAGES) or cameras == ():
        return obs
    shift = {k: cameras is None or k in cameras for k in obs[Col.IMAGES]}
    return {**obs, Col.IMAGES: {k: random_shift(v, pad) if shift[k] else v for k, v in obs[Col.IMAGES].items()}}


def encoder_cameras(*encoders) -> tuple[str, ...] | None:
    """The cameras these encoders read (None: one of them does not say, so every frame)."""
    out: set[str] = set()
    for enc in encoders:
        cams = getattr(enc, "cameras", None)
        if cams is None:
            return None
        out.update(cams)
    return tuple(sorted(out))


def feature_noise(obs: dict, scale: float) -> dict:
    """``obs`` with Gaussian noise added to each camera's frozen feature maps: ``scale`` x the
    batch's standard deviation of that camera's features (a frame cannot be shifted once it
    is encoded, so its maps are perturbed instead)."""
    feats = obs.get(Col.FEATURES)
    if scale <= 0 or not feats:
        return obs
    out = {}
    for k, v in feats.items():
        x = v.float()
        out[k] = (x + scale * x.std() * torch.randn_like(x)).to(v.dtype)
    return {**obs, Col.FEATURES: out}
