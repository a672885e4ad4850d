"""Act stage: this step's action per env from the policy (this worker's copy, subscribed to
the published weights, or the rollout server's), handed out of action chunks step by step
(:mod:`.chunks`); robots behind the edge that run whole chunks themselves get each new
chunk once the step's actor (the policy or a person) is known."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from rlinf_user.env.spec import EnvSpec, index_obs, obs_to_torch
from rlinf_user.runtime.rollout.chunks import ChunkQueue

log = logging.getLogger(__name__)


class RolloutLost(RuntimeError):
    """The rollout server died; the run starts a new one and hands it over."""


class Actor:
    def __init__(self, cfg, envs, *, on_policy: bool, served: bool, rollout=None, weight_store=None, seed: int = 0):
        self.cfg = cfg
        self.envs = envs
        self.on_policy = on_policy
        self.served = served  # training actions come from the rollout server
        self.rollout_server = rollout
        self.rollout_dead = False
        self.weight_store = weight_store
        self.rng = np.random.default_rng(seed)
        self.spec: EnvSpec | None = None
        self.adapter = None
        self.policy = None
        self.weights = None  # WeightSubscriber of the local policy
        self.version = -1  # the policy version of the latest actions
        self.min_version: int | None = None  # a synchronous round's policy version
        self.chunks = ChunkQueue(envs.num_envs)
        self.planners: list = [None] * envs.num_envs  # robot envs that run whole chunks
        self.to_plan: dict[int, np.ndarray] = {}  # new chunks for them, sent once this step's actor is known
        self.lookahead = 0  # steps left in a chunk when the next one is asked for

    def attach(self, spec: EnvSpec, adapter) -> None:
        self.spec, self.adapter = spec, adapter
        self.planners = self._stream_planners()
        self.lookahead = max([p.plan_lookahead for p in self.planners if p is not None], default=0)
        if not self.served:
            self.local_policy()

    def local_policy(self):
        """This worker's own copy of the policy, subscribed to the published weights."""
        if self.policy is None:
            import torch

            from rlinf_user.netem import LinkSpec
            from rlinf_user.policies.base import build_policy
            from rlinf_user.policies.chunk_graph import refuse_unusable_graphs
            from rlinf_user.runtime.weights.store import WeightSubscriber

            self.policy = build_policy(self.cfg.policy, self.spec)
            self.policy.eval()
            refuse_unusable_graphs(self.policy, torch.device("cpu"))  # an env worker acts on its CPU
            if self.weight_store is not None:
                lag = self.cfg.placement.get("max_policy_lag")
                link = LinkSpec.from_config(self.cfg.placement.get("weight_link"))
                self.weights = WeightSubscriber(
                    self.weight_store, self.policy, max_lag=None if lag is None else int(lag), link=link
                )
        return self.policy

    def set_rollout(self, server) -> None:
        self.rollout_server = server
        self.rollout_dead = False

    @property
    def chunk_width(self) -> int:
        return 1 if self.chunks.actions is None else int(self.chunks.actions.shape[1])

    def act(self, obs: dict[str, Any], random: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """This step's contract actions for every env and the policy's extras; sets
        :attr:`version` (the version that made them)."""
        if random:
            self.unplan(range(self.envs.num_envs))
            a = self.rng.uniform(-1, 1, size=(self.envs.num_envs, self.spec.action_dim)).astype(np.float32)
            if self.weights is not None:
                self.version = self.weights.version
            return self.spec.expand_action(a), {}
        need = self.chunks.due_rows(self.lookahead)
        if len(need):
            self._query(obs, need)
        a, extras, version = self.chunks.pop()
        self.version = version
        return self.spec.expand_action(a), extras

    def _query(self, obs: dict[str, Any], rows: np.ndarray) -> None:
        """New action chunks for env ``rows`` from the policy (local or served)."""
        sub = obs if len(rows) == self.envs.num_envs else index_obs(obs, rows)
        if self.served:
            actions, extras, version = self._served_act(sub)
        else:
            out = self.policy.act(obs_to_torch(sub))
            actions = out.actions.float().numpy()
            extras = {k: v.float().numpy() for k, v in out.extras.items()}
            version = self.weights.version if self.weights is not None else -1
        self.chunks.put(rows, actions, extras, int(version))
        for j, i in enumerate(rows):  # robots behind the edge run the whole chunk themselves
            if self.planners[i] is not None and self.chunks.length[i] > 1:
                chunk = np.asarray(actions[j], np.float32).reshape(-1, np.shape(actions)[-1])
                self.to_plan[i] = self.adapter.env_action(self.spec.expand_action(chunk))

    def _served_act(self, obs: dict[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
        import ray

        if self.rollout_server is None or self.rollout_dead:
            raise RolloutLost("no rollout server")
        try:
            actions, extras, version = ray.get(self.rollout_server.act.remote(obs, False, self.min_version))
        except ray.exceptions.RayActorError as err:
            self.rollout_dead = True
            log.error("the rollout server is gone (%s); waiting for a new one", type(err).__name__)
            raise RolloutLost(str(err)) from err
        return actions, extras, int(version)

    def plan(self, taken_over: np.ndarray) -> None:
        """Hand the new chunks to their robots, after the person's decision: a chunk never
        reaches the edge for an env the person is driving this step."""
        for i, chunk in list(self.to_plan.items()):
            if not taken_over[i]:
                self.planners[i].plan(chunk)
        self.to_plan.clear()

    def unplan(self, rows) -> None:
        """These envs' robots take single actions again (random steps, a person's)."""
        for i in rows:
            if self.planners[i] is not None and self.planners[i].streaming:
                self.planners[i].unplan()
                self.chunks.drop([i])

    def end_episodes(self, done: np.ndarray) -> None:
        """A chunk never crosses into the next episode."""
        if done.any():
            self.chunks.drop(np.flatnonzero(done))

    def applied(self, actions: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Where a robot ran a streamed chunk, the action it really ran replaces ours."""
        for i, info in enumerate(infos):
            if "applied_action" in info:
                actions[i] = info["applied_action"]

    def _stream_planners(self) -> list:
        """Per env: the robot env that runs whole chunks at the edge, or None. Only for
        off-policy learning: an on-policy learner scores the chunk it sampled, while the
        edge blends seams and skips late actions (steps there are single actions)."""
        envs = [getattr(e, "unwrapped", e) for e in getattr(self.envs, "envs", [])]
        ok = not self.on_policy and self.adapter.identity and len(envs) == self.envs.num_envs
        planners = [e if ok and getattr(e, "plan_lookahead", 0) > 0 else None for e in envs]
        return planners or [None] * self.envs.num_envs

    def close(self) -> None:
        if self.weights is not None:
            self.weights.close()
