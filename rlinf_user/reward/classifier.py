"""A learned success detector: the reward on a robot that has no success sensor.

The classifier sees one observation (state and camera frames, the same encoders as the
policy) and says whether it shows the task done. It is trained from LeRobot datasets
(teleop demonstrations, HG-DAgger sessions): a frame is positive when its step ended in
success (``next.success``) or it is among the last ``last_frames`` frames of an episode
that succeeded (a recorded episode ends at its success, so that one frame alone is too
few), negative otherwise. Episodes are split into training and validation sets whole, so
the validation numbers are on episodes it never saw.

A run uses it through the reward role (:mod:`rlinf_user.runtime.serving.reward_server`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlinf_user.env.spec import Col

log = logging.getLogger(__name__)


class SuccessClassifier(nn.Module):
    def __init__(
        self, encoder_cfg: dict[str, Any], state_dim: int, cameras: dict[str, tuple[int, int]], hidden: int = 256
    ):
        from omegaconf import OmegaConf

        from rlinf_user.env.spec import EnvSpec
        from rlinf_user.policies.encoders import build_encoder

        super().__init__()
        self.encoder_cfg = dict(encoder_cfg)
        self.state_dim = int(state_dim)
        self.cameras = {k: tuple(v) for k, v in cameras.items()}
        self.encoder = build_encoder(OmegaConf.create(self.encoder_cfg), EnvSpec(self.state_dim, self.cameras))
        width = self.encoder(self._dummy()).shape[-1]
        self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def _dummy(self) -> dict[str, Any]:
        return {
            Col.STATE: torch.zeros(1, self.state_dim),
            Col.IMAGES: {k: torch.zeros(1, h, w, 3, dtype=torch.uint8) for k, (h, w) in self.cameras.items()},
        }

    def forward(self, obs: dict[str, Any]) -> torch.Tensor:
        """Success logits, shape (B,)."""
        return self.head(self.encoder(obs)).squeeze(-1)

    def probability(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        batch = {
            Col.STATE: torch.as_tensor(np.asarray(obs[Col.STATE], np.float32)),
            Col.IMAGES: {k: torch.as_tensor(np.asarray(obs[Col.IMAGES][k])) for k in self.cameras},
        }
        with torch.no_grad():
            return torch.sigmoid(self(batch)).numpy()

    def save(self, path: str | Path, threshold: float, metrics: dict[str, Any]) -> None:
        state = {
            "kind": "success_classifier", "state_dict": self.state_dict(), "encoder": self.encoder_cfg,
            "state_dim": self.state_dim, "cameras": self.cameras, "threshold": float(threshold), "metrics": metrics,
        }  # fmt: skip
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, path)

    @staticmethod
    def load(path: str | Path) -> tuple[SuccessClassifier, dict[str, Any]]:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"reward classifier {path} does not exist (train one with `rlinf-user train-reward`)"
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("kind") != "success_classifier":
            raise ValueError(f"{path} is not a success classifier written by `rlinf-user train-reward`")
        model = SuccessClassifier(state["encoder"], state["state_dim"], state["cameras"])
        model.load_state_dict(state["state_dict"])
        model.eval()
        return model, state


@dataclass
class Frames:
    state: np.ndarray  # (N, d) float32
    images: dict[str, np.ndarray]  # camera -> (N, H, W, 3) uint8
    label: np.ndarray  # (N,) bool
    episode: np.ndarray  # (N,) which episode (over all datasets) a frame is from


def load_frames(roots: list[str | Path], last_frames: int = 3) -> Frames:
    """Every frame of the datasets, labelled (see the module's docstring)."""
    from rlinf_user.data import lerobot_format as fmt
    from rlinf_user.data.lerobot_reader import LeRobotReader

    states, labels, episodes, images = [], [], [], {}
    cameras = None
    ep_id = 0
    for root in roots:
        reader = LeRobotReader(root)
        if cameras is None:
            cameras = reader.cameras()
        elif reader.cameras() != cameras:
            raise fmt.DatasetError(f"{root}: cameras {reader.cameras()} differ from the first dataset's {cameras}")
        for ep in reader.episodes(images=True):
            n = len(ep)
            success = np.asarray(ep.columns.get("next.success", np.zeros(n, bool))).astype(bool).reshape(n)
            label = success.copy()
            if success.any():
                label[max(0, n - last_frames) :] = True
            states.append(ep.columns[fmt.STATE_KEY].astype(np.float32))
            labels.append(label)
            episodes.append(np.full(n, ep_id))
            for cam in cameras:
                images.setdefault(cam, []).append(ep.images[cam])
            ep_id += 1
    if not states:
        raise fmt.DatasetError(f"{', '.join(map(str, roots))}: no episodes")
    return Frames(
        np.concatenate(states),
        {k: np.concatenate(v) for k, v in images.items()},
        np.concatenate(labels),
        np.concatenate(episodes),
    )


def _subset(f: Frames, rows: np.ndarray) -> dict[str, Any]:
    return {Col.STATE: f.state[rows], Col.IMAGES: {k: v[rows] for k, v in f.images.items()}}


def _rates(prob: np.ndarray, label: np.ndarray, threshold: float) -> dict[str, float]:
    pred = prob >= threshold
    pos, neg = label, ~label
    return {
        "true_positive_rate": float(pred[pos].mean()) if pos.any() else float("nan"),
        "true_negative_rate": float((~pred[neg]).mean()) if neg.any() else float("nan"),
        "positives": int(pos.sum()),
        "negatives": int(neg.sum()),
    }


def train_classifier(
    frames: Frames,
    encoder_cfg: dict[str, Any],
    steps: int = 2000,
    batch_size: int = 256,
    lr: float = 3e-4,
    val_fraction: float = 0.25,
    threshold: float = 0.5,
    seed: int = 0,
    on_step=None,
) -> tuple[SuccessClassifier, dict[str, Any]]:
    """Fit the classifier (class-balanced binary cross-entropy) and report true positive
    and true negative rates on training and held-out episodes."""
    if not frames.label.any() or frames.label.all():
        raise ValueError(
            f"the datasets hold {int(frames.label.sum())} success frames of {len(frames.label)}: "
            "a success classifier needs both successful and unsuccessful frames"
        )
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    eps = np.unique(frames.episode)
    rng.shuffle(eps)
    n_val = int(round(val_fraction * len(eps))) if len(eps) > 1 else 0
    val_eps = set(eps[:n_val].tolist())
    is_val = np.isin(frames.episode, list(val_eps))
    train_rows, val_rows = np.flatnonzero(~is_val), np.flatnonzero(is_val)
    cameras = {k: tuple(v.shape[1:3]) for k, v in frames.images.items()}
    model = SuccessClassifier(encoder_cfg, frames.state.shape[1], cameras)
    norm = getattr(model.encoder, "norm", None)
    if norm is not None and hasattr(norm, "fit"):
        norm.fit(torch.as_tensor(frames.state[train_rows]))
    pos = train_rows[frames.label[train_rows]]
    neg = train_rows[~frames.label[train_rows]]
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("the training episodes hold only one class of frames: record more episodes")
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    model.train()
    for step in range(steps):
        half = batch_size // 2  # balanced batches: successes are rare frames
        rows = np.concatenate([rng.choice(pos, half), rng.choice(neg, batch_size - half)])
        batch = _subset(frames, rows)
        obs = {
            Col.STATE: torch.as_tensor(batch[Col.STATE]),
            Col.IMAGES: {k: torch.as_tensor(v) for k, v in batch[Col.IMAGES].items()},
        }
        target = torch.as_tensor(frames.label[rows], dtype=torch.float32)
        loss = loss_fn(model(obs), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(step, loss.item())
    model.eval()
    metrics: dict[str, Any] = {"episodes": len(eps), "validation_episodes": len(val_eps), "threshold": threshold}
    for name, rows in (("train", train_rows), ("validation", val_rows)):
        if len(rows):
            prob = np.concatenate(
                [model.probability(_subset(frames, r)) for r in np.array_split(rows, max(1, len(rows) // 512))]
            )
            metrics[name] = _rates(prob, frames.label[rows], threshold)
    return model, metrics
