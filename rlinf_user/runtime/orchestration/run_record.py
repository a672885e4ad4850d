"""What a run records as it goes: progress, per-member statistics, TensorBoard scalars,
the evaluation history, the best policy (``checkpoints/best.pt``) and whether success has
fallen from its best (:class:`BestWatch`)."""

from __future__ import annotations

import csv
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

RECENT_EPISODES = 50  # the window of "recent" success, in the progress table and the summary


class RunError(RuntimeError):
    """A run that cannot go on; the message says why and what to do."""


def root_cause(err: BaseException) -> str:
    """The last non-empty line of an error (Ray wraps the cause in its traceback)."""
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else repr(err)


class BestWatch:
    """The best of a success rate so far and whether the latest has fallen below that best's
    own 95% interval: a run that learned and then lost it, told apart from one whose
    success wobbles within its noise (the best of several noisy measurements is itself
    biased up, so the bar is its interval's bottom, not its value)."""

    def __init__(self, what: str):
        self.what = what
        self.best: float | None = None
        self.best_ci95: tuple[float, float] = (0.0, 1.0)
        self.best_at: int = 0  # env steps
        self.fall: dict[str, Any] | None = None

    def update(self, rate: float, ci95: tuple[float, float], env_steps: int) -> dict[str, Any] | None:
        """Book a new value; the fall (or None) it leaves."""
        if self.best is None or rate >= self.best:  # a tie moves the best to the later one
            self.best, self.best_ci95, self.best_at = rate, (ci95[0], ci95[1]), int(env_steps)
        if rate < self.best_ci95[0]:
            if self.fall is None:
                log.warning("%s success fell from its best %.0f%% (%.0f-%.0f%%, at %d env steps) to %.0f%%", self.what,
                            100 * self.best, 100 * self.best_ci95[0], 100 * self.best_ci95[1], self.best_at, 100 * rate)  # fmt: skip
            self.fall = {"best": self.best, "best_ci95": list(self.best_ci95), "best_at_env_steps": self.best_at,
                         "now": rate, "ci95": [ci95[0], ci95[1]], "at_env_steps": int(env_steps)}  # fmt: skip
        else:
            self.fall = None
        return self.fall


def describe_fall(fall: dict[str, Any]) -> str:
    """``"78% (65%-87%), below its best 94% (84%-98%) at 5,000 env steps"``."""
    lo, hi = fall["ci95"]
    blo, bhi = fall["best_ci95"]
    return (f"{fall['now']:.0%} ({lo:.0%}-{hi:.0%}), below its best {fall['best']:.0%} ({blo:.0%}-{bhi:.0%}) "
            f"at {fall['best_at_env_steps']:,} env steps")  # fmt: skip


@dataclass
class Progress:
    env_steps: int = 0
    episodes: int = 0
    updates: int = 0
    version: int = -1
    wall: float = 0.0
    recent_success: float = 0.0
    recent_return: float = 0.0
    eval_success: float | None = None
    eval_detail: str | None = None  # the latest evaluation in words: rate, interval, states
    best_eval_success: float = 0.0
    eval_fall: dict[str, Any] | None = None  # the latest evaluation is below the best by more than its interval
    recent_fall: dict[str, Any] | None = None  # the same for the last RECENT_EPISODES training episodes
    env_steps_per_s: float = 0.0
    updates_per_s: float = 0.0
    # seconds the env workers spent inside rollout calls (summed over workers) and the
    # learner inside train calls: against the wall, how much of the time each role worked
    rollout_seconds: float = 0.0
    train_seconds: float = 0.0
    worker_restarts: int = 0
    learner_restarts: int = 0
    rollout_restarts: int = 0
    reward_restarts: int = 0
    classified_success: float | None = None  # recent episodes the reward classifier called a success
    intervention_rate: float | None = None  # human-controlled share of supervised steps
    interventions: int = 0  # human-controlled steps so far
    supervisor_lost: str | None = None
    members: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


