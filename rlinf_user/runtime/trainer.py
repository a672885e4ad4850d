"""The asynchronous actor-learner loop on Ray.

The driver only routes completions: every env worker always has one ``rollout`` call in
flight, the learner always has one ``train`` call in flight, and evaluation runs on its
own worker. Nobody waits for anybody: env workers act with whatever policy version they
hold, the learner trains at a bounded update-to-data ratio and publishes new versions.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_user.rundir import write_json
from rlinf_user.runtime.placement import make_plan, ray_init_kwargs
from rlinf_user.runtime.workers import START_TIMEOUT_S, PoolError, WorkerPool

log = logging.getLogger(__name__)

RECENT_EPISODES = 50  # the window of "recent" success, in the progress table and the summary

ROLLOUT_STEPS = 100
ROLLOUTS_IN_FLIGHT = 2
TRAIN_CALL_UPDATES = 50
MAX_LEARNER_RESTARTS = 3
MAX_ROLLOUT_RESTARTS = 3


class RunError(RuntimeError):
    """A run that cannot go on; the message says why and what to do."""


def _root_cause(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else repr(err)


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
    best_eval_success: float = 0.0
    env_steps_per_s: float = 0.0
    updates_per_s: float = 0.0
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


def _ray_init(cfg, plan) -> bool:
    """Start (or join) Ray unless this process already did; True when started here."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from rlinf_user.runtime.fleet import members

    try:  # one machine offers every member's robot itself, and a CPU for each worker
        ms = members(cfg)
    except ValueError as err:
        raise RunError(str(err)) from err
    wanted = tuple({k: v * m.workers for k, v in m.resources.items()} for m in ms)
    kwargs = ray_init_kwargs(cfg.placement, plan, wanted, sum(m.num_cpus * m.workers for m in ms))
    log.info("starting Ray: %s", kwargs)
    ray.init(**kwargs)
    return True


