"""Re-planning a running job from its own measured costs (``placement=auto``).

The plan chose a placement from a short profile. While the run goes on, the driver sees what
the roles really cost: each env worker's rollout calls (wall seconds per vector step of its
``E`` envs) and each learner train call (wall seconds per update, as it ran beside the rest).
When :class:`~rlinf_user.runtime.orchestration.drift.DriftWatch` finds a window more than 20%
off the prediction, :meth:`Replanner.replan` refits the cost model to those measurements (the
profiled curves scaled so that, at the run's own settings, they give the measured seconds)
and ranks again:

* **what it changes live**: the number of env workers, between one and the most the run may
  hold (its chosen count, or ``placement.max_env_workers`` where higher). Workers are added
  where the cluster has a free CPU and retired once their rollouts in flight came back, so a
  change loses no transition;
* **what it advises**: the best placement over every candidate (mode, envs per worker, the
  rollout server, devices) with the refitted costs; where that beats the best live change by
  more than the drift tolerance, the decision names it with its overrides, for the next
  restart. A mode is not switched under a running learner.

Each decision (the measured seconds, the refit factors, workers from and to, the new
prediction, the advice) is logged and kept in ``eval/summary.json`` (``placement_replans``);
the drift watch then measures against the new prediction.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from typing import Any

from rlinf_user.runtime.planning.model import Candidate, Costs, Curve, Pipeline, predict, rank, update_s, worker_step

log = logging.getLogger(__name__)

MIN_CALLS = 2  # rollout calls and train calls a window needs before its costs are trusted


def _scaled(curve: Curve, factor: float) -> Curve:
    """The curve with its wall seconds scaled (its CPU seconds kept: a slower wall under
    contention is time spent waiting for a core, not more work)."""
    return Curve({k: v * factor for k, v in curve.wall.items()}, dict(curve.cpu or curve.wall))


class Replanner:
    def __init__(self, plan: dict[str, Any], max_workers: int, tolerance: float = 0.2):
        self.costs = Costs.from_dict(plan["costs"])
        self.pipe = Pipeline(**plan["pipeline"])
        chosen = plan["chosen"]
        self.live = Candidate(chosen["mode"], int(chosen["num_env_workers"]), int(chosen["envs_per_worker"]),
                              bool(chosen["rollout"]["enabled"]), str(chosen["learner_device"]),
                              str(chosen["rollout"]["device"]) if chosen["rollout"]["enabled"] else "cpu",
                              int(chosen.get("learner_replicas", 1) or 1))  # fmt: skip
        self.max_workers = max(int(max_workers), self.live.workers)
        self.tolerance = float(tolerance)
        self.decisions: list[dict[str, Any]] = []
        self.fitted: tuple[Costs, dict[str, float]] = (self.costs, {"worker": 1.0, "update": 1.0})  # the last refit
        self.cluster_cpus: float | None = None  # the cluster's CPUs when first seen (the profile's machine)
        self.added_cpus = 0.0  # how many it has gained (or lost, < 0) since
        self.reset_window()

    @classmethod
    def applies(cls, plan: dict[str, Any] | None, on_policy: bool) -> bool:
        """Replay runs chosen by ``placement=auto`` on one machine without robots (a robot's
        workers are fixed by its hardware; an on-policy round keeps its workers to its end)."""
        if plan is None or on_policy or "costs" not in plan or "pipeline" not in plan:
            return False
        if plan.get("cluster"):  # node groups: the drift is watched, the groups are not re-planned live
            return False
        return not int(plan["pipeline"].get("robots", 0) or 0) and not plan["costs"].get("robot_hz")

    def reset_window(self) -> None:
        """Forget what was measured (a window ended)."""
        self._rollout_s = self._vector_steps = 0.0
        self._update_s = self._updates = 0.0
        self._rollouts = self._trains = 0

    # -- what the run measured ----------------------------------------------------------------
    def observe_rollout(self, result: dict[str, Any]) -> None:
        """An env worker's rollout call came back (``steps`` env steps in ``seconds``)."""
        steps, seconds = float(result.get("steps") or 0), float(result.get("seconds") or 0.0)
        if steps > 0 and seconds > 0:
            self._rollout_s += seconds
            self._vector_steps += steps / self.live.envs_per_worker
            self._rollouts += 1

    def observe_train(self, metrics: dict[str, Any]) -> None:
        """A learner train call came back (``updates`` updates in ``seconds``)."""
        n, seconds = float(metrics.get("updates") or 0), metrics.get("seconds")
        if n > 0 and isinstance(seconds, float) and seconds > 0:
            self._update_s += seconds
            self._updates += n
            self._trains += 1

    def measured(self) -> dict[str, float | None]:
        step = self._rollout_s / self._vector_steps if self._rollouts >= MIN_CALLS and self._vector_steps else None
        update = self._update_s / self._updates if self._trains >= MIN_CALLS and self._updates else None
        return {"worker_step_s": step, "update_s": update}

    # -- the model refitted to it ---------------------------------------------------------------
    def refit(self, measured: dict[str, float | None], workers: int) -> tuple[Costs, dict[str, float]]:
        """The profiled costs scaled so that the live placement's worker step and update take
        the measured seconds (a role not measured this window keeps its profile)."""
        costs = copy.deepcopy(self.costs)
        factors = {"worker": 1.0, "update": 1.0}
        live = replace(self.live, workers=workers)
        if measured["worker_step_s"]:
            profiled = worker_step(self.costs, self.pipe, live)[0]
            if profiled > 0:
                f = measured["worker_step_s"] / profiled
                factors["worker"] = f
                costs.worker, costs.env_step = _scaled(costs.worker, f), _scaled(costs.env_step, f)
                costs.act = {k: _scaled(v, f) for k, v in costs.act.items()}
                costs.request = _scaled(costs.request, f)
        if measured["update_s"]:
            key = f"{live.learner_device}_beside_worker"
            curve = costs.update.get(key) or costs.update.get(live.learner_device)
            profiled = update_s(self.costs, curve, self.pipe.batch_size, live)[0] if curve is not None else 0.0
            if profiled > 0:
                f = measured["update_s"] / profiled
                factors["update"] = f
                costs.update = {k: _scaled(v, f) for k, v in costs.update.items()}
                costs.dp_overhead = {k: _scaled(v, f) for k, v in costs.dp_overhead.items()}
                costs.sampling = _scaled(costs.sampling, f)  # part of the update where collocated
        return costs, factors

    def step(self, drifted: bool | None, cluster_cpus: float, workers: int, at_s: float) -> dict[str, Any] | None:
        """What the run calls: at the end of a drift window (``drifted`` True or False) and
        between windows (None) with the cluster's CPUs now. Re-plans after a drifted window,
        or when the cluster gained or lost a CPU since it was last planned on; a window that
        did not drift starts a new one. Returns the decision (None: nothing re-planned)."""
        if self.cluster_cpus is None:
            self.cluster_cpus = cluster_cpus
        resized = abs(cluster_cpus - self.cluster_cpus - self.added_cpus) >= 1.0
        if drifted is False:
            self.reset_window()
        if not drifted and not resized:
            return None
        self.added_cpus = cluster_cpus - self.cluster_cpus
        return self.replan(workers, at_s, self.added_cpus, "drift" if drifted else "cluster")

    def replan(self, workers: int, at_s: float, added_cores: float = 0.0, reason: str = "drift") -> dict[str, Any] | None:
        """The worker count to run (and the advice for a restart): after a drifted window
        (``reason="drift"``; None when the window measured too little to refit on), or when
        the cluster gained or lost ``added_cores`` CPUs since the profile (``"cluster"``: the
        last refit kept)."""
        measured = self.measured()
        fresh = measured["worker_step_s"] is not None or measured["update_s"] is not None
        if reason == "drift" and not fresh:
            return None
        self.reset_window()
        if fresh:
            self.fitted = self.refit(measured, workers)
        costs, factors = copy.deepcopy(self.fitted[0]), dict(self.fitted[1])
        costs.cores = max(1, int(round(self.costs.cores + added_cores)))
        now = predict(costs, self.pipe, replace(self.live, workers=workers))
        live = [replace(self.live, workers=n) for n in range(1, self.max_workers + 1)]
        best = rank(costs, self.pipe, live)[0]
        overall = rank(costs, self.pipe)[0]
        restart = None
        needs_restart = replace(overall.candidate, workers=self.live.workers) != self.live  # mode, envs, server, devices
        if needs_restart and overall.score > best.score * (1.0 + self.tolerance):
            restart = {"placement": overall.candidate.label(), "predicted": overall.row(),
                       "overrides": overall.candidate.overrides()}  # fmt: skip
        decision = {
            "at_s": round(at_s, 1), "reason": reason, "cores": costs.cores,
            "measured": {k: None if v is None else round(1000 * v, 2) for k, v in
                         (("worker_step_ms", measured["worker_step_s"]), ("update_ms", measured["update_s"]))},
            "refit": {k: round(v, 3) for k, v in factors.items()},
            "workers": {"from": workers, "to": best.candidate.workers},
            "predicted_before": round(now.score, 2), "predicted": best.row(), "score": round(best.score, 3),
            "restart": restart,
        }  # fmt: skip
        self.decisions.append(decision)
        changed = best.candidate.workers != workers or restart is not None
        (log.warning if changed else log.info)(
                    "placement=auto re-planned at %.0f s (%s; a worker step %s ms, an update %s ms): "
                    "%d -> %d env workers, predicted %.1f env steps/s (limited by %s)%s", at_s, reason,
                    decision["measured"]["worker_step_ms"], decision["measured"]["update_ms"], workers,
                    best.candidate.workers, best.env_steps_per_s, best.bottleneck,
                    f"; a restart with {' '.join(restart['overrides'])} is predicted "
                    f"{restart['predicted']['env_steps_per_s']} env steps/s" if restart else "")  # fmt: skip
        return decision
