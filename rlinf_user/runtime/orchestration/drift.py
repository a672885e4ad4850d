"""Measured throughput against ``placement=auto``'s prediction, while the run goes on.

The plan (``plan.json`` beside the run's config) predicted env steps/s and updates/s for
the placement it chose. Every ``window_s`` seconds past a warm-up (``warmup_s`` after the learner's first update) the run's own counters
give the measured rates; the rate learning gets at the algorithm's update-to-data ratio
(the smaller of env steps/s and updates/s over that ratio) is compared with the predicted
one. A window off by more than ``tolerance`` (20%) is a drift: logged once per window with
both figures, and kept in ``eval/summary.json`` (``placement_drift``), with the ratio of
every window. A drifted window is what re-plans the run from its own measured costs
(:mod:`rlinf_user.runtime.planning.replan`): its env workers are added or retired, and a
better placement that needs a restart is advised; the placement's mode is kept.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class DriftWatch:
    def __init__(self, predicted: dict[str, Any], utd_ratio: float | None, window_s: float = 30.0,
                 warmup_s: float = 20.0, tolerance: float = 0.2):  # fmt: skip
        """``utd_ratio`` None (on-policy rounds): env steps/s alone are compared."""
        self.utd = None if utd_ratio is None else max(float(utd_ratio), 1e-9)
        steps = float(predicted["env_steps_per_s"])
        self.predicted = steps if self.utd is None else min(steps, float(predicted["updates_per_s"]) / self.utd)
        self.window_s, self.warmup_s, self.tolerance = float(window_s), float(warmup_s), float(tolerance)
        self.windows: list[dict[str, float]] = []
        self._start: tuple[float, int, int] | None = None
        self._steady_from: float | None = None  # the run's wall at its first update

    @staticmethod
    def plan_of(run_dir: Path) -> dict[str, Any] | None:
        """The plan ``placement=auto`` kept beside the run's config (None: placed by hand)."""
        path = Path(run_dir) / "plan.json"
        return json.loads(path.read_text()) if path.exists() else None

    @classmethod
    def of_run(cls, run_dir: Path, utd_ratio: float | None, **kw) -> DriftWatch | None:
        """The watch of a run whose placement was chosen by ``placement=auto`` (None: chosen by hand)."""
        plan = cls.plan_of(run_dir)
        return None if plan is None else cls(plan["predicted"], utd_ratio, **kw)

    def tick(self, wall_s: float, env_steps: int, updates: int, now: float | None = None) -> dict[str, float] | None:
        """Called as the run goes on; a finished window's figures (None: none finished now)."""
        now = time.monotonic() if now is None else now
        if self._steady_from is None:  # the clock starts at the first update: before it, the
            if updates <= 0:  # learner waits for its first batch and paced workers for it
                return None
            self._steady_from = wall_s
        if wall_s - self._steady_from < self.warmup_s:
            return None
        if self._start is None:
            self._start = (now, env_steps, updates)
            return None
        t0, s0, u0 = self._start
        if now - t0 < self.window_s:
            return None
        self._start = (now, env_steps, updates)
        steps, upd = (env_steps - s0) / (now - t0), (updates - u0) / (now - t0)
        measured = steps if self.utd is None else min(steps, upd / self.utd)
        ratio = measured / self.predicted if self.predicted > 0 else float("nan")
        window = {"at_s": round(wall_s, 1), "measured": round(measured, 2), "predicted": round(self.predicted, 2),
                  "ratio": round(ratio, 3), "drift": abs(ratio - 1.0) > self.tolerance}  # fmt: skip
        self.windows.append(window)
        if window["drift"]:
            log.warning("placement=auto: measured %.1f env steps/s at the update-to-data ratio, predicted %.1f (%+.0f%%, "
                        "more than %.0f%% off)", measured, self.predicted, 100 * (ratio - 1), 100 * self.tolerance)  # fmt: skip
        return window

    def repredict(self, score: float) -> None:
        """A re-plan's prediction (env steps/s at the update-to-data ratio): what the next
        windows are measured against, from now."""
        self.predicted = float(score)
        self._start = None

    def summary(self) -> dict[str, Any]:
        ratios = [w["ratio"] for w in self.windows]
        return {"predicted": round(self.predicted, 2), "windows": self.windows,
                "drifted_windows": sum(w["drift"] for w in self.windows),
                "median_ratio": round(sorted(ratios)[len(ratios) // 2], 3) if ratios else None}  # fmt: skip
