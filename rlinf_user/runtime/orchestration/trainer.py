"""A training run on Ray: set-up of its roles, the driver loop, the summary.

The roles (env workers, learner, replay, rollout and reward servers, an evaluation
worker) are placed by :mod:`rlinf_user.runtime.orchestration.placement`; the driver loop that routes
their completions is in :mod:`rlinf_user.runtime.orchestration.loops` (streaming for replay algorithms,
synchronous rounds for on-policy ones); what the run records is in
:mod:`rlinf_user.runtime.orchestration.run_record`; replacing dead roles in
:mod:`rlinf_user.runtime.orchestration.supervision`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlinf_user.rundir import write_json
from rlinf_user.runtime.orchestration.placement import make_plan, ray_init_kwargs, start_ray
from rlinf_user.runtime.orchestration.run_record import RECENT_EPISODES, Progress, RunError, RunRecord, root_cause
from rlinf_user.runtime.orchestration.supervision import Supervision
from rlinf_user.runtime.orchestration.workers import START_TIMEOUT_S, PoolError, WorkerPool

log = logging.getLogger(__name__)

__all__ = ["Progress", "RunError", "Trainer", "check_demos"]


def _ray_init(cfg, plan) -> bool:
    """Start (or join) Ray unless this process already did; True when started here."""
    import ray

    if ray.is_initialized():
        return False
    from rlinf_user.runtime.rollout.fleet import members

    try:  # one machine offers every member's robot itself, and a CPU for each worker
        ms = members(cfg)
    except ValueError as err:
        raise RunError(str(err)) from err
    wanted = tuple({k: v * m.workers for k, v in m.resources.items()} for m in ms)
    return start_ray(ray_init_kwargs(cfg.placement, plan, wanted, sum(m.num_cpus * m.workers for m in ms)))


class Trainer(Supervision):
    def __init__(self, cfg, run_dir: Path, on_progress: Callable[[Progress], None] | None = None):
        from rlinf_user.algorithms.base import ON_POLICY, data_plan

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.on_progress = on_progress or (lambda p: None)
        self.stop_requested: str | None = None  # set by stop(): the loops end at their next tick
        self.data_plan = data_plan(cfg.algo)  # what the algorithm trains on (replay or on-policy)
        self.on_policy = self.data_plan.data_mode == ON_POLICY
        self.record = RunRecord(self.run_dir, bool(cfg.intervention.enabled), len(cfg.fleet or []) > 1)
        from rlinf_user.runtime.orchestration.drift import DriftWatch
        from rlinf_user.runtime.planning.replan import Replanner

        self.drift = DriftWatch.of_run(self.run_dir, None if self.on_policy else float(self.data_plan.utd_ratio))
        plan = DriftWatch.plan_of(self.run_dir)  # placement=auto's plan (None: placed by hand)
        self.replanner = (Replanner(plan, int(cfg.placement.get("max_env_workers", 0) or 0))
                          if Replanner.applies(plan, self.on_policy) and len(cfg.fleet or []) <= 1 else None)  # fmt: skip

    def replan(self, drifted: bool | None, at_s: float) -> None:
        """placement=auto's re-plan (:meth:`~rlinf_user.runtime.planning.replan.Replanner.step`)
        at the end of a drift window (``drifted``) or between windows (None: the cluster's
        CPUs checked), applied: the pool's worker target, the drift watch's prediction."""
        if self.replanner is None:
            return
        import ray

        cpus = float(ray.cluster_resources().get("CPU", 0.0))
        decision = self.replanner.step(drifted, cpus, len(self.pool.running()), at_s)
        if decision is not None:
            self.pool.set_target(decision["workers"]["to"])
            if self.drift is not None:
                self.drift.repredict(decision["score"])

    @property
    def progress(self) -> Progress:
        return self.record.progress

    # -- set-up -----------------------------------------------------------------------------
    def _start(self) -> None:
        import ray
        import torch
        from omegaconf import OmegaConf

        from rlinf_user.data.replay import expected_schema
        from rlinf_user.policies.frame_features import frame_feature_settings
        from rlinf_user.runtime.learning.learner import Learner, latest_checkpoint
        from rlinf_user.runtime.learning.replay_service import ReplayService, interventions_as_demos, reward_settings
        from rlinf_user.runtime.rollout.env_worker import EnvWorker
        from rlinf_user.runtime.rollout.fleet import members
        from rlinf_user.runtime.weights.versions import WeightStore

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
                f"the environment {cfg.env.backend}:{cfg.env.task} could not start: {root_cause(err)} "
                "(`rlinf-user doctor` lists what is missing)"
            ) from err
        log.info("env spec: %s", self.spec)
        if self.reward_server is not None and len(self.members) == 1:
            own_state = self.spec.env_state_dim
            rs = self.reward_spec
            missing = sorted(set(rs["cameras"]) - set(self.spec.cameras))
            if rs["state_dim"] != own_state or missing:
                raise RunError(
                    f"reward.classifier={cfg.reward.classifier} was trained on state_dim {rs['state_dim']} and cameras "
                    f"{sorted(rs['cameras'])}; this env has state_dim {own_state} and cameras {sorted(self.spec.cameras)}"
                )
        check_demos(cfg.demos, self.spec, None if reward_settings(cfg) else cfg.env)
        self.rollout_server = None
        if plan.rollout is not None:
            self._start_rollout_server()
        self.replay = None
        if plan.replay is not None and not self.on_policy:  # on-policy segments go to the learner
            self.replay = (
                ray.remote(ReplayService)
                .options(**plan.replay.actor_options())
                .remote(
                    cfg.buffer.capacity,
                    str(self.run_dir / "buffer") if cfg.buffer.persist else None,
                    None,  # the demonstrations: loaded once it is placed, below
                    cfg.seed,
                    list(self.spec.cameras),
                    interventions_as_demos(cfg),
                    bool(cfg.buffer.get("keep_full_log", False)),
                    float(cfg.buffer.get("segment_mb", 256.0)),
                    reward_settings(cfg),
                    bool(self.spec.instruction),
                    self.data_plan.n_step,
                    self.data_plan.gamma,
                    frame_feature_settings(cfg),
                    expected_schema(self.spec.state_dim, dict(self.spec.cameras),
                                    frames=frame_feature_settings(cfg) is None),
                    # algo=dsrl with encoder=base: the replay builds the frozen base to embed rows
                    {"policy": OmegaConf.to_container(cfg.policy, resolve=True), "spec": self.spec.to_dict()}
                    if cfg.policy.get("encoder") == "base" else None,
                )
            )
            self._check_started(self.replay, "the replay buffer")
            if cfg.demos:  # as long as it takes (no start timeout): a large camera set takes minutes
                self._load_demos(self.replay, cfg.demos)
        self._learner_cls = ray.remote(Learner)
        self.learner = self._new_learner()
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
            ray.get(self.learner.started.remote(), timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as err:
            raise RunError(
                f"the learner did not start within {START_TIMEOUT_S:.0f} s: no node has free "
                f"{plan.learner.actor_options()} (`ray status` shows what the cluster offers)"
            ) from err
        except ray.exceptions.RayActorError as err:
            raise RunError(f"the learner could not start: {root_cause(err)}") from err
        # as long as they take (no start timeout): encoding a large set of camera demonstrations
        # on a busy CPU outlasted the start timeout, and the run was refused as unplaceable
        self._load_demos(self.learner)
        ray.get(self.learner.warm_start_if_due.remote())
        self.progress.version = ray.get(self.learner.publish.remote())
        self.sink = self.replay if self.replay is not None else self.learner
        self.pool.set_sink(self.sink)
        # A simulator gets its own evaluation worker (member 0's env). A robot is one
        # physical thing: its first training worker runs the evaluation episodes between
        # rollout chunks.
        self._own_eval_worker = None
        if self.members[0].env.kind != "robot":
            self._own_eval_worker = self._new_eval_worker()
            if self.pool.max_workers > len(self.pool.slots):  # elastic: its CPU is the run's, not a spare one
                self._check_started(self._own_eval_worker, "the evaluation worker")
        if self.replanner is not None:  # placement=auto: as many workers as planned, until a re-plan says more
            self.pool.target = self.replanner.live.workers
            self.replan(None, 0.0)  # the cluster's CPUs now
        self.pool.growing = True  # every role of the run is placed: free CPUs are free now
        if self.cfg.resume:
            log.info("replay after restore: %s", ray.get(self.learner.replay_stats.remote()))

    def _load_demos(self, actor, *path: str) -> int:
        """The demonstrations, loaded by the actor that samples them (no timeout); a set that
        fails while it loads is one clear error, as it was when the constructor loaded it."""
        import ray

        try:
            return ray.get(actor.load_demos.remote(*path))
        except ray.exceptions.RayError as err:
            raise RunError(f"demos={self.cfg.demos}: could not be loaded: {root_cause(err)}") from err

    def _check_started(self, actor, what: str) -> None:
        """Wait for an actor's constructor; its failure (e.g. a replay capacity that
        cannot fit) becomes one clear error before any worker sends a row."""
        import ray

        try:
            ray.get(actor.pid.remote(), timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError as err:
            raise RunError(f"{what} did not start within {START_TIMEOUT_S:.0f} s") from err
        except ray.exceptions.RayActorError as err:
            raise RunError(f"{what} could not start: {root_cause(err)}") from err

    # -- main loop ----------------------------------------------------------------------------
    def rows_per_round(self) -> int:
        """Transitions one on-policy round collects: every env of every worker, num_steps each."""
        steps = self.data_plan.num_steps if self.on_policy else 1
        return sum(m.workers * m.envs_per_worker for m in self.members) * steps

    def run(self) -> Progress:
        import ray

        from rlinf_user.evaluation import EVAL_ACCOUNTING
        from rlinf_user.runtime.orchestration.loops import Schedule, streaming_loop, sync_on_policy_loop

        cfg, p = self.cfg, self.progress
        self._start()
        self.record.open_tensorboard()
        sched = Schedule(self)
        sync = self.on_policy and self.data_plan.sync
        stop_reason = sync_on_policy_loop(self, sched) if sync else streaming_loop(self, sched)
        log.info("stopping: %s", stop_reason)
        sched.finish()
        ckpt = ray.get(self.learner.save_checkpoint.remote(p.env_steps))
        final = self._final_eval(sched.wall())
        test = self._test_eval()
        summary = {
            "stop_reason": stop_reason,
            "algo": str(cfg.algo.name),
            "env_steps": p.env_steps,
            "episodes": p.episodes,
            "updates": p.updates,
            "policy_version": p.version,
            "wall_seconds": round(p.wall, 1),
            "final_eval_success": final["success_rate"],
            "final_eval": {k: final.get(k) for k in EVAL_ACCOUNTING},
            "best_eval_success": p.best_eval_success,
            # where success ended below its best by more than its interval (None: it held)
            "fell_from_best": {"evaluation": p.eval_fall, "training": p.recent_fall},
            "best_recent_success": self.record.recent_watch.best,
            "checkpoint": ckpt,
            "best": self.record.best,
            "test_eval": test,
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
            "elastic": self.pool.events,  # workers that joined and left while the run went on
            "placement_drift": None if self.drift is None else self.drift.summary(),  # placement=auto's prediction
            "placement_replans": None if self.replanner is None else self.replanner.decisions,
            "placement": self._where(),
            # the share of the run each role spent in its calls (workers: per worker slot)
            "busy": {"workers": round(p.rollout_seconds / max(p.wall, 1e-9) / max(1, len(self.pool.slots)), 3),
                     "learner": round(p.train_seconds / max(p.wall, 1e-9), 3)},
            "interventions": p.interventions,
            "teleop_device_lost": p.supervisor_lost,
            "replay": ray.get(self.learner.replay_stats.remote()),
            "learner_replicas": self._replicas(),
        }
        write_json(self.run_dir / "eval" / "summary.json", summary)
        self.on_progress(p)
        self.summary = summary
        return p

    @property
    def best(self) -> dict[str, Any] | None:
        return self.record.best

    def member_stats(self) -> dict[str, dict[str, Any]]:
        """Per fleet member: env steps, episodes, recent success, worker states, nodes."""
        status = self.pool.status() if hasattr(self, "pool") else {}
        return self.record.member_stats(getattr(self, "members", []), status)

    def _replicas(self) -> dict[str, Any]:
        """How many data-parallel learner replicas trained, and whether their weights agree."""
        import ray

        digests = ray.get(self.learner.replica_digests.remote())
        spread = max(digests) - min(digests)
        return {"count": len(digests), "weights_identical": bool(spread <= 1e-6 * max(1.0, abs(digests[0])))}

    def _where(self) -> dict[str, Any]:
        """The node each role ran on (members: every node their workers used)."""
        import ray

        out: dict[str, Any] = {"learner": ray.get(self.learner.where.remote())["node"]}
        out["replay"] = ray.get(self.replay.where.remote())["node"] if self.replay is not None else out["learner"]
        if self.rollout_server is not None:
            out["rollout"] = ray.get(self.rollout_server.where.remote())["node"]
        out["members"] = {name: st.get("nodes", []) for name, st in self.pool.status().items()}
        return out

    def _final_eval(self, wall: float) -> dict[str, Any]:
        import ray

        worker = self.eval_worker
        if worker is None:
            log.warning("no final evaluation: member %s has no running worker", self.members[0].name)
            return {"success_rate": None}
        try:
            result = ray.get(worker.evaluate.remote(self.cfg.eval_episodes, False, self.progress.best_eval_success))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
            log.error("the final evaluation failed: %s", root_cause(err))
            return {"success_rate": None}
        self.record.record_eval(result, wall, self.spec)
        return result

    def _test_eval(self) -> dict[str, Any] | None:
        """The kept policy (``best.pt``, else the last) on the test seeds, which no evaluation
        during training used and nothing selects on: the figure a report may quote."""
        import ray
        import torch

        from rlinf_user.evaluation import EVAL_ACCOUNTING
        from rlinf_user.policies.base import policy_state_of

        n = self.cfg.get("test_episodes")
        n = int(self.cfg.eval_episodes if n is None else n)
        worker = self.eval_worker
        if n <= 0 or worker is None or self.members[0].env.kind == "robot":
            return None
        best = self.record.best
        state = None
        if best is not None:
            state = policy_state_of(torch.load(best["checkpoint"], map_location="cpu", weights_only=True))
        try:
            result = ray.get(worker.evaluate.remote(n, False, None, False, "test", state))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
            log.error("the test evaluation failed: %s", root_cause(err))
            return None
        kept = "best" if best is not None else "last"
        version = best["policy_version"] if best is not None else result["policy_version"]
        out = {**{k: result[k] for k in EVAL_ACCOUNTING}, "mean_return": result["mean_return"], "policy": kept,
               "policy_version": version}  # fmt: skip
        log.info("test seeds, kept policy (%s, v%d): success %.2f over %d episodes", kept, version,
                 out["success_rate"], out["episodes"])  # fmt: skip
        return out

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stop(self, reason: str = "stopped on request") -> None:
        """End a running :meth:`run` (from another thread) at its loop's next tick, as any
        end does: the checkpoint, the final evaluation and the summary."""
        self.stop_requested = reason

    def pids(self) -> dict[str, int]:
        """Process ids of the learner and the first env worker (resource sampling, tests)."""
        import ray

        return {"learner": ray.get(self.learner.pid.remote()), "env": ray.get(self.pool.slots[0].actor.pid.remote())}

    def close(self) -> None:
        import ray

        self.record.close()
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


def check_demos(path: str | None, spec, env_cfg=None) -> None:
    """Refuse a demonstration dataset that does not fit the env, before anything trains.
    ``env_cfg``: also refuse rewards recorded under other reward settings (None where a
    learned reward relabels them)."""
    if not path:
        return
    if not (Path(path) / "meta" / "info.json").exists():
        return  # a replay log: its schema is checked when batches are drawn
    from rlinf_user.data.lerobot_format import REWARD_INFO_KEY, DatasetError, reward_mismatch
    from rlinf_user.data.lerobot_reader import LeRobotReader, demo_mismatch

    try:
        reader = LeRobotReader(path)
        problems = demo_mismatch(reader, spec)
    except DatasetError as err:
        raise RunError(f"demos={path}: {err}") from err
    reward = reward_mismatch(reader.info.get(REWARD_INFO_KEY), env_cfg) if env_cfg is not None else None
    if reward:
        problems.append(reward)
    if problems:
        raise RunError(f"demos={path} does not fit this env: " + "; ".join(problems))
