"""Env worker: steps a batch of contract envs with the latest published policy.

It never waits for the learner: weights are polled without blocking between steps, and
transition chunks are sent to the replay sink with at most ``max_inflight`` sends
outstanding. Every transition records the policy version that produced it and an
intervention flag.

With ``placement.rollout.enabled`` the worker holds no policy for training steps: it asks
the run's rollout server (:mod:`rlinf_user.runtime.rollout_server`) for each step's
actions. A server that dies ends the rollout call early with ``rollout_lost`` (every
step taken so far is kept, the episodes in flight go on) until the run hands over a new one.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from rlinf_user.env.registry import make_vector_env
from rlinf_user.env.vector import index_obs

log = logging.getLogger(__name__)

MAX_BACKLOG_CHUNKS = 500  # unsent chunks kept while no sink takes them (then the oldest go)


class RolloutLost(RuntimeError):
    """The rollout server died; the run starts a new one and hands it over."""


def rollout_enabled(cfg) -> bool:
    ro = cfg.placement.get("rollout")
    return bool(ro is not None and ro.get("enabled", False))


def obs_to_torch(obs: dict[str, Any], device: torch.device | str = "cpu") -> dict[str, Any]:
    return {
        "state": torch.as_tensor(obs["state"], device=device),
        "images": {k: torch.as_tensor(v, device=device) for k, v in obs["images"].items()},
    }


def env_spec(env) -> dict[str, Any]:
    """What the networks are built for. The policy acts only on the env's active action
    dims (``ActionSpec.active``); workers expand its output to the full contract action."""
    space = env.observation_space
    single = env.envs[0] if hasattr(env, "envs") else env
    active = [i for i, a in enumerate(single.action_spec.active) if a]
    return {
        "state_dim": int(space["state"].shape[0]),
        "cameras": {k: tuple(v.shape[:2]) for k, v in space["images"].spaces.items()},
        "action_dim": len(active),
        "active_dims": active,
        "contract_action_dim": int(env.action_space.shape[0]),
    }


def expand_action(policy_action: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """Policy output over the active dims -> the full contract action (zeros elsewhere)."""
    out = np.zeros((*policy_action.shape[:-1], spec["contract_action_dim"]), dtype=np.float32)
    out[..., spec["active_dims"]] = policy_action
    return out


def flatten_obs(prefix: str, obs: dict[str, Any], out: dict[str, list]) -> None:
    out.setdefault(f"{prefix}/state", []).append(obs["state"])
    for k, v in obs["images"].items():
        out.setdefault(f"{prefix}/images/{k}", []).append(v)


class EnvWorker:
    """Steps one member's envs (see :mod:`rlinf_user.runtime.fleet`). Its observations and
    actions are adapted to the learner's spec (``fleet_spec``); without one given, the
    worker serves its own env's spec, or waits for :meth:`attach` when it is a fleet
    member whose learner spec is not known yet."""

    def __init__(
        self,
        cfg,
        worker_id: int,
        weight_store=None,
        sink=None,
        seed: int = 0,
        num_envs: int | None = None,
        member=None,
        fleet_spec: dict[str, Any] | None = None,
        rollout=None,
        reward_name: str | None = None,
    ):
        torch.set_num_threads(max(1, int(cfg.placement.torch_threads)))
        self.cfg = cfg
        self.worker_id = worker_id
        self.sink = sink
        self.weight_store = weight_store
        self.member_name = member.name if member is not None else "env"
        self.member_index = member.index if member is not None else 0
        env_cfg = member.env if member is not None else cfg.env
        n = int(num_envs or (member.envs_per_worker if member is not None else cfg.placement.envs_per_worker))
        iv = cfg.get("intervention")
        supervised = bool(iv is not None and iv.enabled and worker_id == 0)
        if supervised:
            n = 1  # a person supervises one env
        self.envs = make_vector_env(env_cfg, n, seed)
        self.own_spec = env_spec(self.envs)
        self.spec: dict[str, Any] | None = None
        self.policy = None
        self.weights = None
        self.served = rollout_enabled(cfg)  # training actions come from the rollout server
        self.rollout_server = rollout
        self.rollout_dead = False
        self.version = -1  # the policy version of the latest actions
        self.reward = None  # the reward role's client: a learned success classifier
        if reward_name is not None:
            from rlinf_user.runtime.reward_server import RewardClient

            self.reward = RewardClient(reward_name)
        rw = cfg.get("reward")
        self.reward_ends_episode = bool(rw is not None and rw.get("ends_episode", False))
        self.adapter = None
        self.rng = np.random.default_rng(seed)
        self.obs = self.envs.reset(seed=seed)
        self.pending: dict[str, list] = {}
        self.inflight: deque = deque()  # (ref, chunk) sent, not yet acknowledged
        self.backlog: deque = deque()  # chunks waiting for a (live) sink
        self.sink_alive = True
        self.dropped_chunks = 0
        self.max_inflight = 4
        self.env_steps = 0
        self.episode_return = np.zeros(self.envs.num_envs)
        self.episode_len = np.zeros(self.envs.num_envs, dtype=np.int64)
        self.episode_interventions = np.zeros(self.envs.num_envs, dtype=np.int64)
        self.episode_classified = np.zeros(self.envs.num_envs, dtype=bool)
        self.supervisor = None
        if supervised:
            from rlinf_user.teleop.supervisor import Supervisor

            self.supervisor = Supervisor.from_config(cfg)
            self.supervisor.begin_episode()
        if fleet_spec is not None or member is None:
            self.attach(fleet_spec or self.own_spec)

    def attach(self, fleet_spec: dict[str, Any], sink=None) -> dict[str, Any]:
        """Build the policy for the learner's spec (unless a rollout server acts for this
        worker: then only for evaluation, when first needed) and the adapter to it; raises
        ``ValueError`` naming what does not fit."""
        from rlinf_user.runtime.fleet import Adapter

        self.adapter = Adapter(self.own_spec, fleet_spec, self.member_index)
        self.spec = fleet_spec
        if not self.served:
            self._local_policy()
        if sink is not None:
            self.sink = sink
        return self.identity()

    def _local_policy(self):
        """This worker's own copy of the policy, subscribed to the published weights."""
        if self.policy is None:
            from rlinf_user.algorithms.sac import build_policy
            from rlinf_user.netem import LinkSpec
            from rlinf_user.runtime.weights import WeightSubscriber

            spec = self.spec
            self.policy = build_policy(self.cfg.policy, spec["state_dim"], spec["cameras"], spec["action_dim"])
            self.policy.eval()
            if self.weight_store is not None:
                lag = self.cfg.placement.get("max_policy_lag")
                link = LinkSpec.from_config(self.cfg.placement.get("weight_link"))
                self.weights = WeightSubscriber(
                    self.weight_store, self.policy, max_lag=None if lag is None else int(lag), link=link
                )
        return self.policy

    def set_rollout(self, server) -> None:
        """The rollout server that acts for this worker (a new one after a crash)."""
        self.rollout_server = server
        self.rollout_dead = False

    def identity(self) -> dict[str, Any]:
        """Which member this is and where it runs."""
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {"member": self.member_name, "worker": self.worker_id, "node": node}

    def _fleet_obs_one(self, obs: dict[str, Any]) -> dict[str, Any]:
        batched = {"state": obs["state"][None], "images": {k: v[None] for k, v in obs["images"].items()}}
        if "timestamps" in obs:
            batched["timestamps"] = {k: np.asarray(v)[None] for k, v in obs["timestamps"].items()}
        return index_obs(self.adapter.obs(batched), 0)

    def pid(self) -> int:
        import os

        return os.getpid()

    def get_spec(self) -> dict[str, Any]:
        """This worker's own env spec (the learner's is the fleet's union of these)."""
        return self.own_spec

    def _act(self, obs: dict[str, Any], random: bool) -> np.ndarray:
        """Actions for every env (the full contract action); sets ``self.version``."""
        if random:
            a = self.rng.uniform(-1, 1, size=(self.envs.num_envs, self.spec["action_dim"]))
            if self.weights is not None:
                self.version = self.weights.version
        elif self.served:
            a = self._served_act(obs)
        else:
            with torch.no_grad():
                a = self.policy.act(obs_to_torch(obs)).numpy()
            self.version = self.weights.version if self.weights is not None else -1
        return expand_action(a.astype(np.float32), self.spec)

    def _served_act(self, obs: dict[str, Any]) -> np.ndarray:
        import ray

        if self.rollout_server is None or self.rollout_dead:
            raise RolloutLost("no rollout server")
        try:
            a, version = ray.get(self.rollout_server.act.remote({"state": obs["state"], "images": obs["images"]}))
        except ray.exceptions.RayActorError as err:
            self.rollout_dead = True
            log.error("the rollout server is gone (%s); waiting for a new one", type(err).__name__)
            raise RolloutLost(str(err)) from err
        self.version = int(version)
        return a

    def rollout(self, num_steps: int, random: bool = False) -> dict[str, Any]:
        """Step every env ``num_steps`` times; return finished-episode statistics."""
        if self.spec is None:
            raise RuntimeError("this fleet worker was not attached to the learner's spec yet")
        if self.weights is not None and self.weights.version < 0:
            self.weights.sync()
        episodes: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        steps = 0
        lost = False
        for _ in range(num_steps):
            if self.weights is not None:
                self.weights.poll()
            obs = self.adapter.obs(self.obs)
            try:
                actions = self._act(obs, random)
            except RolloutLost:
                lost = True
                break
            flags = np.zeros(self.envs.num_envs, dtype=bool)
            if self.supervisor is not None:
                d = self.supervisor.decide(index_obs(self.obs, 0), self.adapter.env_action(actions[0]))
                if d is not None:
                    actions[0], flags[0] = d.action, d.intervention
            next_obs, rewards, terms, truncs, infos = self.envs.step(self.adapter.env_action(actions))
            if self.reward is not None:  # the learned reward replaces the env's
                rewards, classified = self.reward.score(self._own_next(next_obs, terms, truncs, infos))
                self.episode_classified |= classified
                if self.reward_ends_episode:
                    terms = self._end_classified(classified, next_obs, terms, truncs, infos)
            fleet_next = self.adapter.obs(next_obs)
            version = self.version
            for i in range(self.envs.num_envs):
                done = bool(terms[i] or truncs[i])
                real_next = self._fleet_obs_one(infos[i]["final_obs"]) if done else index_obs(fleet_next, i)
                flatten_obs("obs", index_obs(obs, i), self.pending)
                flatten_obs("next_obs", real_next, self.pending)
                for key, val in (
                    ("action", actions[i]),
                    ("reward", np.float32(rewards[i])),
                    ("terminated", np.float32(terms[i])),
                    ("truncated", np.float32(truncs[i])),
                    ("policy_version", np.int64(version)),
                    ("intervention", np.bool_(flags[i])),
                    ("env_id", np.int64(self.worker_id * 1000 + i)),
                ):
                    self.pending.setdefault(key, []).append(val)
                self.episode_return[i] += rewards[i]
                self.episode_len[i] += 1
                self.episode_interventions[i] += int(flags[i])
                if done:
                    episodes.append(
                        {
                            "member": self.member_name,
                            "return": float(self.episode_return[i]),
                            "length": int(self.episode_len[i]),
                            "success": bool(infos[i].get("success", False)),
                            "policy_version": version,
                            "intervention_steps": int(self.episode_interventions[i]),
                            **({"classified_success": bool(self.episode_classified[i])} if self.reward else {}),
                        }
                    )
                    self.episode_classified[i] = False
                    self.episode_return[i] = 0.0
                    self.episode_len[i] = 0
                    self.episode_interventions[i] = 0
                    if i == 0 and self.supervisor is not None:
                        self.supervisor.begin_episode()
            self.obs = next_obs
            steps += 1
            self.env_steps += self.envs.num_envs
            if len(self.pending["reward"]) >= self.cfg.buffer.chunk_steps:
                self._flush()
        self._flush()
        return {
            "worker": self.worker_id,
            "member": self.member_name,
            "node": self.identity()["node"],
            "steps": steps * self.envs.num_envs,
            "seconds": time.perf_counter() - t0,
            "episodes": episodes,
            "policy_version": self.version,
            "supervisor_lost": None if self.supervisor is None else self.supervisor.lost,
            "rollout_lost": lost,
        }

    def _end_classified(self, classified, next_obs, terms, truncs, infos) -> np.ndarray:
        """With ``reward.ends_episode``, a step the classifier calls a success ends its
        episode (HIL-SERL's rule). The env is reset in place: ``next_obs`` gets the new
        episode's first observation, ``infos`` the final one, and the step counts as
        terminated."""
        terms = np.array(terms, dtype=bool)
        for i in np.flatnonzero(np.asarray(classified, dtype=bool) & ~terms & ~np.asarray(truncs, dtype=bool)):
            final = copy.deepcopy(index_obs(next_obs, int(i)))  # its rows are overwritten below
            first = self.envs.end_episode(int(i))
            next_obs["state"][i] = first["state"]
            for part in ("images", "timestamps"):
                for k in next_obs[part]:
                    next_obs[part][k][i] = first[part][k]
            infos[i] = {**infos[i], "final_obs": final, "ended_by": "reward_classifier"}
            terms[i] = True
        return terms

    def _own_next(self, next_obs, terms, truncs, infos) -> dict[str, Any]:
        """Each env's observation after the step (the final one where an episode ended), in
        this env's own layout: what a reward classifier trained on its recordings sees."""
        rows = [
            infos[i]["final_obs"] if (terms[i] or truncs[i]) else index_obs(next_obs, i) for i in range(self.envs.num_envs)
        ]
        return {
            "state": np.stack([r["state"] for r in rows]).astype(np.float32),
            "images": {k: np.stack([r["images"][k] for r in rows]) for k in rows[0]["images"]},
        }

    def _flush(self) -> None:
        """Send the batched transitions. Chunks stay here until the sink has taken them:
        one whose send failed (the learner died) is sent again to the next sink, so a
        learner crash loses nothing a worker produced (at-least-once: a chunk the dead
        learner had already logged may arrive twice)."""
        if self.pending:
            self.backlog.append({k: np.stack(v) for k, v in self.pending.items()})
            self.pending = {}
        self._send()

    def _send(self) -> None:
        import ray

        while self.inflight:  # reap finished sends in order
            ref, chunk = self.inflight[0]
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                break
            self.inflight.popleft()
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                self.backlog.appendleft(chunk)
                self.sink_alive = False
        if not self.sink_alive or self.sink is None:
            while len(self.backlog) > MAX_BACKLOG_CHUNKS:  # bounded memory while nobody takes data
                self.backlog.popleft()
                self.dropped_chunks += 1
                log.error("no sink for %d chunks: dropped the oldest (%d so far)", MAX_BACKLOG_CHUNKS, self.dropped_chunks)
            return
        while self.backlog:
            if len(self.inflight) >= self.max_inflight:  # back-pressure only if the sink is far behind
                ref, chunk = self.inflight.popleft()
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    self.backlog.appendleft(chunk)
                    self.sink_alive = False
                    return
                continue
            chunk = self.backlog.popleft()
            self.inflight.append((self.sink.add.remote(chunk), chunk))

    def set_sink(self, sink) -> None:
        """Where transition chunks go: set after construction for workers that exist before
        the learner, and again when a learner was restarted (unsent chunks follow)."""
        self.sink = sink
        self.sink_alive = True
        self._send()

    def evaluate(
        self, num_episodes: int, record_video: bool = False, weights_above: float | None = None
    ) -> dict[str, Any]:
        """Deterministic-policy episodes (on this worker's own envs) with the latest weights.
        With ``weights_above``: a success rate above it returns the evaluated weights too
        (``policy_state``), so the run can keep exactly the policy that scored it."""
        policy = self._local_policy()
        if self.weights is not None:
            self.weights.sync()
        results, frames = [], []
        if not hasattr(self.envs, "envs"):
            raise RuntimeError("evaluation needs a worker built with num_envs=1")
        env = self.envs.envs[0]
        for ep in range(num_episodes):
            obs, _ = env.reset(seed=10_000 + ep)
            ret, done, info = 0.0, False, {}
            while not done:
                if record_video and ep < 3:
                    frames.append(env.render())
                batch = self.adapter.obs({"state": obs["state"][None], "images": {k: v[None] for k, v in obs["images"].items()}})
                with torch.no_grad():
                    a = policy.act(obs_to_torch(batch), deterministic=True).numpy()[0]
                obs, r, te, tr, info = env.step(self.adapter.env_action(expand_action(a, self.spec)))
                ret += r
                done = te or tr
            results.append({"return": ret, "success": bool(info.get("success", False))})
        self.obs = self.envs.reset()
        # the training episode in progress was cut short: its statistics start over
        self.episode_return[:], self.episode_len[:], self.episode_interventions[:] = 0, 0, 0
        self.episode_classified[:] = False
        if self.supervisor is not None:
            self.supervisor.begin_episode()
        out = {
            "success_rate": float(np.mean([r["success"] for r in results])),
            "mean_return": float(np.mean([r["return"] for r in results])),
            "episodes": len(results),
            "policy_version": self.weights.version if self.weights is not None else -1,
            "frames": [f for f in frames if f is not None] if record_video else [],
        }
        if weights_above is not None and out["success_rate"] > weights_above:
            out["policy_state"] = {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}
        return out

    def close(self) -> None:
        import ray

        if self.inflight:  # let the last sends land before the process goes
            ray.wait([ref for ref, _ in self.inflight], num_returns=len(self.inflight), timeout=10)
        if self.supervisor is not None:
            self.supervisor.close()
        if self.weights is not None:
            self.weights.close()
        self.envs.close()
