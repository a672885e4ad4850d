"""Env worker: steps a batch of contract envs with the latest published policy.

Weights are polled without blocking between steps (a synchronous on-policy round waits
for its version first); chunks of transitions (:class:`rlinf_user.env.spec.Col`) go to
the sink through a :class:`ChunkSender` (numbered, windowed, resent after a sink dies), each row stamped with the
acting policy version, env id, step number and intervention flag, plus the policy's
log-prob/value/sample for on-policy algorithms. Action chunks run step by step; for
on-policy algorithms the steps one chunk ran are one row (:class:`DecisionRows`).
With ``placement.rollout.enabled`` the rollout server acts; a server that dies ends the
call early with ``rollout_lost`` (steps kept, episodes go on) until a new one is handed over.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import numpy as np
import torch

from rlinf_user.env.registry import make_vector_env
from rlinf_user.env.spec import Col, EnvSpec, flat_obs, index_obs, instruction_array, obs_to_torch
from rlinf_user.policies.frame_features import frame_feature_settings
from rlinf_user.runtime.chunk_sender import ChunkSender
from rlinf_user.runtime.chunks import ChunkQueue, DecisionRows
from rlinf_user.seeds import EVAL_WORKER_ID, group_id, group_seed

log = logging.getLogger(__name__)

ON_POLICY_EXTRAS = (Col.LOG_PROB, Col.VALUE, Col.SAMPLE)


class RolloutLost(RuntimeError):
    """The rollout server died; the run starts a new one and hands it over."""


def rollout_enabled(cfg) -> bool:
    ro = cfg.placement.get("rollout")
    return bool(ro is not None and ro.get("enabled", False))


class EnvWorker:
    """Steps one member's envs (see :mod:`rlinf_user.runtime.fleet`). Its observations and
    actions are adapted to the learner's spec (``fleet_spec``); without one given, the
    worker serves its own env's spec, or waits for :meth:`attach` when it is a fleet
    member whose learner spec is not known yet."""

    def __init__(
        self,
        cfg,
        *,
        worker_id: int,
        weight_store=None,
        sink=None,
        seed: int = 0,
        num_envs: int | None = None,
        member=None,
        fleet_spec: EnvSpec | None = None,
        rollout=None,
        reward_name: str | None = None,
    ):
        torch.set_num_threads(max(1, int(cfg.placement.torch_threads)))
        torch.manual_seed(int(seed))  # the policy's sampling is reproducible per worker seed
        self.cfg = cfg
        self.worker_id = worker_id
        self.seed = int(seed)
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
        self.own_spec = EnvSpec.of_env(self.envs)
        self.spec: EnvSpec | None = None
        self.policy = None
        self.weights = None
        self.served = rollout_enabled(cfg)  # training actions come from the rollout server
        self.rollout_server = rollout
        self.rollout_dead = False
        self.version = -1  # the policy version of the latest actions
        self.min_version: int | None = None  # a synchronous round's policy version
        from rlinf_user.algorithms.base import ON_POLICY, data_plan

        plan = data_plan(cfg.algo)
        self.on_policy = plan.data_mode == ON_POLICY
        # grouped credit (GRPO): a training worker's envs in groups of group_size; the k-th
        # episode of every env in a group resets from the same seed (evaluation draws its own)
        grouped = self.on_policy and worker_id != EVAL_WORKER_ID
        self.group_size = plan.group_size if grouped else 0
        if self.group_size and n % self.group_size:
            raise ValueError(f"algo.group_size={self.group_size} does not divide this worker's {n} envs")
        # ... and a group's envs run their episodes in lock-step: an env whose episode ended
        # is held (not stepped) until the rest of its group ended theirs too, so a group's
        # episodes come from one policy version and none waits on a slower sibling
        self.held = np.zeros(n, dtype=bool) if self.group_size and getattr(self.envs, "can_hold", False) else None
        self.reward = None  # the reward role's client: a learned success classifier
        if reward_name is not None:
            from rlinf_user.runtime.reward_server import RewardClient

            self.reward = RewardClient(reward_name)
        rw = cfg.get("reward")
        self.reward_ends_episode = bool(rw is not None and rw.get("ends_episode", False))
        self.adapter = None
        self.rng = np.random.default_rng(seed)
        num = self.envs.num_envs
        self.episode_index = np.zeros(num, dtype=np.int64)  # episodes begun per env
        self.env_step = np.zeros(num, dtype=np.int64)  # per-env step sequence number
        self.obs = self.envs.reset(seeds=self._group_seeds()) if self.group_size else self.envs.reset(seed=seed)
        self.featurizer = None  # policy.frame_features: the frozen encoder runs here, on the frames
        settings = frame_feature_settings(cfg)
        if settings is not None:
            from rlinf_user.policies.frame_features import FrameFeaturizer

            self.featurizer = FrameFeaturizer(settings)
        self.obs_features: dict[str, Any] | None = None  # self.obs with its maps in place of frames
        self.chunks = ChunkQueue(num)
        self.planners: list = [None] * num  # robot envs that run whole chunks (see attach)
        self.to_plan: dict[int, np.ndarray] = {}  # new chunks for them, sent once this step's actor is known
        self.lookahead = 0  # steps left in a chunk when the next one is asked for
        self.decisions = DecisionRows(num, plan.per_action_credit) if self.on_policy else None  # on-policy: a row per chunk
        self.pending: list[dict[str, np.ndarray]] = []  # one entry of columns per step
        self.pending_rows = 0
        self.rows_sent = 0  # rows produced (on-policy: one per decision, a chunk's steps in one)
        self.out = ChunkSender(f"worker{worker_id}", sink)  # numbered chunks to the sink
        self.env_steps = 0
        self.episode_return = np.zeros(num)
        self.episode_len = np.zeros(num, dtype=np.int64)
        self.episode_interventions = np.zeros(num, dtype=np.int64)
        self.episode_classified = np.zeros(num, dtype=bool)
        self.supervisor = None
        if supervised:
            from rlinf_user.teleop.supervisor import Supervisor

            self.supervisor = Supervisor.from_config(cfg, (getattr(self.envs, "envs", None) or [None])[0])
            self.supervisor.begin_episode()
        if fleet_spec is not None or member is None:
            self.attach(fleet_spec or self.own_spec)

    def _group_seeds(self, envs=None) -> list[int]:
        """The reset seed of each env's current episode (GRPO groups)."""
        idx = range(self.envs.num_envs) if envs is None else envs
        return [group_seed(self.seed, self.worker_id, i // self.group_size, int(self.episode_index[i])) for i in idx]

    def attach(self, fleet_spec: EnvSpec, sink=None) -> dict[str, Any]:
        """Build the policy for the learner's spec (unless a rollout server acts for this
        worker: then only for evaluation, when first needed) and the adapter to it; raises
        ``ValueError`` naming what does not fit."""
        from rlinf_user.runtime.fleet import Adapter

        fleet_spec = fleet_spec if isinstance(fleet_spec, EnvSpec) else EnvSpec.from_dict(fleet_spec)
        self.adapter = Adapter(self.own_spec, fleet_spec, self.member_index)
        self.spec = fleet_spec
        self.planners = self._stream_planners()
        self.lookahead = max([p.plan_lookahead for p in self.planners if p is not None], default=0)
        if not self.served:
            self._local_policy()
        if sink is not None:
            self.out.set_sink(sink)
        return self.identity()

    def _local_policy(self):
        """This worker's own copy of the policy, subscribed to the published weights."""
        if self.policy is None:
            from rlinf_user.netem import LinkSpec
            from rlinf_user.policies.base import build_policy
            from rlinf_user.runtime.weights import WeightSubscriber

            self.policy = build_policy(self.cfg.policy, self.spec)
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

    def pid(self) -> int:
        import os

        return os.getpid()

    def get_spec(self) -> EnvSpec:
        """This worker's own env spec (the learner's is the fleet's union of these)."""
        return self.own_spec

    # -- acting -------------------------------------------------------------------------------
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
        if self.decisions is not None:
            self.decisions.width = self.chunks.actions.shape[1]
        for j, i in enumerate(rows):  # robots behind the edge run the whole chunk themselves
            if self.planners[i] is not None and self.chunks.length[i] > 1:
                chunk = np.asarray(actions[j], np.float32).reshape(-1, np.shape(actions)[-1])
                self.to_plan[i] = self.adapter.env_action(self.spec.expand_action(chunk))

    def _plan(self, taken_over: np.ndarray) -> None:
        """Hand the new chunks to their robots, after the person's decision: a chunk never
        reaches the edge for an env the person is driving this step."""
        for i, chunk in list(self.to_plan.items()):
            if not taken_over[i]:
                self.planners[i].plan(chunk)
        self.to_plan.clear()

    def _act(self, obs: dict[str, Any], random: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """This step's contract actions for every env and the on-policy extras; sets
        ``self.version`` (the version that made them)."""
        if random:
            self._unplan(range(self.envs.num_envs))
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

    def _unplan(self, rows) -> None:
        """These envs' robots take single actions again (random steps, a person's)."""
        for i in rows:
            if self.planners[i] is not None and self.planners[i].streaming:
                self.planners[i].unplan()
                self.chunks.drop([i])

    def _stream_planners(self) -> list:
        """Per env: the robot env that runs whole chunks at the edge, or None. Only for
        off-policy learning: an on-policy learner scores the chunk it sampled, while the
        edge blends seams and skips late actions (steps there are single actions)."""
        envs = [getattr(e, "unwrapped", e) for e in getattr(self.envs, "envs", [])]
        ok = not self.on_policy and self.adapter.identity and len(envs) == self.envs.num_envs
        planners = [e if ok and getattr(e, "plan_lookahead", 0) > 0 else None for e in envs]
        return planners or [None] * self.envs.num_envs

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

    def rollout(self, num_steps: int, random: bool = False, min_version: int | None = None) -> dict[str, Any]:
        """Step every env ``num_steps`` times; return finished-episode statistics.

        ``min_version`` (synchronous on-policy learning): wait for that policy version
        first, and return only once every transition has reached the learner."""
        if self.spec is None:
            raise RuntimeError("this fleet worker was not attached to the learner's spec yet")
        self.min_version = min_version
        if self.weights is not None and (self.weights.version < 0 or min_version is not None):
            self.weights.wait_for(max(0, min_version or 0))
        if min_version is not None:
            self.chunks.clear()  # actions of an older policy are not executed
        episodes: list[dict[str, Any]] = []
        rows0 = self.rows_sent
        t0 = time.perf_counter()
        steps = 0
        lost = False
        num = self.envs.num_envs
        env_ids = self.worker_id * 1000 + np.arange(num, dtype=np.int64)
        for _ in range(num_steps):
            if self.weights is not None and min_version is None:
                self.weights.poll()
            obs = self.adapter.obs(self.obs)
            if self.featurizer is not None:
                if self.obs_features is None:
                    self.obs_features = self.featurizer.observation(obs)
                obs = self.obs_features
            try:
                actions, extras = self._act(obs, random)
            except RolloutLost:
                lost = True
                break
            flags = np.zeros(num, dtype=bool)
            if self.supervisor is not None:
                d = self.supervisor.decide(index_obs(self.obs, 0), self.adapter.env_action(actions[0]))
                if d is not None:
                    actions[0], flags[0] = d.action, d.intervention
                    if d.intervention:
                        self._unplan([0])  # the person's action replaces the robot's schedule
            self._plan(flags)
            groups = None
            reset_seeds = None
            if self.group_size:
                groups = np.array(
                    [group_id(self.worker_id, i // self.group_size, int(self.episode_index[i])) for i in range(num)]
                )
                self.episode_index += 1  # the seeds an env resets with if its episode ends now
                reset_seeds = self._group_seeds()
                self.episode_index -= 1
            held = None if self.held is None else self.held.copy()
            hold = {} if held is None else {"active": ~held}
            next_obs, rewards, terms, truncs, infos = self.envs.step(
                self.adapter.env_action(actions), reset_seeds=reset_seeds, **hold
            )
            if self.reward is not None:  # the learned reward replaces the env's
                rewards, classified = self.reward.score(self._own_next(next_obs, terms, truncs, infos))
                self.episode_classified |= classified
                if self.reward_ends_episode:
                    terms, truncs = self._end_classified(classified, next_obs, terms, truncs, infos)
            for i, info in enumerate(infos):  # a streamed chunk: what the robot really ran
                if "applied_action" in info:
                    actions[i] = info["applied_action"]
            done = np.asarray(terms, bool) | np.asarray(truncs, bool)
            fleet_next = self.adapter.obs(next_obs)
            stored_next = self._with_final_obs(fleet_next, done, infos)
            if self.featurizer is not None:
                stored_next, self.obs_features = self._featurize_step(fleet_next, stored_next, done)
            cols = {**flat_obs(Col.OBS, obs), **flat_obs(Col.NEXT_OBS, stored_next)}
            cols.update({
                Col.ACTION: actions, Col.REWARD: np.asarray(rewards, np.float32),
                Col.TERMINATED: np.asarray(terms, np.float32), Col.TRUNCATED: np.asarray(truncs, np.float32),
                Col.POLICY_VERSION: np.full(num, self.version, np.int64), Col.INTERVENTION: flags,
                Col.ENV_ID: env_ids, Col.STEP: self.env_step.copy(),
            })  # fmt: skip
            if self.on_policy:
                cols.update({k: v for k, v in extras.items() if k in ON_POLICY_EXTRAS})
                if groups is not None:
                    cols[Col.GROUP] = groups
            live = np.ones(num, dtype=bool) if held is None else ~held  # held envs made no step
            if self.decisions is not None:
                closes = live & (done | (True if random else self.chunks.used_up()))
                self._pend(self.decisions.add(cols, live, closes))
            else:
                self._pend(cols if live.all() else {k: v[live] for k, v in cols.items()})
            self.env_step += live
            self.episode_return += rewards
            self.episode_len += live
            self.episode_interventions += flags
            for i in np.flatnonzero(done):
                episodes.append(self._episode_done(int(i), infos[i]))
            if done.any():
                self.chunks.drop(np.flatnonzero(done))  # a chunk never crosses into the next episode
                self.episode_index[done] += 1
            if self.held is not None:
                self._hold_groups(done)
            self.obs = next_obs
            steps += int(live.sum())
            self.env_steps += int(live.sum())
            if self.pending_rows >= self.cfg.buffer.chunk_steps:
                self._flush()
        if min_version is not None and self.decisions is not None:
            self._pend(self.decisions.close_all())  # the round ends: its chunks end with it
            self.chunks.clear()
        self._flush()
        if min_version is not None:
            self.out.drain()
        return {
            "worker": self.worker_id,
            "member": self.member_name,
            "node": self.identity()["node"],
            "steps": steps,
            "rows": self.rows_sent - rows0,
            "seconds": time.perf_counter() - t0,
            "episodes": episodes,
            "policy_version": self.version,
            "supervisor_lost": None if self.supervisor is None else self.supervisor.lost,
            "rollout_lost": lost,
        }

    def _featurize_step(self, fleet_next, stored_next, done) -> tuple[dict[str, Any], dict[str, Any]]:
        """The maps of the observations this step reached (stored) and of those the next
        step starts from: the same frames except where an episode ended, so each frame
        goes through the backbone once."""
        f = self.featurizer
        stored = f.observation(stored_next)
        rows = np.flatnonzero(done)
        nxt = {k: v for k, v in fleet_next.items() if k != Col.IMAGES}
        nxt[Col.IMAGES] = {}
        nxt[Col.FEATURES] = {k: v.copy() if len(rows) else v for k, v in stored[Col.FEATURES].items()}
        for k, frames in fleet_next[Col.IMAGES].items():
            if len(rows):
                nxt[Col.FEATURES][k][rows] = f.maps(frames[rows])
        return stored, nxt

    def _pend(self, cols: dict[str, np.ndarray] | None) -> None:
        if cols:
            self.pending.append(cols)
            self.pending_rows += len(cols[Col.REWARD])
            self.rows_sent += len(cols[Col.REWARD])

    def _hold_groups(self, done: np.ndarray) -> None:
        """Hold the envs whose episode just ended; release a group once all of it is held
        (its envs then start their next episodes together, from the group's next seed)."""
        self.held |= done
        ended = np.repeat(self.held.reshape(-1, self.group_size).all(axis=1), self.group_size)
        if ended.any():
            self.held[ended] = False
            self.chunks.drop(np.flatnonzero(ended))

    def _with_final_obs(self, fleet_next: dict[str, Any], done: np.ndarray, infos) -> dict[str, Any]:
        """The observations each step reached: where an episode ended, its final one (the
        batch holds the next episode's first)."""
        if not done.any():
            return fleet_next
        out = {
            Col.STATE: fleet_next[Col.STATE].copy(),
            Col.IMAGES: {k: v.copy() for k, v in fleet_next[Col.IMAGES].items()},
        }
        texts = list(fleet_next[Col.INSTRUCTION]) if Col.INSTRUCTION in fleet_next else None
        for i in np.flatnonzero(done):
            final = infos[i]["final_obs"]
            one = {Col.STATE: final[Col.STATE][None], Col.IMAGES: {k: v[None] for k, v in final[Col.IMAGES].items()}}
            if Col.INSTRUCTION in final:
                one[Col.INSTRUCTION] = np.asarray([final[Col.INSTRUCTION]])
            one = self.adapter.obs(one)
            out[Col.STATE][i] = one[Col.STATE][0]
            for k in out[Col.IMAGES]:
                out[Col.IMAGES][k][i] = one[Col.IMAGES][k][0]
            if texts is not None and Col.INSTRUCTION in one:
                texts[i] = one[Col.INSTRUCTION][0]
        if texts is not None:
            out[Col.INSTRUCTION] = instruction_array(texts)
        return out

    def _episode_done(self, i: int, info: dict[str, Any]) -> dict[str, Any]:
        ep = {
            "member": self.member_name,
            "return": float(self.episode_return[i]),
            "length": int(self.episode_len[i]),
            "success": bool(info.get("success", False)),
            "policy_version": self.version,
            "intervention_steps": int(self.episode_interventions[i]),
            **({"classified_success": bool(self.episode_classified[i])} if self.reward else {}),
        }
        self.episode_classified[i] = False
        self.episode_return[i] = 0.0
        self.episode_len[i] = 0
        self.episode_interventions[i] = 0
        if i == 0 and self.supervisor is not None:
            self.supervisor.begin_episode()
        return ep

    def _end_classified(self, classified, next_obs, terms, truncs, infos) -> tuple[np.ndarray, np.ndarray]:
        """With ``reward.ends_episode``, a step the classifier calls a success ends its
        episode (HIL-SERL's rule). The env is reset in place: ``next_obs`` gets the new
        episode's first observation, ``infos`` the final one, and the step counts as
        terminated. A success on the step the time limit cut is terminated too (nothing
        follows a success to bootstrap from); that episode has ended already."""
        classified = np.asarray(classified, dtype=bool)
        terms, truncs = np.array(terms, dtype=bool), np.array(truncs, dtype=bool)
        cut = classified & truncs & ~terms
        terms[cut], truncs[cut] = True, False
        for i in np.flatnonzero(classified & ~terms & ~truncs):
            final = copy.deepcopy(index_obs(next_obs, int(i)))  # its rows are overwritten below
            first = self.envs.end_episode(int(i))
            next_obs[Col.STATE][i] = first[Col.STATE]
            for part in ("images", "timestamps"):
                for k in next_obs[part]:
                    next_obs[part][k][i] = first[part][k]
            if Col.INSTRUCTION in next_obs:  # rebuilt: the new text may be longer than the array's width
                texts = list(next_obs[Col.INSTRUCTION])
                texts[i] = first[Col.INSTRUCTION]
                next_obs[Col.INSTRUCTION] = instruction_array(texts)
            infos[i] = {**infos[i], "final_obs": final, "ended_by": "reward_classifier"}
            terms[i] = True
        return terms, truncs

    def _own_next(self, next_obs, terms, truncs, infos) -> dict[str, Any]:
        """Each env's observation after the step (the final one where an episode ended), in
        this env's own layout: what a reward classifier trained on its recordings sees."""
        rows = [
            infos[i]["final_obs"] if (terms[i] or truncs[i]) else index_obs(next_obs, i)
            for i in range(self.envs.num_envs)
        ]
        return {
            Col.STATE: np.stack([r["state"] for r in rows]).astype(np.float32),
            Col.IMAGES: {k: np.stack([r["images"][k] for r in rows]) for k in rows[0][Col.IMAGES]},
        }

    def _flush(self) -> None:
        """Send the batched transitions. Chunks stay here until the sink has taken them:
        one whose send failed (the learner died) is sent again to the next sink, so a
        learner crash loses nothing a worker produced (at-least-once: a chunk the dead
        learner had already logged may arrive twice)."""
        if self.pending:
            keys = self.pending[0].keys()
            self.out.put({k: np.concatenate([np.asarray(p[k]) for p in self.pending]) for k in keys})
            self.pending, self.pending_rows = [], 0
        else:
            self.out.send()

    def set_sink(self, sink) -> None:
        """Where transition chunks go: set after construction for workers that exist before
        the learner, and again when a learner was restarted (unsent chunks follow)."""
        self.out.set_sink(sink)

    def sync_weights(self) -> int:
        """Apply the newest published weights now; their version."""
        self._local_policy()
        if self.weights is None:
            return -1
        self.weights.sync()
        return self.weights.version

    def evaluate(
        self, num_episodes: int, record_video: bool = False, weights_above: float | None = None, sync: bool = True,
        split: str = "validation", policy_state: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Deterministic-policy episodes (on this worker's own envs) from the held-out
        ``split``'s seeds, with the latest weights (``sync=False``: with the weights it
        holds; ``policy_state``: with those weights, in a copy of the policy). With
        ``weights_above``: a success rate above it returns the evaluated weights too
        (``policy_state``), so the run can keep exactly the policy that scored it."""
        from rlinf_user.evaluation import EVAL_ACCOUNTING, evaluate_policy

        policy = self._local_policy()
        if policy_state is not None:
            policy = copy.deepcopy(policy)
            policy.load_state_dict(policy_state)
        elif self.weights is not None and sync:
            self.weights.sync()
        if not hasattr(self.envs, "envs"):
            raise RuntimeError("evaluation needs a worker built with num_envs=1")
        result = evaluate_policy(
            self.envs.envs[0], policy, num_episodes, 3 if record_video else 0, adapter=self.adapter, split=split
        )
        self.obs = self.envs.reset()
        self.obs_features = None
        self.chunks.clear()
        # the training episode in progress was cut short: its statistics start over
        self.episode_return[:], self.episode_len[:], self.episode_interventions[:] = 0, 0, 0
        self.episode_classified[:] = False
        if self.supervisor is not None:
            self.supervisor.begin_episode()
        out = {
            **{k: result[k] for k in EVAL_ACCOUNTING},
            "mean_return": result["mean_return"],
            "policy_version": self.weights.version if self.weights is not None else -1,
            "frames": result["frames"],
        }
        if weights_above is not None and out["success_rate"] > weights_above:
            out["policy_state"] = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
        return out

    def close(self) -> None:
        self.out.close()
        if self.supervisor is not None:
            self.supervisor.close()
        if self.weights is not None:
            self.weights.close()
        self.envs.close()
