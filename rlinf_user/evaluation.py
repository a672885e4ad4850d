"""Run a trained policy for N episodes (no Ray): success rate, returns, an mp4."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlinf_user.env.spec import EnvSpec, obs_to_torch, stack_obs
from rlinf_user.runtime.seeds import EVAL_EPISODE_SEED

log = logging.getLogger(__name__)


def load_policy_from_checkpoint(path: str | Path, cfg, spec):
    """The policy in a checkpoint (``best.pt`` or a learner checkpoint), built for ``spec``;
    a checkpoint that does not fit the config's policy raises ``ValueError`` naming keys."""
    from rlinf_user.policies.base import build_policy, policy_state_of

    state = torch.load(path, map_location="cpu", weights_only=True)
    policy = build_policy(cfg.policy, spec if isinstance(spec, EnvSpec) else EnvSpec.from_dict(spec))
    try:
        policy.load_state_dict(policy_state_of(state))
    except RuntimeError as err:
        raise ValueError(f"{path} does not fit policy={cfg.policy.name} for this env: {str(err).splitlines()[0]} "
                         f"{' '.join(str(err).split())[:400]}") from err  # fmt: skip
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


def checkpoint_spec(path: str | Path) -> EnvSpec | None:
    """The learner-side spec a checkpoint was trained for (None for older checkpoints)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    return EnvSpec.from_dict(state["spec"]) if state.get("spec") else None


def evaluate_policy(
    env, policy, episodes: int, video_episodes: int = 0, seed: int = EVAL_EPISODE_SEED, adapter=None
) -> dict[str, Any]:
    """``adapter`` (:class:`rlinf_user.runtime.fleet.Adapter`): the policy was trained on a
    fleet's union spec; it maps this env's observations in and actions out."""
    spec = adapter.fleet if adapter is not None else EnvSpec.of_env(env)

    results, frames = [], []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        ret, steps, done, info = 0.0, 0, False, {}
        chunk: list[np.ndarray] = []
        while not done:
            if ep < video_episodes:
                f = frame_of(env, obs)
                if f is not None:
                    frames.append(f)
            if not chunk:  # a policy's chunk of H actions runs out before it is asked again
                batch = stack_obs([obs])
                if adapter is not None:
                    batch = adapter.obs(batch)
                chunk = list(policy.act(obs_to_torch(batch), deterministic=True).actions[0].float().numpy())
            action = spec.expand_action(chunk.pop(0))
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
