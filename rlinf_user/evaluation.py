"""Run a trained policy for N episodes (no Ray): success rate with its 95% interval over
distinct initial states, returns, an mp4.

Evaluation episode k of a held-out split resets with seed ``episode_seed(split) + k``:
``validation`` for training's evaluations and the choice of ``best.pt``, ``test`` for the
reports nothing selects on; no training, demonstration or GRPO stream draws from either
(:mod:`rlinf_user.seeds`). Each
episode's initial observation is fingerprinted, so a result says how many distinct
initial states it covered; a task whose reset ignores the seed (the same scene every
time) is detected and evaluated once: more episodes would only repeat one trajectory.
"""

from __future__ import annotations

import hashlib
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlinf_user.env.spec import Col, EnvSpec, obs_to_torch, stack_obs
from rlinf_user.policies.base import EpisodeInterrupted, PolicyUnavailable
from rlinf_user.seeds import episode_seed

log = logging.getLogger(__name__)

MAX_INTERRUPTIONS = 3  # times one episode may be cut short by a reconnecting policy server


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
    if obs[Col.IMAGES]:
        views = [obs[Col.IMAGES][k] for k in sorted(obs[Col.IMAGES])]
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


# what every evaluation result reports about its own trustworthiness
EVAL_ACCOUNTING = ("episodes", "successes", "success_rate", "success_ci95", "distinct_initial_states", "deterministic_reset",
                   "split")  # fmt: skip


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a success rate (95% by default): honest at 0% and 100%
    and for the few dozen episodes an evaluation affords, unlike the normal one."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return round(max(0.0, c - h), 4), round(min(1.0, c + h), 4)


