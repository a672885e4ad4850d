"""Keeping a run's roles alive: a dead learner, rollout server, reward server or
evaluation worker is replaced, each at most a few times (then the run stops and says how
to resume). Mixed into :class:`rlinf_user.runtime.orchestration.trainer.Trainer`."""

from __future__ import annotations

import logging
import time
from typing import Any

from rlinf_user.runtime.orchestration.run_record import RunError, root_cause
from rlinf_user.runtime.orchestration.workers import START_TIMEOUT_S
from rlinf_user.seeds import EVAL_WORKER_ID, eval_worker_seed

log = logging.getLogger(__name__)

MAX_LEARNER_RESTARTS = 3
MAX_ROLLOUT_RESTARTS = 3


def _kill(actor) -> None:
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone (with its node)
        pass


class Supervision:
    def _count_restart(self, role: str, limit: int, err: BaseException | None = None) -> None:
        """Count one restart of ``role`` (``Progress.<role>_restarts``); past ``limit`` the run stops."""
        n = getattr(self.progress, f"{role}_restarts") + 1
        setattr(self.progress, f"{role}_restarts", n)
        if n > limit:
            last = f" (last: {root_cause(err)})" if err is not None else ""
            raise RunError(
                f"the {role} died {n} times{last}; continue the run with `rlinf-user train resume={self.run_dir}`"
            ) from err

    # -- learner ----------------------------------------------------------------------------
    def _new_learner(self, recovering: bool = False):
        options = self.plan.learner.actor_options()
        return self._learner_cls.options(**options).remote(
            self.cfg, self.spec, str(self.run_dir), self.weights, self.replay, recovering=recovering,
            replica_options={k: v for k, v in options.items() if k != "max_concurrency"}, defer_demos=True,
        )  # fmt: skip

    def _restart_learner(self, err: BaseException) -> None:
        """A dead learner comes back from its latest checkpoint, with the buffer restored
        from its log (collocated) or still held by the replay actor (disaggregated). Its
        first version is above every version already published, so the sequence the env
        workers see never goes back."""
        import ray

        from rlinf_user.runtime.learning.learner import latest_checkpoint

        p = self.progress
        self._count_restart("learner", MAX_LEARNER_RESTARTS, err)
        log.error("the learner died (%s); restarting it from its latest checkpoint", root_cause(err))
        _kill(self.learner)
        self.learner = self._new_learner(recovering=True)
        self._load_demos(self.learner)  # collocated: the demo side of its batches
        ckpt = latest_checkpoint(self.run_dir)
        floor = ray.get(self.weights.current_version.remote())
        state = ray.get(self.learner.recover.remote(str(ckpt) if ckpt else None, floor))
        p.updates = state["num_updates"]
        p.version = ray.get(self.learner.publish.remote())  # the next version, at once
        log.info("learner restarted from %s: %s; publishing v%d", ckpt or "scratch", state, p.version)
        if self.replay is None:  # collocated: the new learner holds the buffer; point workers at it
            self.sink = self.learner
            self.pool.set_sink(self.sink, wait=False)

    # -- reward server ----------------------------------------------------------------------
    def _start_reward_server(self) -> None:
        import ray

        from rlinf_user.runtime.serving.reward_server import RewardServer, server_name

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
            raise RunError(f"reward.classifier={rw.classifier}: {root_cause(err)}") from err
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
        _kill(self.reward_server)
        deadline = time.monotonic() + 30
        while True:  # the name is free once the cluster has recorded the death
            try:
                self._start_reward_server()
                break
            except ValueError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    # -- rollout server ---------------------------------------------------------------------
    def _start_rollout_server(self) -> None:
        import ray

        from rlinf_user.runtime.serving.rollout_server import RolloutServer

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
        _kill(self.rollout_server)
        self._start_rollout_server()

    # -- evaluation worker ------------------------------------------------------------------
    def _new_eval_worker(self):
        return self.EnvWorkerActor.options(**self.plan.eval_worker.actor_options()).remote(
            self.cfg, worker_id=EVAL_WORKER_ID, weight_store=self.weights, seed=eval_worker_seed(self.cfg.seed),
            num_envs=1, member=self.members[0], fleet_spec=self.spec,
        )  # fmt: skip

    @property
    def eval_worker(self):
        if self._own_eval_worker is not None:
            return self._own_eval_worker
        first = next((s for s in self.pool.slots if s.member.index == 0 and s.status == "running"), None)
        return None if first is None else first.actor

    def _replace_eval_worker(self) -> None:
        if self._own_eval_worker is None:
            return  # a robot's eval runs on its training worker, replaced with it
        _kill(self._own_eval_worker)
        self._own_eval_worker = self._new_eval_worker()

    @staticmethod
    def _stats_of(server) -> dict[str, Any] | None:
        """A service role's own counters (rollout, reward), or why they are missing."""
        import ray

        if server is None:
            return None
        try:
            return ray.get(server.stats.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            return {"error": root_cause(err)}
