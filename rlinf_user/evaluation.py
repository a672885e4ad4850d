"""Run a trained policy for N episodes (no Ray): success rate, returns, an mp4."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)


def load_policy_from_checkpoint(path: str | Path, cfg, spec: dict[str, Any]):
    from rlinf_user.algorithms.sac import build_policy

    state = torch.load(path, map_location="cpu", weights_only=True)
    policy = build_policy(cfg.policy, spec["state_dim"], spec["cameras"], spec["action_dim"])
    if "policy" in state:  # best.pt: the evaluated policy alone
        policy.load_state_dict(state["policy"])
    else:  # a learner checkpoint: the policy inside the agent
        model = state["agent"]["model"]
        policy.load_state_dict({k[len("policy."):]: v for k, v in model.items() if k.startswith("policy.")})
    policy.eval()
    return policy, int(state.get("version", -1))


def frame_of(env, obs: dict[str, Any]) -> np.ndarray | None:
    """What the video shows: the camera views side by side, else the simulator's render."""
    if obs["images"]:
        views = [obs["images"][k] for k in sorted(obs["images"])]
        h = max(v.shape[0] for v in views)
        views = [np.pad(v, ((0, h - v.shape[0]), (0, 0), (0, 0))) for v in views]
        return np.concatenate(views, axis=1)
    try:
        frame = env.render()
    except Exception as err:  # noqa: BLE001 - a backend without rendering still evaluates
        log.debug("render failed: %s", err)
        return None
    return None if frame is None else np.asarray(frame, dtype=np.uint8)


def checkpoint_spec(path: str | Path) -> dict[str, Any] | None:
    """The learner-side spec a checkpoint was trained for (None for older checkpoints)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("spec")


def evaluate_policy(
    env, policy, episodes: int, video_episodes: int = 0, seed: int = 10_000, adapter=None
) -> dict[str, Any]:
    """``adapter`` (:class:`rlinf_user.runtime.fleet.Adapter`): the policy was trained on a
    fleet's union spec; it maps this env's observations in and actions out."""
    from rlinf_user.runtime.env_worker import env_spec, expand_action, obs_to_torch

    spec = adapter.fleet if adapter is not None else env_spec(env)

    results, frames = [], []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        ret, steps, done, info = 0.0, 0, False, {}
        while not done:
            if ep < video_episodes:
                f = frame_of(env, obs)
                if f is not None:
                    frames.append(f)
            batch = {"state": obs["state"][None], "images": {k: v[None] for k, v in obs["images"].items()}}
            if adapter is not None:
                batch = adapter.obs(batch)
            action = expand_action(policy.act(obs_to_torch(batch), deterministic=True).numpy()[0], spec)
            obs, r, te, tr, info = env.step(adapter.env_action(action) if adapter is not None else action)
            ret += r
            steps += 1
            done = te or tr
        results.append({"episode": ep, "return": ret, "length": steps, "success": bool(info["success"])})
    return {
        "episodes": episodes,
        "success_rate": float(np.mean([r["success"] for r in results])),
        "mean_return": float(np.mean([r["return"] for r in results])),
        "mean_length": float(np.mean([r["length"] for r in results])),
        "per_episode": results,
        "frames": frames,
    }


def write_video(frames: list[np.ndarray], path: Path, fps: float) -> bool:
    if not frames:
        return False
    import imageio.v2 as imageio

    h = max(f.shape[0] for f in frames) // 2 * 2
    w = max(f.shape[1] for f in frames) // 2 * 2
    frames = [np.ascontiguousarray(f[:h, :w]) for f in frames]
    imageio.mimwrite(path, frames, fps=fps, codec="libx264", macro_block_size=1)
    return True