def initial_state_key(obs: dict[str, Any]) -> str:
    """A fingerprint of an initial observation: the state to 1e-4 and the camera views
    coarsened (every 4th pixel, 16 levels), so identical scenes match and distinct ones don't."""
    h = hashlib.blake2b(digest_size=12)
    h.update((np.round(np.asarray(obs[Col.STATE], np.float64), 4) + 0.0).tobytes())  # + 0.0: -0 == 0
    for name in sorted(obs.get(Col.IMAGES) or {}):
        h.update(name.encode())
        h.update((np.asarray(obs[Col.IMAGES][name])[::4, ::4] // 16).astype(np.uint8).tobytes())
    if obs.get(Col.INSTRUCTION) is not None:
        h.update(str(obs[Col.INSTRUCTION]).encode())
    return h.hexdigest()


def is_new_best(success: float, best: float) -> bool:
    """Whether an evaluation's success replaces the kept policy (``checkpoints/best.pt``):
    above 0 and at or above the best so far. An equal later score replaces it too, since
    the later policy has learned from more (a run at 100% keeps its last 100%, not its
    first: docs/results.md, "Which policy is kept")."""
    return success > 0 and success >= best


def describe_eval(result: dict[str, Any]) -> str:
    """``"92% (81-97%) over 50 distinct initial states"``: how every report phrases a result."""
    rate, (lo, hi) = result["success_rate"], result.get("success_ci95", (0.0, 1.0))
    if result.get("deterministic_reset"):
        return f"{rate:.0%} (1 trial: the reset is deterministic)"
    n, distinct = result["episodes"], result.get("distinct_initial_states", result["episodes"])
    where = f"{distinct} distinct initial states" if distinct == n else f"{n} episodes, {distinct} distinct initial states"
    return f"{rate:.0%} ({lo:.0%}-{hi:.0%}) over {where}"


def eval_env_count(env_cfg, eval_envs, episodes: int) -> int:
    """How many envs an evaluation runs side by side: ``eval_envs``, no more than its
    episodes, and one on a robot (one arm runs one episode)."""
    if str(env_cfg.kind) == "robot":
        return 1
    return max(1, min(int(eval_envs or 1), int(episodes)))


def evaluate_policy(
    env, policy, episodes: int, video_episodes: int = 0, seed: int | None = None, adapter=None, split: str = "test"
) -> dict[str, Any]:
    """Episodes from the held-out ``split``'s seeds (``seed``: from that seed on instead).
    ``env``: one env, or a list of envs of one kind that run episodes side by side in
    lockstep, one batched policy call per step for all of them (episode k still resets
    with seed + k, on whichever env is free: the result is the same episodes'). ``adapter``
    (:class:`rlinf_user.runtime.rollout.fleet.Adapter`): the policy was trained on a
    fleet's union spec; it maps this env's observations in and actions out.

    When episode 1 starts where episode 0 did, one more seed is tried; if it too resets to
    that state the reset is deterministic and the evaluation stops at one trial
    (``deterministic_reset``) rather than repeat one trajectory ``episodes`` times."""
    envs = list(env) if isinstance(env, (list, tuple)) else [env]
    spec = adapter.fleet if adapter is not None else EnvSpec.of_env(envs[0])
    seed = episode_seed(split) if seed is None else int(seed)
    slots = _Slots(envs, seed, episodes)
    results: dict[int, dict[str, Any]] = {}
    frames: dict[int, list[np.ndarray]] = {}
    interrupted: list[dict[str, Any]] = []
    for i in range(len(envs)):
        slots.start(i)
    while slots.active:
        need = [i for i in slots.active if not slots.chunk[i]]
        if need:  # a policy's chunk of H actions runs out before it is asked again
            batch = stack_obs([slots.obs[i] for i in need])
            if adapter is not None:
                batch = adapter.obs(batch)
            try:
                actions = policy.act(obs_to_torch(batch), deterministic=True).actions.float().numpy()
            except EpisodeInterrupted as err:  # a served policy came back: the episodes in flight run again
                for i in list(slots.active):
                    interrupted.append({"episode": slots.episode[i], "seed": seed + slots.episode[i],
                                        "length": slots.steps[i], "reason": str(err)})  # fmt: skip
                    if sum(r["episode"] == slots.episode[i] for r in interrupted) > MAX_INTERRUPTIONS:
                        raise EvaluationStopped(f"episode {slots.episode[i]} was interrupted {MAX_INTERRUPTIONS + 1} "
                                                f"times: {err}", _summary(results, slots, split, seed, interrupted, frames)) from err  # fmt: skip
                    frames.pop(slots.episode[i], None)
                    slots.restart(i)
                log.warning("%s: %d episode(s) in flight end truncated and run again", err, len(slots.active))
                continue
            except PolicyUnavailable as err:
                partial = _summary(results, slots, split, seed, interrupted, frames)
                raise EvaluationStopped(str(err), partial, getattr(err, "details", None)) from err
            for i, a in zip(need, actions):
                slots.chunk[i] = list(a)
        for i in list(slots.active):
            ep = slots.episode[i]
            if ep < video_episodes:
                f = frame_of(envs[i], slots.obs[i])
                if f is not None:
                    frames.setdefault(ep, []).append(f)
            action = spec.expand_action(slots.chunk[i].pop(0))
            obs, r, te, tr, info = envs[i].step(adapter.env_action(action) if adapter is not None else action)
            slots.obs[i] = obs
            slots.ret[i] += r
            slots.steps[i] += 1
            if te or tr:
                results[ep] = {"episode": ep, "seed": seed + ep, "return": slots.ret[i], "length": slots.steps[i],
                               "success": bool(info["success"]), "initial_state": slots.keys[ep]}  # fmt: skip
                slots.start(i)
    return _summary(results, slots, split, seed, interrupted, frames)


class EvaluationStopped(RuntimeError):
    """The policy could not go on (:class:`~rlinf_user.policies.base.PolicyUnavailable`):
    ``result`` holds the episodes that finished, ``complete`` False and the reason."""

    def __init__(self, reason: str, result: dict[str, Any], details: str | None = None):
        super().__init__(reason)
        self.details = details  # e.g. the policy server's traceback
        self.result = {**result, "complete": False, "stopped": reason}


def _summary(results: dict[int, dict], slots: _Slots, split: str, seed: int, interrupted: list, frames: dict) -> dict[str, Any]:
    """The finished episodes' accounting (an interrupted episode is listed, not scored)."""
    done = [results[ep] for ep in sorted(results)]
    keys = [r["initial_state"] for r in done]
    wins = sum(r["success"] for r in done)
    return {
        "episodes": len(done),
        "successes": int(wins),
        "success_rate": float(wins / len(done)) if done else 0.0,
        "success_ci95": list(wilson(wins, len(done))),
        "distinct_initial_states": len(set(keys)),
        "deterministic_reset": slots.deterministic,
        "mean_return": float(np.mean([r["return"] for r in done])) if done else 0.0,
        "mean_length": float(np.mean([r["length"] for r in done])) if done else 0.0,
        "split": split,
        "first_seed": seed,
        "complete": True,
        "interrupted": interrupted,
        "per_episode": done,
        "frames": [f for ep in sorted(frames) if ep in results for f in frames[ep]],
    }


class _Slots:
    """Which episode each env runs: the next one in order whenever an env is free."""

    def __init__(self, envs: list, seed: int, episodes: int):
        self.envs, self.seed, self.episodes = envs, seed, episodes
        self.next_episode, self.deterministic = 0, False
        self.active: list[int] = []
        self.keys: dict[int, str] = {}
        n = len(envs)
        self.obs: list[Any] = [None] * n
        self.episode, self.steps = [0] * n, [0] * n
        self.ret = [0.0] * n
        self.chunk: list[list[np.ndarray]] = [[] for _ in range(n)]

    def restart(self, i: int) -> None:
        """Env ``i`` runs its episode again from the same seed (the first try was interrupted)."""
        ep = self.episode[i]
        obs, _ = self.envs[i].reset(seed=self.seed + ep)
        self.obs[i], self.steps[i], self.ret[i], self.chunk[i] = obs, 0, 0.0, []

    def start(self, i: int) -> None:
        """Env ``i`` resets for the next episode, or goes idle when none is left."""
        if i in self.active:
            self.active.remove(i)
        ep = self.next_episode
        if ep >= self.episodes or self.deterministic:
            return
        env = self.envs[i]
        obs, _ = env.reset(seed=self.seed + ep)
        key = initial_state_key(obs)
        if ep == 1 and key == self.keys[0]:
            probe, _ = env.reset(seed=self.seed + self.episodes + 1)  # a seed no episode uses
            if initial_state_key(probe) == key:
                self.deterministic = True
                log.info("the env's reset is deterministic (3 seeds, one initial state): evaluated once")
                return
            obs, _ = env.reset(seed=self.seed + ep)
        self.next_episode += 1
        self.keys[ep] = key
        self.obs[i], self.episode[i], self.steps[i], self.ret[i], self.chunk[i] = obs, ep, 0, 0.0, []
        self.active.append(i)


def write_video(frames: list[np.ndarray], path: Path, fps: float) -> bool:
    if not frames:
        return False
    import imageio.v2 as imageio

    h = max(f.shape[0] for f in frames) // 2 * 2
    w = max(f.shape[1] for f in frames) // 2 * 2
    frames = [np.ascontiguousarray(f[:h, :w]) for f in frames]
    imageio.mimwrite(path, frames, fps=fps, codec="libx264", macro_block_size=1)
    return True