class RunRecord:
    def __init__(self, run_dir: Path, supervised: bool, many_members: bool):
        self.run_dir = Path(run_dir)
        self.progress = Progress()
        self.supervised = supervised
        self.many_members = many_members
        self.recent: deque = deque(maxlen=RECENT_EPISODES)
        self.supervised_recent: deque = deque(maxlen=20)
        self.best: dict[str, Any] | None = None
        self.eval_watch = BestWatch("evaluation")
        self.recent_watch = BestWatch(f"training (last {RECENT_EPISODES} episodes)")
        self._tb = None
        best = self.run_dir / "checkpoints" / "best.pt"
        if best.exists():  # a resumed run: only a better or equal evaluation replaces it
            import torch

            state = torch.load(best, map_location="cpu", weights_only=True)
            self.progress.best_eval_success = float(state["eval_success"])
            self.best = {"checkpoint": str(best), "policy_version": int(state["version"]), "eval_success": float(state["eval_success"])}
            self.eval_watch.best, self.eval_watch.best_at = self.progress.best_eval_success, int(state.get("env_steps", 0))
            self.eval_watch.best_ci95 = tuple(state.get("eval_ci95", (0.0, 1.0)))

    def open_tensorboard(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # pragma: no cover - tensorboard is a core dependency
            log.warning("tensorboard is not installed: no event files")
            return
        self._tb = SummaryWriter(str(self.run_dir / "tb"))

    def scalars(self, values: dict[str, float], prefix: str, step: int | None = None) -> None:
        if self._tb is None:
            return
        for k, v in values.items():
            self._tb.add_scalar(f"{prefix}/{k}", v, self.progress.env_steps if step is None else step)

    def book_rollout(self, r: dict[str, Any], supervised_worker: bool) -> None:
        """Count a finished rollout call: env steps, episodes, success, interventions."""
        p = self.progress
        p.env_steps += r["steps"]
        p.rollout_seconds += float(r.get("seconds") or 0.0)
        member = p.members.setdefault(r.get("member", "env"), {"env_steps": 0, "episodes": 0, "recent": deque(maxlen=RECENT_EPISODES)})
        member["env_steps"] += r["steps"]
        for ep in r["episodes"]:
            p.episodes += 1
            member["episodes"] += 1
            member["recent"].append(ep)
            self.recent.append(ep)
            scalars = {"return": ep["return"], "success": float(ep["success"])}
            if "classified_success" in ep:
                scalars["classified_success"] = float(ep["classified_success"])
            if self.supervised and supervised_worker:
                self.supervised_recent.append(ep)
                p.interventions += ep["intervention_steps"]
                scalars["intervention_rate"] = ep["intervention_steps"] / max(1, ep["length"])
            self.scalars(scalars, "episode")
            if self.many_members:
                self.scalars({"return": ep["return"], "success": float(ep["success"])}, f"member/{ep['member']}")
        if self.supervised_recent:
            eps = self.supervised_recent
            p.intervention_rate = sum(e["intervention_steps"] for e in eps) / max(1, sum(e["length"] for e in eps))
        if r.get("supervisor_lost") and not p.supervisor_lost:
            p.supervisor_lost = r["supervisor_lost"]
            log.error("teleop device lost (%s): training goes on without interventions", p.supervisor_lost)
        classified = [e["classified_success"] for e in self.recent if "classified_success" in e]
        if classified:
            p.classified_success = float(np.mean(classified))
        if self.recent:
            p.recent_success = float(np.mean([e["success"] for e in self.recent]))
            p.recent_return = float(np.mean([e["return"] for e in self.recent]))
        if r["episodes"] and len(self.recent) == RECENT_EPISODES:  # a full window only
            from rlinf_user.evaluation import wilson

            wins = sum(bool(e["success"]) for e in self.recent)
            p.recent_fall = self.recent_watch.update(p.recent_success, wilson(wins, RECENT_EPISODES), p.env_steps)

    def member_stats(self, members, status: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Per fleet member: env steps, episodes, recent success, worker states, nodes."""
        out = {}
        for m in members:
            got = self.progress.members.get(m.name, {"env_steps": 0, "episodes": 0, "recent": []})
            recent = list(got["recent"])
            out[m.name] = {
                "env_steps": got["env_steps"],
                "episodes": got["episodes"],
                "recent_success": float(np.mean([e["success"] for e in recent])) if recent else None,
                **status.get(m.name, {}),
            }
        return out

    def record_eval(self, result: dict[str, Any], wall: float, spec, env_steps: int | None = None) -> None:
        """Book an evaluation; ``env_steps``: the steps trained when it began (default: now)."""
        p = self.progress
        steps = p.env_steps if env_steps is None else int(env_steps)
        from rlinf_user.evaluation import describe_eval, is_new_best

        p.eval_success = result["success_rate"]
        p.eval_detail = describe_eval(result)
        if "policy_state" in result and is_new_best(p.eval_success, p.best_eval_success):
            self._save_best(result, steps, spec)
        p.best_eval_success = max(p.best_eval_success, p.eval_success)
        if not result.get("deterministic_reset"):  # one trial has no interval to fall by
            p.eval_fall = self.eval_watch.update(p.eval_success, tuple(result["success_ci95"]), steps)
        row = {
            "env_steps": steps,
            "wall_seconds": round(wall, 2),
            "updates": p.updates,
            "policy_version": result["policy_version"],
            "success_rate": result["success_rate"],
            "ci95_low": result["success_ci95"][0],
            "ci95_high": result["success_ci95"][1],
            "episodes": result["episodes"],
            "distinct_states": result["distinct_initial_states"],
            "deterministic_reset": int(result["deterministic_reset"]),
            "mean_return": round(result["mean_return"], 4),
        }
        p.history.append(row)
        path = self.run_dir / "eval" / "history.csv"
        new = not path.exists()
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)
        self.scalars({"success_rate": row["success_rate"], "mean_return": row["mean_return"]}, "eval", steps)
        log.info("eval @ %d steps (%.0fs, v%d): success %s", steps, wall, row["policy_version"], p.eval_detail)

    def _save_best(self, result: dict[str, Any], env_steps: int, spec) -> None:
        """The weights that scored the best evaluation so far, exactly as evaluated
        (``checkpoints/best.pt``; ``rlinf-user eval RUN`` takes it): the latest policy can
        be worse than one it replaced."""
        import torch

        path = self.run_dir / "checkpoints" / "best.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        state = {
            "policy": result["policy_state"], "version": int(result["policy_version"]), "env_steps": int(env_steps),
            "spec": spec.to_dict(), "eval_success": float(result["success_rate"]), "eval_episodes": int(result["episodes"]),
            "eval_ci95": list(result["success_ci95"]), "eval_distinct_states": int(result["distinct_initial_states"]),
        }  # fmt: skip
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic
        self.best = {"checkpoint": str(path), "policy_version": state["version"], "eval_success": state["eval_success"]}
        log.info("new best policy v%d (evaluation success %.2f) -> %s", state["version"], state["eval_success"], path)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
