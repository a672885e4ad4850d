"""The driver loops of a training run.

* :func:`streaming_loop` (replay algorithms, and on-policy ones in ``async`` mode): every
  env worker always has its next rollout call queued behind the running one, the learner
  always has one ``train`` call in flight, evaluation runs on its own worker. Nobody waits
  for anybody: env workers act with whatever policy version they hold (at most
  ``placement.max_policy_lag`` behind, when set). Asynchronous PPO is the exception: its
  workers collect at most 1 + max_policy_lag rounds (default 2) under one policy version
  and then wait for the next, so a slow learner loses no env steps to staleness.
* :func:`sync_on_policy_loop` (on-policy ``sync`` mode): every worker collects
  ``algo.num_steps`` steps per env with policy version v, the learner updates once on all
  of them and publishes v+1, and the next round starts from it.

Both share :class:`Schedule`: evaluations, checkpoints, progress reports and stop rules.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rlinf_user.runtime.orchestration.run_record import RunError, root_cause
from rlinf_user.runtime.orchestration.workers import PoolError

log = logging.getLogger(__name__)

ROLLOUT_STEPS = 100
ROLLOUTS_IN_FLIGHT = 2
TRAIN_CALL_UPDATES = 50
RESIZE_CHECK_S = 2.0  # how often placement=auto looks at the cluster's CPUs


class Schedule:
    """Evaluations, checkpoints, progress reports and the stop rules of a loop."""

    def __init__(self, tr):
        self.tr = tr
        p, cfg = tr.progress, tr.cfg
        self.t_start = time.monotonic()
        self.next_eval = p.env_steps + cfg.eval_every_steps
        self.next_ckpt = p.env_steps + cfg.checkpoint_every_steps
        self.last_report, self.last_steps, self.last_updates, self.last_t = 0.0, p.env_steps, p.updates, time.monotonic()
        self.last_busy = (p.rollout_seconds, p.train_seconds)
        self.eval_call = None
        self.last_resize_check = time.monotonic()
        self.eval_steps = None  # env steps when the running evaluation began (None: book it at now's)
        if cfg.get("eval_at_start", False) and not cfg.resume and tr.eval_worker is not None:
            # the starting policy (fresh, or the checkpoint being fine-tuned): the evaluation
            # worker takes it before the first update can replace it, and is evaluated while
            # the first rollouts run
            import ray

            version = ray.get(tr.eval_worker.sync_weights.remote())
            log.info("evaluating the starting policy (version %d)", version)
            self._start_eval(sync=False)

    def _start_eval(self, sync: bool = True) -> None:
        """Start an evaluation (``sync=False``: of the weights the evaluation worker holds)."""
        tr = self.tr
        self.eval_call = tr.eval_worker.evaluate.remote(tr.cfg.eval_episodes, False, tr.progress.best_eval_success, sync)
        self.eval_steps = tr.progress.env_steps

    def wall(self) -> float:
        return time.monotonic() - self.t_start

    def eval_done(self) -> None:
        """Book the evaluation whose call finished (``self.eval_call``)."""
        import ray

        ref, self.eval_call = self.eval_call, None
        try:
            steps, self.eval_steps = self.eval_steps, None
            self.tr.record.record_eval(ray.get(ref), self.wall(), self.tr.spec, steps)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.OutOfMemoryError) as err:
            log.error("evaluation failed (%s); the next one runs on a fresh worker", root_cause(err))
            self.tr._replace_eval_worker()

    def tick(self) -> str | None:
        """Start what is due (evaluation, checkpoint, a progress report); the reason to
        stop, if there is one."""
        tr, cfg, p = self.tr, self.tr.cfg, self.tr.progress
        p.wall = self.wall()
        if self.eval_call is None and p.env_steps >= self.next_eval and tr.eval_worker is not None:
            self.next_eval += cfg.eval_every_steps
            self._start_eval()
        if p.env_steps >= self.next_ckpt:
            self.next_ckpt += cfg.checkpoint_every_steps
            tr.learner.save_checkpoint.remote(p.env_steps)
        now = time.monotonic()
        if now - self.last_report > 1.0:
            dt = now - self.last_t
            p.env_steps_per_s = (p.env_steps - self.last_steps) / dt
            p.updates_per_s = (p.updates - self.last_updates) / dt
            # the share of the interval each role spent working (a call's seconds are booked
            # when it returns: read these over a window of several reports)
            busy = {"workers_busy": (p.rollout_seconds - self.last_busy[0]) / dt / max(1, len(tr.pool.running())),
                    "learner_busy": (p.train_seconds - self.last_busy[1]) / dt}  # fmt: skip
            self.last_steps, self.last_updates, self.last_t, self.last_report = p.env_steps, p.updates, now, now
            self.last_busy = (p.rollout_seconds, p.train_seconds)
            tr.record.scalars(
                {"env_steps_per_s": p.env_steps_per_s, "updates_per_s": p.updates_per_s,
                 "recent_success": p.recent_success, "policy_version": float(p.version), **busy},
                "runtime",
            )  # fmt: skip
            tr.on_progress(p)
        if tr.drift is not None:
            window = tr.drift.tick(p.wall, p.env_steps, p.updates)
            if window is not None:
                tr.replan(window["drift"], p.wall)
        if tr.replanner is not None and now - self.last_resize_check > RESIZE_CHECK_S:
            self.last_resize_check = now
            tr.replan(None, p.wall)  # a node joined or left: re-planned on the cluster's CPUs
        if tr.stop_requested:
            return tr.stop_requested
        # only an evaluation that has run counts (target_success=0: stop after the first one)
        if cfg.target_success is not None and p.eval_success is not None and p.eval_success >= cfg.target_success:
            return f"evaluation success {p.eval_success:.2f} >= target {cfg.target_success}"
        if cfg.max_wall_minutes is not None and p.wall > 60 * cfg.max_wall_minutes:
            return f"max_wall_minutes={cfg.max_wall_minutes} reached"
        return None

    def finish(self) -> None:
        """Wait for an evaluation still running and book it."""
        if self.eval_call is not None:
            self.eval_done()


def _learner_result(tr, ref) -> dict[str, Any] | None:
    """A finished train call's metrics; None when the learner died (it was restarted).
    A learner that stopped on NaN/Inf ends the run: nothing after the last good
    checkpoint is saved."""
    import ray

    try:
        return ray.get(ref)
    except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError) as err:  # killed for memory: dead too
        tr._restart_learner(err)
        return None
    except ray.exceptions.RayTaskError as err:
        raise RunError(
            f"the learner stopped: {root_cause(err)}; the checkpoints in {tr.run_dir}/checkpoints hold the last good "
            f"weights: continue with `rlinf-user train resume={tr.run_dir}` (after lowering the learning rate, say)"
        ) from err


def _learner_metrics(tr, m: dict[str, Any] | None) -> None:
    if m is None:
        return
    p = tr.progress
    p.updates, p.version = m["num_updates"], m["version"]
    if tr.replanner is not None:
        tr.replanner.observe_train(m)
    if m["updates"]:
        scalars = {k: v for k, v in m.items() if isinstance(v, float)}
        if isinstance(m.get("seconds"), float):  # a train call's time per update, as it ran beside the rest
            p.train_seconds += m["seconds"]
            scalars["update_ms"] = 1000.0 * m["seconds"] / m["updates"]
        tr.record.scalars(scalars, "learner")


def _worker_failed(tr, slot, err) -> bool:
    """A worker's call failed: replace it (True when a replacement runs now)."""
    tr.progress.worker_restarts += 1
    try:
        return tr.pool.failed(slot, err)
    except PoolError as pool_err:
        raise RunError(f"{pool_err}; continue with `rlinf-user train resume={tr.run_dir}`") from err


