"""Env worker: steps a batch of contract envs with the latest published policy.

A rollout is a pipeline of stages (:mod:`rlinf_user.runtime.rollout`): observation ->
act (local or served policy, action chunks) -> step hooks (supervisor, learned reward,
group holds) -> ``envs.step`` -> transition writer -> episode bookkeeping. Weights are
polled without blocking between steps (a synchronous on-policy round waits for its
version first). With ``placement.rollout.enabled`` the rollout server acts; a server that
dies ends the call early with ``rollout_lost`` (steps kept, episodes go on) until a new
one is handed over.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from rlinf_user.env.registry import make_vector_env
from rlinf_user.env.spec import EnvSpec
from rlinf_user.policies.frame_features import frame_feature_settings
from rlinf_user.runtime.rollout.act import Actor, RolloutLost
from rlinf_user.runtime.rollout.episodes import EpisodeBook
from rlinf_user.runtime.rollout.hooks import GroupHolds, LearnedReward, Supervision
from rlinf_user.runtime.rollout.observe import Observer
from rlinf_user.runtime.rollout.step import Step, StepHook
from rlinf_user.runtime.rollout.writer import TransitionWriter
from rlinf_user.seeds import EVAL_WORKER_ID

log = logging.getLogger(__name__)

__all__ = ["EnvWorker", "RolloutLost", "rollout_enabled"]


def rollout_enabled(cfg) -> bool:
    ro = cfg.placement.get("rollout")
    return bool(ro is not None and ro.get("enabled", False))


class EnvWorker:
    """Steps one member's envs (see :mod:`rlinf_user.runtime.rollout.fleet`). Its observations and
    actions are adapted to the learner's spec (``fleet_spec``); without one given, the
    worker serves its own env's spec, or waits for :meth:`attach` when it is a fleet
    member whose learner spec is not known yet."""

    def __init__(
        self, cfg, *, worker_id: int, weight_store=None, sink=None, seed: int = 0, num_envs: int | None = None,
        member=None, fleet_spec: EnvSpec | None = None, rollout=None, reward_name: str | None = None,
        driver_build: str | None = None,
    ):  # fmt: skip
        """``driver_build``: the run's driver's :func:`~rlinf_user.identity.project_identity`;
        a node that runs another build refuses to start, naming both."""
        from rlinf_user.algorithms.base import ON_POLICY, data_plan
        from rlinf_user.identity import check_same_build

        check_same_build(driver_build)

        torch.set_num_threads(max(1, int(cfg.placement.torch_threads)))
        torch.manual_seed(int(seed))  # the policy's sampling is reproducible per worker seed
        self.cfg, self.worker_id, self.seed = cfg, worker_id, int(seed)
        self.member_name = member.name if member is not None else "env"
        self.member_index = member.index if member is not None else 0
        env_cfg = member.env if member is not None else cfg.env
        n = int(num_envs or (member.envs_per_worker if member is not None else cfg.placement.envs_per_worker))
        iv = cfg.get("intervention")
        supervised = bool(iv is not None and iv.enabled and worker_id == 0)
        if supervised:
            n = 1  # a person supervises one env
        self.envs = make_vector_env(env_cfg, n, seed)
        self.env_cfg, self._eval_envs = env_cfg, []  # evaluation's extra envs, built when first needed
        self.own_spec = EnvSpec.of_env(self.envs)
        self.spec: EnvSpec | None = None
        plan = data_plan(cfg.algo)
        self.on_policy = plan.data_mode == ON_POLICY
        self.actor = Actor(cfg, self.envs, on_policy=self.on_policy, served=rollout_enabled(cfg), rollout=rollout,
                           weight_store=weight_store, seed=seed)  # fmt: skip
        settings = frame_feature_settings(cfg)
        featurizer = None
        if settings is not None:  # policy.frame_features: the frozen encoder runs here, on the frames
            from rlinf_user.policies.frame_features import FrameFeaturizer

            featurizer = FrameFeaturizer(settings)
        self.observer = Observer(featurizer)
        self.hooks: list[StepHook] = []  # in order: a reward that ends episodes before those who see the ends
        if reward_name is not None:
            from rlinf_user.runtime.serving.reward_server import RewardClient

            rw = cfg.get("reward")
            self.hooks.append(LearnedReward(RewardClient(reward_name), self.envs, bool(rw is not None and rw.get("ends_episode", False))))
        self.supervision = None
        if supervised:
            from rlinf_user.teleop.supervisor import Supervisor

            sup = Supervisor.from_config(cfg, (getattr(self.envs, "envs", None) or [None])[0])
            self.supervision = Supervision(sup, self.actor)
            self.hooks.append(self.supervision)
        self.groups = None
        if self.on_policy and plan.group_size and worker_id != EVAL_WORKER_ID:  # evaluation draws its own seeds
            self.groups = GroupHolds(plan.group_size, self.envs, self.seed, worker_id, self.actor.chunks.drop)
            self.hooks.append(self.groups)
        self.writer = TransitionWriter(self.envs.num_envs, worker_id, sink, on_policy=self.on_policy,
                                       per_action_credit=self.on_policy and plan.per_action_credit,
                                       chunk_steps=int(cfg.buffer.chunk_steps),
                                       replay_extras=() if self.on_policy else tuple(plan.extras),
                                       chunk_rows=not self.on_policy and plan.chunk_rows)  # fmt: skip
        self.book = EpisodeBook(self.envs.num_envs, self.member_name)
        self.env_steps = 0
        # the envs are reset when first observed (the first rollout): a robot is taken (hello,
        # homing) when the worker is about to act, not while its policy is built and loaded
        # (a controller silent for the edge's peer timeout loses the robot)
        self._obs, self._first_reset = None, ({"seeds": self.groups.seeds()} if self.groups else {"seed": seed})
        if fleet_spec is not None or member is None:
            self.attach(fleet_spec or self.own_spec)

    @property
    def obs(self):
        """The envs' current observation (the first read resets them)."""
        if self._obs is None:
            self._obs = self.envs.reset(**self._first_reset)
        return self._obs

    @obs.setter
    def obs(self, value) -> None:
        self._obs = value

    @property
    def version(self) -> int:
        return self.actor.version

    @property
    def policy(self):
        return self.actor.policy

    def attach(self, fleet_spec: EnvSpec, sink=None) -> dict[str, Any]:
        """Build the policy for the learner's spec (unless a rollout server acts for this
        worker: then only for evaluation, when first needed) and the adapter to it; raises
        ``ValueError`` naming what does not fit."""
        from rlinf_user.runtime.rollout.fleet import Adapter

        fleet_spec = fleet_spec if isinstance(fleet_spec, EnvSpec) else EnvSpec.from_dict(fleet_spec)
        adapter = Adapter(self.own_spec, fleet_spec, self.member_index)
        self.spec = fleet_spec
        self.observer.adapter = adapter
        self.actor.attach(fleet_spec, adapter)
        if sink is not None:
            self.writer.out.set_sink(sink)
        return self.identity()

    def set_rollout(self, server) -> None:
        """The rollout server that acts for this worker (a new one after a crash)."""
        self.actor.set_rollout(server)

    def identity(self) -> dict[str, Any]:
        """Which member this is and where it runs."""
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"member": self.member_name, "worker": self.worker_id, "node": node}

    def pid(self) -> int:
        import os

        return os.getpid()

    def get_spec(self) -> EnvSpec:
        """This worker's own env spec (the learner's is the fleet's union of these)."""
        return self.own_spec

    def rollout(self, num_steps: int, random: bool = False, min_version: int | None = None) -> dict[str, Any]:
        """Step every env ``num_steps`` times; return finished-episode statistics.

        ``min_version`` (synchronous on-policy learning): wait for that policy version
        first, and return only once every transition has reached the learner."""
        if self.spec is None:
            raise RuntimeError("this fleet worker was not attached to the learner's spec yet")
        actor, writer = self.actor, self.writer
        actor.min_version = min_version
        if actor.weights is not None and (actor.weights.version < 0 or min_version is not None):
            actor.weights.wait_for(max(0, min_version or 0))
        if min_version is not None:
            actor.chunks.clear()  # actions of an older policy are not executed
        episodes: list[dict[str, Any]] = []
        rows0, steps, lost, t0 = writer.rows_sent, 0, False, time.perf_counter()
        for _ in range(num_steps):
            if actor.weights is not None and min_version is None:
                actor.weights.poll()
            obs = self.observer.current(self.obs)
            try:
                actions, extras = actor.act(obs, random)
            except RolloutLost:
                lost = True
                break
            step = Step(obs, actions, extras, actor.version, random, np.zeros(self.envs.num_envs, dtype=bool))
            if self.supervision is not None:
                self.supervision.raw_obs = self.obs
            for hook in self.hooks:
                hook.before(step)
            actor.plan(step.intervention)
            hold = {} if step.active is None else {"active": step.active}
            out = self.envs.step(self.observer.adapter.env_action(step.actions), reset_seeds=step.reset_seeds, **hold)
            step.next_obs, step.reward, step.terminated, step.truncated, step.infos = out
            for hook in self.hooks:
                hook.after(step)
            actor.applied(step.actions, step.infos)  # a streamed chunk: what the robot really ran
            stored_next = self.observer.reached(step.next_obs, step.done, step.infos)
            # a chunk's decision ends where the next step starts a new chunk: used up, or (a
            # chunk streamed to the edge) its successor asked for while the robot runs the rest
            writer.write(step, stored_next, actor.chunks.due(actor.lookahead), actor.chunk_width)
            episodes += self.book.step(step, self.hooks)
            actor.end_episodes(step.done)
            self.obs = step.next_obs
            steps += int(step.live.sum())
        self.env_steps += steps
        if min_version is not None:
            writer.end_round()  # the round ends: its chunks end with it
            actor.chunks.clear()
        writer.flush()
        if min_version is not None:
            writer.drain()
        return {
            "worker": self.worker_id, "member": self.member_name, "node": self.identity()["node"], "steps": steps,
            "rows": writer.rows_sent - rows0, "seconds": time.perf_counter() - t0, "episodes": episodes,
            "policy_version": self.version, "rollout_lost": lost,
            "supervisor_lost": None if self.supervision is None else self.supervision.lost,
        }  # fmt: skip

    def evaluate(
        self, num_episodes: int, record_video: bool = False, weights_above: float | None = None, sync: bool = True,
        split: str = "validation", policy_state: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Deterministic-policy episodes (on this worker's own envs) from the held-out
        ``split``'s seeds, with the latest weights (``sync=False``: with the weights it
        holds; ``policy_state``: with those weights, in a copy of the policy). With
        ``weights_above``: a success rate at or above it (and above 0) returns the evaluated weights too
        (``policy_state``), so the run can keep exactly the policy that scored it."""
        import copy

        from rlinf_user.evaluation import EVAL_ACCOUNTING, evaluate_policy, is_new_best

        policy = self.actor.local_policy()
        weights = self.actor.weights
        if policy_state is not None:
            policy = copy.deepcopy(policy)
            policy.load_state_dict(policy_state)
        elif weights is not None and sync:
            weights.sync()
        if not hasattr(self.envs, "envs"):
            raise RuntimeError("evaluation needs a worker built with num_envs=1")
        adapter = self.observer.adapter
        result = evaluate_policy(self._evaluation_envs(num_episodes), policy, num_episodes, 3 if record_video else 0,
                                 adapter=adapter, split=split)  # fmt: skip
        self.obs = self.envs.reset() if self._obs is not None else None  # not yet reset: its first reset waits
        self.observer.restart()
        self.actor.chunks.clear()
        self.writer.cut_episodes()  # a chunk's row open when the evaluation began ends there
        self.book.restart()  # the training episode in progress was cut short
        for hook in self.hooks:
            hook.restart()
        out = {
            **{k: result[k] for k in EVAL_ACCOUNTING},
            "mean_return": result["mean_return"],
            "policy_version": weights.version if weights is not None else -1,
            "frames": result["frames"],
        }
        if weights_above is not None and is_new_best(out["success_rate"], weights_above):  # the run record's own rule
            out["policy_state"] = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
        return out

    def _evaluation_envs(self, episodes: int) -> list:
        """This worker's first env, and ``eval_envs - 1`` more of its kind beside it."""
        from rlinf_user.env.registry import make_env
        from rlinf_user.evaluation import eval_env_count

        # a fleet member's own env decides: a robot member evaluates on its one arm
        want = eval_env_count(self.env_cfg, self.cfg.get("eval_envs", 1), episodes)
        while 1 + len(self._eval_envs) < want:
            self._eval_envs.append(make_env(self.env_cfg, seed=self.seed + 1 + len(self._eval_envs)))
        return [self.envs.envs[0], *self._eval_envs[: want - 1]]

    def set_sink(self, sink) -> None:
        """Where transition chunks go: set after construction for workers that exist before
        the learner, and again when a learner was restarted (unsent chunks follow)."""
        self.writer.out.set_sink(sink)

    def sync_weights(self) -> int:
        """Apply the newest published weights now; their version."""
        self.actor.local_policy()
        if self.actor.weights is None:
            return -1
        self.actor.weights.sync()
        return self.actor.weights.version

    def close(self) -> None:
        self.writer.close()
        for hook in self.hooks:
            hook.close()
        self.actor.close()
        self.envs.close()
        for env in self._eval_envs:
            env.close()