class Trainer:
    def __init__(self, cfg, run_dir: Path, on_progress: Callable[[Progress], None] | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.on_progress = on_progress or (lambda p: None)
        self.progress = Progress()
        self._tb = None
        self.best: dict[str, Any] | None = None
        best = self.run_dir / "checkpoints" / "best.pt"
        if best.exists():  # a resumed run: only a better evaluation replaces it
            import torch

            state = torch.load(best, map_location="cpu", weights_only=True)
            self.progress.best_eval_success = float(state["eval_success"])
            self.best = {"checkpoint": str(best), "policy_version": int(state["version"]), "eval_success": float(state["eval_success"])}

    # -- set-up -----------------------------------------------------------------------------
    def _start(self) -> None:
        import ray
        import torch

        from rlinf_user.runtime.env_worker import EnvWorker
        from rlinf_user.runtime.fleet import members
        from rlinf_user.runtime.learner import Learner, latest_checkpoint
        from rlinf_user.runtime.replay_service import ReplayService, interventions_as_demos, reward_settings
        from rlinf_user.runtime.weights import WeightStore

        cfg = self.cfg
        gpu = torch.cuda.is_available()
        self.plan = plan = make_plan(cfg.placement, gpu)
        self._started_ray = _ray_init(cfg, plan)
        self.EnvWorkerActor = ray.remote(EnvWorker)
        self.weights = ray.remote(WeightStore).options(**plan.weights.actor_options()).remote()
        try:
            self.members = members(cfg)
        except ValueError as err:
            raise RunError(str(err)) from err
        self.pool = WorkerPool(cfg, plan, self.weights, self.members, self.EnvWorkerActor)
        self.reward_server = None
        if cfg.reward.classifier:
            self._start_reward_server()
        try:
            self.spec = self.pool.start()
        except PoolError as err:
            raise RunError(str(err)) from err
        except (ray.exceptions.RayError, ValueError) as err:
            raise RunError(
                f"the environment {cfg.env.backend}:{cfg.env.task} could not start: {_root_cause(err)} "
                "(`rlinf-user doctor` lists what is missing)"
            ) from err
        log.info("env spec: %s", self.spec)
        if self.reward_server is not None and len(self.members) == 1:
            own_state = self.spec.get("env_state_dim", self.spec["state_dim"])
            rs = self.reward_spec
            missing = sorted(set(rs["cameras"]) - set(self.spec["cameras"]))
            if rs["state_dim"] != own_state or missing:
                raise RunError(
                    f"reward.classifier={cfg.reward.classifier} was trained on state_dim {rs['state_dim']} and cameras "
                    f"{sorted(rs['cameras'])}; this env has state_dim {own_state} and cameras {sorted(self.spec['cameras'])}"
                )
        check_demos(cfg.demos, self.spec)
        self.rollout_server = None
        if plan.rollout is not None:
            self._start_rollout_server()
        self.replay = None
        if plan.replay is not None:
            self.replay = (
                ray.remote(ReplayService)
                .options(**plan.replay.actor_options())
                .remote(
                    cfg.buffer.capacity,
                    str(self.run_dir / "buffer") if cfg.buffer.persist else None,
                    cfg.demos,
                    cfg.seed,
                    list(self.spec["cameras"]),
                    interventions_as_demos(cfg),
                    bool(cfg.buffer.get("keep_full_log", False)),
                    float(cfg.buffer.get("segment_mb", 256.0)),
                    reward_settings(cfg),
                )
            )
        self._learner_cls = ray.remote(Learner)
        self.learner = self._learner_cls.options(**plan.learner.actor_options()).remote(
            cfg, self.spec, str(self.run_dir), self.weights, self.replay
        )
        if cfg.resume:
            ckpt = latest_checkpoint(self.run_dir)
            if ckpt is None:
                log.warning("resume=%s: no checkpoint yet, starting the learner fresh", cfg.resume)
            else:
                state = ray.get(self.learner.load_checkpoint.remote(str(ckpt)))
                self.progress.env_steps = state["env_steps"]
                self.progress.updates = state["num_updates"]
                log.info("resumed from %s: %s", ckpt, state)
        try:
            self.progress.version = ray.get(self.learner.publish.remote(), timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as err:
            raise RunError(
                f"the learner did not start within {START_TIMEOUT_S:.0f} s: no node has free "
                f"{plan.learner.actor_options()} (`ray status` shows what the cluster offers)"
            ) from err
        self.sink = self.replay if self.replay is not None else self.learner
        self.pool.set_sink(self.sink)
        # A simulator gets its own evaluation worker (member 0's env). A robot is one
        # physical thing: its first training worker runs the evaluation episodes between
        # rollout chunks.
        self.shares_robot = self.members[0].env.kind == "robot"
        self._own_eval_worker = None
        if not self.shares_robot:
            self._own_eval_worker = self.EnvWorkerActor.options(**plan.eval_worker.actor_options()).remote(
                cfg, 999, self.weights, None, cfg.seed + 999_983, 1, self.members[0], self.spec
            )
        if self.cfg.resume:
            log.info("replay after restore: %s", ray.get(self.learner.replay_stats.remote()))

    def _start_reward_server(self) -> None:
        import ray

        from rlinf_user.runtime.reward_server import RewardServer, server_name

        name = server_name(str(self.run_dir))
        rw = self.cfg.reward
        self.reward_server = (
            ray.remote(RewardServer)
            .options(name=name, **self.plan.reward.actor_options())
            .remote(str(rw.classifier), rw.threshold, float(rw.success_reward))
        )
        try:
            self.reward_spec = ray.get(self.reward_server.spec.remote(), timeout=START_TIMEOUT_S)
        except (ray.exceptions.RayError, ValueError) as err:
            raise RunError(f"reward.classifier={rw.classifier}: {_root_cause(err)}") from err
        self.pool.reward_name = name
        self._reward_ping = None
        self._reward_pinged = 0.0

    def _watch_reward_server(self) -> None:
        """Replace a dead reward server under the same name: workers find it again."""
        import ray

        if self.reward_server is None:
            return
        if self._reward_ping is None:  # a ping every few seconds, not every pass of the loop
            if time.monotonic() - self._reward_pinged < 2.0:
                return
            self._reward_pinged = time.monotonic()
            self._reward_ping = self.reward_server.pid.remote()
            return
        ready, _ = ray.wait([self._reward_ping], timeout=0)
        if not ready:
            return
        try:
            ray.get(self._reward_ping)
            self._reward_ping = None
            return
        except ray.exceptions.RayActorError:
            pass
        self._count_restart("reward", MAX_ROLLOUT_RESTARTS)
        log.error("the reward server died; starting a new one")
        try:
            ray.kill(self.reward_server, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        deadline = time.monotonic() + 30
        while True:  # the name is free once the cluster has recorded the death
            try:
                self._start_reward_server()
                break
            except ValueError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _count_restart(self, role: str, limit: int, err: BaseException | None = None) -> None:
        """Count one restart of ``role`` (``Progress.<role>_restarts``); past ``limit`` the run stops."""
        n = getattr(self.progress, f"{role}_restarts") + 1
        setattr(self.progress, f"{role}_restarts", n)
        if n > limit:
            last = f" (last: {_root_cause(err)})" if err is not None else ""
            raise RunError(
                f"the {role} died {n} times{last}; continue the run with `rlinf-user train resume={self.run_dir}`"
            ) from err

    def _start_rollout_server(self) -> None:
        import ray

        from rlinf_user.runtime.rollout_server import RolloutServer

        self.rollout_server = (
            ray.remote(RolloutServer).options(**self.plan.rollout.actor_options()).remote(self.cfg, self.spec, self.weights)
        )
        self.pool.set_rollout(self.rollout_server, wait=False)

    def _rollout_lost(self) -> None:
        """A worker found the rollout server gone: start a new one unless that was done
        already (every worker reports the same loss)."""
        import ray

        try:
            ray.get(self.rollout_server.ping.remote(), timeout=30)
            self.pool.set_rollout(self.rollout_server, wait=False)  # alive: a worker saw the old one
            return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        self._count_restart("rollout", MAX_ROLLOUT_RESTARTS)
        log.error("the rollout server died; starting a new one")
        try:
            ray.kill(self.rollout_server, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._start_rollout_server()

    @property
    def eval_worker(self):
        if self._own_eval_worker is not None:
            return self._own_eval_worker
        first = next((s for s in self.pool.slots if s.member.index == 0 and s.status == "running"), None)
        return None if first is None else first.actor

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> Progress:
        import ray

        cfg, p = self.cfg, self.progress
        self._start()
        self._open_tensorboard()
        t_start = time.monotonic()
        recent = deque(maxlen=RECENT_EPISODES)
        supervised = deque(maxlen=20)
        is_supervised = bool(cfg.intervention.enabled)
        # Each worker always has its next rollout call queued behind the running one, so it
        # goes straight on (a robot never idles while this loop books a finished chunk).
        rollout_calls: dict[Any, tuple[int, int]] = {}
        pool = self.pool

        def queue(slot, n: int = ROLLOUTS_IN_FLIGHT) -> None:
            for _ in range(n):
                rollout_calls[self._rollout(slot.actor)] = (slot.index, slot.generation)

        for slot in pool.running():
            queue(slot)
        last_idle_warning = time.monotonic()
        train_call = self.learner.train.remote(TRAIN_CALL_UPDATES, p.env_steps)
        eval_call = None
        next_eval = p.env_steps + cfg.eval_every_steps
        next_ckpt = p.env_steps + cfg.checkpoint_every_steps
        last_report, last_steps, last_updates, last_t = 0.0, p.env_steps, p.updates, time.monotonic()
        stop_reason = "total_env_steps reached"
        while True:
            pending = list(rollout_calls) + [train_call] + ([eval_call] if eval_call else [])
            done, _ = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in done:
                if ref is train_call:
                    try:
                        m = ray.get(ref)
                    except ray.exceptions.RayActorError as err:
                        self._restart_learner(err)
                        train_call = self.learner.train.remote(TRAIN_CALL_UPDATES, p.env_steps)
                        continue
                    p.updates, p.version = m["num_updates"], m["version"]
                    if m["updates"]:
                        self._scalars({k: v for k, v in m.items() if isinstance(v, float)}, "learner")
                    train_call = self.learner.train.remote(TRAIN_CALL_UPDATES, p.env_steps)
                elif ref is eval_call:
                    eval_call = None
                    try:
                        self._record_eval(ray.get(ref), time.monotonic() - t_start)
                    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                        log.error("evaluation failed (%s); the next one runs on a fresh worker", _root_cause(err))
                        self._replace_eval_worker()
                else:
                    i, gen = rollout_calls.pop(ref)
                    slot = pool.slots[i]
                    try:
                        r = ray.get(ref)
                    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                        if gen != slot.generation or slot.status != "running":
                            continue  # a queued call of a worker already replaced
                        p.worker_restarts += 1
                        try:
                            restarted = pool.failed(slot, err)
                        except PoolError as pool_err:
                            raise RunError(
                                f"{pool_err}; continue with `rlinf-user train resume={self.run_dir}`"
                            ) from err
                        if restarted:
                            queue(slot)
                        continue
                    pool.note(slot, r)
                    self._book_rollout(r, recent, supervised, is_supervised and i == 0)
                    if r.get("rollout_lost"):
                        self._rollout_lost()
                    queued = sum(1 for j, _ in rollout_calls.values() if j == i)
                    if p.env_steps + queued * ROLLOUT_STEPS < cfg.total_env_steps:
                        rollout_calls[self._rollout(slot.actor)] = (i, slot.generation)
            self._watch_reward_server()
            for slot in pool.arrivals():
                if p.env_steps < cfg.total_env_steps:
                    queue(slot)
            if not rollout_calls and p.env_steps < cfg.total_env_steps and time.monotonic() - last_idle_warning > 30:
                last_idle_warning = time.monotonic()
                log.warning("no env worker is running (fleet: %s); waiting for a node to come back", pool.status())
            p.wall = time.monotonic() - t_start
            if eval_call is None and p.env_steps >= next_eval and self.eval_worker is not None:
                next_eval += cfg.eval_every_steps
                eval_call = self.eval_worker.evaluate.remote(cfg.eval_episodes, False, p.best_eval_success)
            if p.env_steps >= next_ckpt:
                next_ckpt += cfg.checkpoint_every_steps
                self.learner.save_checkpoint.remote(p.env_steps)
            now = time.monotonic()
            if now - last_report > 1.0:
                dt = now - last_t
                p.env_steps_per_s = (p.env_steps - last_steps) / dt
                p.updates_per_s = (p.updates - last_updates) / dt
                last_steps, last_updates, last_t, last_report = p.env_steps, p.updates, now, now
                self._scalars(
                    {"env_steps_per_s": p.env_steps_per_s, "updates_per_s": p.updates_per_s,
                     "recent_success": p.recent_success, "policy_version": float(p.version)},
                    "runtime",
                )
                self.on_progress(p)
            if cfg.target_success is not None and (p.eval_success or 0.0) >= cfg.target_success:
                stop_reason = f"evaluation success {p.eval_success:.2f} >= target {cfg.target_success}"
                break
            if cfg.max_wall_minutes is not None and p.wall > 60 * cfg.max_wall_minutes:
                stop_reason = f"max_wall_minutes={cfg.max_wall_minutes} reached"
                break
            if not rollout_calls and p.env_steps >= cfg.total_env_steps:
                break
        log.info("stopping: %s", stop_reason)
        try:
            ray.get(train_call)
        except ray.exceptions.RayActorError as err:
            self._restart_learner(err)
        if eval_call is not None:
            try:
                self._record_eval(ray.get(eval_call), time.monotonic() - t_start)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                log.error("evaluation failed: %s", _root_cause(err))
        ckpt = ray.get(self.learner.save_checkpoint.remote(p.env_steps))
        final = self._final_eval(time.monotonic() - t_start)
        summary = {
            "stop_reason": stop_reason,
            "env_steps": p.env_steps,
            "episodes": p.episodes,
            "updates": p.updates,
            "policy_version": p.version,
            "wall_seconds": round(p.wall, 1),
            "final_eval_success": final["success_rate"],
            "best_eval_success": p.best_eval_success,
            "checkpoint": ckpt,
            "best": self.best,
            "worker_restarts": p.worker_restarts,
            "learner_restarts": p.learner_restarts,
            "rollout_restarts": p.rollout_restarts,
            "rollout_server": self._stats_of(self.rollout_server),
            "reward_restarts": p.reward_restarts,
            "reward_server": self._stats_of(self.reward_server),
            "classified_success": p.classified_success,
            "recent_success": p.recent_success,
            "recent_episodes": RECENT_EPISODES,
            "members": self.member_stats(),
            "placement": self._where(),
            "interventions": p.interventions,
            "teleop_device_lost": p.supervisor_lost,
            "replay": ray.get(self.learner.replay_stats.remote()),
        }
        write_json(self.run_dir / "eval" / "summary.json", summary)
        self.on_progress(p)
        self.summary = summary
        return p

    def _book_rollout(self, r: dict[str, Any], recent: deque, supervised: deque, is_supervised: bool) -> None:
        p = self.progress
        p.env_steps += r["steps"]
        member = p.members.setdefault(r.get("member", "env"), {"env_steps": 0, "episodes": 0, "recent": deque(maxlen=RECENT_EPISODES)})
        member["env_steps"] += r["steps"]
        for ep in r["episodes"]:
            p.episodes += 1
            member["episodes"] += 1
            member["recent"].append(ep)
            recent.append(ep)
            scalars = {"return": ep["return"], "success": float(ep["success"])}
            if "classified_success" in ep:
                scalars["classified_success"] = float(ep["classified_success"])
            if is_supervised:
                supervised.append(ep)
                p.interventions += ep["intervention_steps"]
                scalars["intervention_rate"] = ep["intervention_steps"] / max(1, ep["length"])
            self._scalars(scalars, "episode")
            if len(self.members) > 1:
                self._scalars({"return": ep["return"], "success": float(ep["success"])}, f"member/{ep['member']}")
        if supervised:
            p.intervention_rate = sum(e["intervention_steps"] for e in supervised) / max(
                1, sum(e["length"] for e in supervised)
            )
        if r.get("supervisor_lost") and not p.supervisor_lost:
            p.supervisor_lost = r["supervisor_lost"]
            log.error("teleop device lost (%s): training goes on without interventions", p.supervisor_lost)
        classified = [e["classified_success"] for e in recent if "classified_success" in e]
        if classified:
            p.classified_success = float(np.mean(classified))
        if recent:
            p.recent_success = float(np.mean([e["success"] for e in recent]))
            p.recent_return = float(np.mean([e["return"] for e in recent]))

    def member_stats(self) -> dict[str, dict[str, Any]]:
        """Per fleet member: env steps, episodes, recent success, worker states, nodes."""
        status = self.pool.status() if hasattr(self, "pool") else {}
        out = {}
        for m in getattr(self, "members", []):
            got = self.progress.members.get(m.name, {"env_steps": 0, "episodes": 0, "recent": []})
            recent = list(got["recent"])
            out[m.name] = {
                "env_steps": got["env_steps"],
                "episodes": got["episodes"],
                "recent_success": float(np.mean([e["success"] for e in recent])) if recent else None,
                **status.get(m.name, {}),
            }
        return out

    def _restart_learner(self, err: BaseException) -> None:
        """A dead learner comes back from its latest checkpoint, with the buffer restored
        from its log (collocated) or still held by the replay actor (disaggregated). Its
        first version is above every version already published, so the sequence the env
        workers see never goes back."""
        import ray

        from rlinf_user.runtime.learner import latest_checkpoint

        p = self.progress
        self._count_restart("learner", MAX_LEARNER_RESTARTS, err)
        log.error("the learner died (%s); restarting it from its latest checkpoint", _root_cause(err))
        try:
            ray.kill(self.learner, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.learner = self._learner_cls.options(**self.plan.learner.actor_options()).remote(
            self.cfg, self.spec, str(self.run_dir), self.weights, self.replay, recovering=True
        )
        ckpt = latest_checkpoint(self.run_dir)
        floor = ray.get(self.weights.current_version.remote())
        state = ray.get(self.learner.recover.remote(str(ckpt) if ckpt else None, floor))
        p.updates = state["num_updates"]
        p.version = ray.get(self.learner.publish.remote())  # the next version, at once
        log.info("learner restarted from %s: %s; publishing v%d", ckpt or "scratch", state, p.version)
        if self.replay is None:  # collocated: the new learner holds the buffer; point workers at it
            self.sink = self.learner
            self.pool.set_sink(self.sink, wait=False)

    @staticmethod
    def _stats_of(server) -> dict[str, Any] | None:
        """A service role's own counters (rollout, reward), or why they are missing."""
        import ray

        if server is None:
            return None
        try:
            return ray.get(server.stats.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            return {"error": _root_cause(err)}

    def _where(self) -> dict[str, Any]:
        """The node each role ran on (members: every node their workers used)."""
        import ray

        out: dict[str, Any] = {"learner": ray.get(self.learner.where.remote())["node"]}
        out["replay"] = ray.get(self.replay.where.remote())["node"] if self.replay is not None else out["learner"]
        if self.rollout_server is not None:
            out["rollout"] = ray.get(self.rollout_server.where.remote())["node"]
        out["members"] = {name: st.get("nodes", []) for name, st in self.pool.status().items()}
        return out

    def _replace_eval_worker(self) -> None:
        import ray

        if self._own_eval_worker is None:
            return  # a robot's eval runs on its training worker, replaced with it
        try:
            ray.kill(self._own_eval_worker, no_restart=True)
        except Exception:  # noqa: BLE001 - gone with its node
            pass
        self._own_eval_worker = self.EnvWorkerActor.options(**self.plan.eval_worker.actor_options()).remote(
            self.cfg, 999, self.weights, None, self.cfg.seed + 999_983, 1, self.members[0], self.spec
        )

    def _rollout(self, worker):
        random = self.progress.env_steps < self.cfg.algo.learning_starts and not self.cfg.resume
        return worker.rollout.remote(ROLLOUT_STEPS, random)

    # -- evaluation, logging -------------------------------------------------------------
    def _record_eval(self, result: dict[str, Any], wall: float) -> None:
        p = self.progress
        p.eval_success = result["success_rate"]
        if "policy_state" in result and p.eval_success > p.best_eval_success:
            self._save_best(result, p.env_steps)
        p.best_eval_success = max(p.best_eval_success, p.eval_success)
        row = {
            "env_steps": p.env_steps,
            "wall_seconds": round(wall, 2),
            "updates": p.updates,
            "policy_version": result["policy_version"],
            "success_rate": result["success_rate"],
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
        self._scalars({"success_rate": row["success_rate"], "mean_return": row["mean_return"]}, "eval")
        log.info("eval @ %d steps (%.0fs, v%d): success %.2f", p.env_steps, wall, row["policy_version"], p.eval_success)

    def _save_best(self, result: dict[str, Any], env_steps: int) -> None:
        """The weights that scored the best evaluation so far, exactly as evaluated
        (``checkpoints/best.pt``; ``rlinf-user eval RUN`` takes it): the latest policy can
        be worse than one it replaced."""
        import torch

        path = self.run_dir / "checkpoints" / "best.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        state = {
            "policy": result["policy_state"], "version": int(result["policy_version"]), "env_steps": int(env_steps),
            "spec": self.spec, "eval_success": float(result["success_rate"]), "eval_episodes": int(result["episodes"]),
        }  # fmt: skip
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic
        self.best = {"checkpoint": str(path), "policy_version": state["version"], "eval_success": state["eval_success"]}
        log.info("new best policy v%d (evaluation success %.2f) -> %s", state["version"], state["eval_success"], path)

    def _final_eval(self, wall: float) -> dict[str, Any]:
        import ray

        worker = self.eval_worker
        if worker is None:
            log.warning("no final evaluation: member %s has no running worker", self.members[0].name)
            return {"success_rate": None}
        try:
            result = ray.get(worker.evaluate.remote(self.cfg.eval_episodes, False, self.progress.best_eval_success))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
            log.error("the final evaluation failed: %s", _root_cause(err))
            return {"success_rate": None}
        self._record_eval(result, wall)
        return result

    def _open_tensorboard(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # pragma: no cover - tensorboard is a core dependency
            log.warning("tensorboard is not installed: no event files")
            return
        self._tb = SummaryWriter(str(self.run_dir / "tb"))

    def _scalars(self, values: dict[str, float], prefix: str) -> None:
        if self._tb is None:
            return
        for k, v in values.items():
            self._tb.add_scalar(f"{prefix}/{k}", v, self.progress.env_steps)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pids(self) -> dict[str, int]:
        """Process ids of the learner and the first env worker (resource sampling, tests)."""
        import ray

        return {"learner": ray.get(self.learner.pid.remote()), "env": ray.get(self.pool.slots[0].actor.pid.remote())}

    def close(self) -> None:
        import ray

        if self._tb is not None:
            self._tb.close()
        if hasattr(self, "pool"):
            self.pool.close()
        eval_worker = getattr(self, "_own_eval_worker", None)
        for actor in (eval_worker, getattr(self, "learner", None), getattr(self, "rollout_server", None)):
            if actor is not None:
                try:
                    ray.get(actor.close.remote(), timeout=10)
                except Exception:  # noqa: BLE001 - best effort on shutdown
                    pass
        # Free the run's resources now rather than when the handles are garbage collected,
        # so a following run in the same Ray session can be scheduled.
        names = ("learner", "replay", "weights", "rollout_server", "reward_server")
        for actor in [eval_worker, *(getattr(self, name, None) for name in names)]:
            if actor is not None:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass
        if getattr(self, "_started_ray", False):  # a runtime this run started ends with it
            ray.shutdown()
            self._started_ray = False


def check_demos(path: str | None, spec: dict) -> None:
    """Refuse a demonstration dataset that does not fit the env, before anything trains."""
    if not path:
        return
    if not (Path(path) / "meta" / "info.json").exists():
        return  # a replay log: its schema is checked when batches are drawn
    from rlinf_user.data.lerobot_format import DatasetError
    from rlinf_user.data.lerobot_reader import LeRobotReader, demo_mismatch

    try:
        problems = demo_mismatch(LeRobotReader(path), spec)
    except DatasetError as err:
        raise RunError(f"demos={path}: {err}") from err
    if problems:
        raise RunError(f"demos={path} does not fit this env: " + "; ".join(problems))