def streaming_loop(tr, sched: Schedule) -> str:
    import ray

    cfg, p, pool = tr.cfg, tr.progress, tr.pool
    min_rows = 1
    if tr.on_policy:  # a round is num_steps env steps per env; a row is a decision (a chunk's steps)
        min_rows = max(1, tr.rows_per_round() // ray.get(tr.learner.policy_horizon.remote()))
    rollout_calls: dict[Any, tuple[int, int]] = {}
    # asynchronous PPO: rollouts of one round each, one in flight per worker, and no more than
    # 1 + max_policy_lag rounds collected under one policy version. Without that bound a slow
    # learner fell behind: rows went stale and were dropped (env steps lost), or one update
    # took in the whole run. GRPO's groups finish only with whole episodes: not paced.
    plan = tr.data_plan
    paced_rounds = tr.on_policy and not plan.group_size
    steps_per_call = plan.num_steps if paced_rounds else ROLLOUT_STEPS
    in_flight = 1 if paced_rounds else ROLLOUTS_IN_FLIGHT
    lag = cfg.placement.get("max_policy_lag")
    round_cap = (1 + (1 if lag is None else int(lag))) * tr.rows_per_round() if paced_rounds else 0
    version_mark = {"version": p.version, "steps": p.env_steps}
    learning_starts = 0 if tr.on_policy else plan.learning_starts

    def rollout(slot):
        random = p.env_steps < learning_starts and not cfg.resume
        return slot.actor.rollout.remote(steps_per_call, random)

    def queue(slot, n: int = in_flight) -> None:
        for _ in range(n):
            rollout_calls[rollout(slot)] = (slot.index, slot.generation)

    def train():
        return tr.learner.train.remote(TRAIN_CALL_UPDATES, p.env_steps, min_rows)

    # algo.paced: a worker's next rollout waits while the learner is more than one round
    # of rollouts behind its update-to-data ratio
    paced = not tr.on_policy and plan.paced
    utd = 1.0 if tr.on_policy else max(plan.utd_ratio, 1e-9)
    slack = learning_starts + TRAIN_CALL_UPDATES / utd
    slack += ROLLOUT_STEPS * int(cfg.placement.envs_per_worker) * len(pool.slots)
    horizon = ray.get(tr.learner.policy_horizon.remote()) if paced else 1
    if paced and plan.demo_ratio < 1.0:
        # the learner's first update needs a batch of rows (a chunk policy's row is a whole
        # chunk's env steps): without this a worker waits for updates that cannot start yet
        # (the pixel pick's worker sat 9 s at 300 env steps while its learner waited for 256 rows)
        slack = max(slack, learning_starts + plan.batch_size * horizon + TRAIN_CALL_UPDATES / utd)
    waiting: set[int] = set()  # workers whose next rollout waits for the learner

    def behind() -> bool:
        if paced_rounds:
            if p.version != version_mark["version"]:
                version_mark.update(version=p.version, steps=p.env_steps)
            return p.env_steps - version_mark["steps"] >= round_cap
        return paced and p.env_steps > p.updates / utd + slack

    for slot in pool.running():
        queue(slot)
    last_idle_warning = time.monotonic()
    train_call = train()
    stop_reason = "total_env_steps reached"
    while True:
        pending = list(rollout_calls) + [train_call] + ([sched.eval_call] if sched.eval_call else [])
        done, _ = ray.wait(pending, num_returns=1, timeout=1.0)
        for ref in done:
            if ref is train_call:
                _learner_metrics(tr, _learner_result(tr, ref))
                train_call = train()
            elif ref is sched.eval_call:
                sched.eval_done()
            else:
                i, gen = rollout_calls.pop(ref)
                slot = pool.slots[i]
                try:
                    r = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.OutOfMemoryError) as err:
                    if gen == slot.generation and slot.status == "retiring":
                        pool.retire(slot, f"re-planned (its last rollout failed: {root_cause(err)})")
                    if gen != slot.generation or slot.status != "running":
                        continue  # a queued call of a worker already replaced
                    if _worker_failed(tr, slot, err):
                        queue(slot)
                    continue
                pool.note(slot, r)
                tr.record.book_rollout(r, i == 0)
                if tr.replanner is not None:
                    tr.replanner.observe_rollout(r)
                if r.get("rollout_lost"):
                    tr._rollout_lost()
                queued = sum(1 for j, _ in rollout_calls.values() if j == i)
                if slot.status == "retiring":  # re-planned away: retired once nothing of it is in flight
                    if not queued:
                        pool.retire(slot)
                    continue
                if p.env_steps + queued * steps_per_call < cfg.total_env_steps:
                    if behind():
                        waiting.add(i)
                    else:
                        rollout_calls[rollout(slot)] = (i, slot.generation)
        for i in [i for i in waiting if pool.slots[i].status == "retiring"]:  # nothing of it in flight
            waiting.discard(i)
            pool.retire(pool.slots[i])
        if waiting and not behind():
            for i in waiting:
                if pool.slots[i].status == "running" and p.env_steps < cfg.total_env_steps:
                    rollout_calls[rollout(pool.slots[i])] = (i, pool.slots[i].generation)
            waiting.clear()
        tr._watch_reward_server()
        for slot in pool.arrivals():
            if p.env_steps < cfg.total_env_steps:
                queue(slot)
        if not rollout_calls and not waiting and p.env_steps < cfg.total_env_steps and time.monotonic() - last_idle_warning > 30:
            last_idle_warning = time.monotonic()
            log.warning("no env worker is running (fleet: %s); waiting for a node to come back", pool.status())
        reason = sched.tick()
        if reason:
            stop_reason = reason
            break
        if not rollout_calls and p.env_steps >= cfg.total_env_steps:
            break
    _learner_metrics(tr, _learner_result(tr, train_call))  # its version is the checkpoint's
    return stop_reason


def sync_on_policy_loop(tr, sched: Schedule) -> str:
    import ray

    cfg, p, pool = tr.cfg, tr.progress, tr.pool
    steps = tr.data_plan.num_steps
    while p.env_steps < cfg.total_env_steps:
        calls = {slot.actor.rollout.remote(steps, False, p.version): slot for slot in pool.running()}
        if not calls:
            log.warning("no env worker is running (fleet: %s); waiting for a node to come back", pool.status())
            time.sleep(1.0)
        rows = 0
        lost = False
        for ref, slot in calls.items():
            try:
                r = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.OutOfMemoryError) as err:
                _worker_failed(tr, slot, err)
                continue
            pool.note(slot, r)
            tr.record.book_rollout(r, slot.index == 0)
            rows += r.get("rows", r["steps"])  # on-policy rows: a chunk's steps are one
            lost |= bool(r.get("rollout_lost"))
        if lost:
            tr._rollout_lost()
        pool.arrivals()  # workers back from a lost node take part in the next round
        if rows:  # grouped credit (GRPO) updates on the groups whose episodes have all ended
            need = 1 if tr.data_plan.group_size else rows
            _learner_metrics(tr, _learner_result(tr, tr.learner.train.remote(0, p.env_steps, need)))
        tr._watch_reward_server()
        if sched.eval_call is not None and ray.wait([sched.eval_call], timeout=0)[0]:
            sched.eval_done()
        reason = sched.tick()
        if reason:
            return reason
    return "total_env_steps reached"
