"""Step hooks: what acts around ``envs.step`` besides the policy.

* :class:`Supervision`: a person (or the scripted supervisor) watches env 0 and takes over;
* :class:`LearnedReward`: a success classifier's reward replaces the env's, and with
  ``reward.ends_episode`` its success ends the episode (HIL-SERL's rule);
* :class:`GroupHolds`: GRPO's groups of envs reset from one seed per episode and run their
  episodes in lock-step (an env whose episode ended is held until its group's all have).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from rlinf_user.env.spec import Col, index_obs, instruction_array
from rlinf_user.runtime.rollout.step import Step, StepHook
from rlinf_user.seeds import group_id, group_seed


class Supervision(StepHook):
    def __init__(self, supervisor, actor):
        self.supervisor = supervisor
        self.actor = actor
        self.raw_obs: dict[str, Any] | None = None  # env 0's observation in its own layout (set each step)
        supervisor.begin_episode()

    def before(self, step: Step) -> None:
        d = self.supervisor.decide(index_obs(self.raw_obs, 0), self.actor.adapter.env_action(step.actions[0]))
        if d is not None:
            step.actions[0], step.intervention[0] = d.action, d.intervention
            if d.intervention:
                self.actor.unplan([0])  # the person's action replaces the robot's schedule

    def after(self, step: Step) -> None:
        if step.done[0]:
            self.supervisor.begin_episode()

    def restart(self) -> None:
        self.supervisor.begin_episode()

    @property
    def lost(self):
        return self.supervisor.lost

    def close(self) -> None:
        self.supervisor.close()


class LearnedReward(StepHook):
    def __init__(self, client, envs, ends_episode: bool):
        self.client = client  # rlinf_user.runtime.serving.reward_server.RewardClient
        self.envs = envs
        self.ends_episode = ends_episode
        self.classified = np.zeros(envs.num_envs, dtype=bool)  # per env: the classifier called a success

    def after(self, step: Step) -> None:
        reward, classified = self.client.score(self.own_next(step.next_obs, step.terminated, step.truncated, step.infos))
        step.reward = reward
        self.classified |= classified
        if self.ends_episode:
            step.terminated, step.truncated = self.end_classified(
                classified, step.next_obs, step.terminated, step.truncated, step.infos
            )

    def episode_record(self, i: int) -> dict[str, Any]:
        out = {"classified_success": bool(self.classified[i])}
        self.classified[i] = False
        return out

    def restart(self) -> None:
        self.classified[:] = False

    def own_next(self, next_obs, terms, truncs, infos) -> dict[str, Any]:
        """Each env's observation after the step (the final one where an episode ended), in
        this env's own layout: what a reward classifier trained on its recordings sees."""
        rows = [
            infos[i]["final_obs"] if (terms[i] or truncs[i]) else index_obs(next_obs, i)
            for i in range(self.envs.num_envs)
        ]
        return {
            Col.STATE: np.stack([r[Col.STATE] for r in rows]).astype(np.float32),
            Col.IMAGES: {k: np.stack([r[Col.IMAGES][k] for r in rows]) for k in rows[0][Col.IMAGES]},
        }

    def end_classified(self, classified, next_obs, terms, truncs, infos) -> tuple[np.ndarray, np.ndarray]:
        """A step the classifier calls a success ends its episode. The env is reset in
        place: ``next_obs`` gets the new episode's first observation, ``infos`` the final
        one, and the step counts as terminated. A success on the step the time limit cut is
        terminated too (nothing follows a success to bootstrap from); that episode has
        ended already."""
        classified = np.asarray(classified, dtype=bool)
        terms, truncs = np.array(terms, dtype=bool), np.array(truncs, dtype=bool)
        cut = classified & truncs & ~terms
        terms[cut], truncs[cut] = True, False
        for i in np.flatnonzero(classified & ~terms & ~truncs):
            final = copy.deepcopy(index_obs(next_obs, int(i)))  # its rows are overwritten below
            first = self.envs.end_episode(int(i))
            next_obs[Col.STATE][i] = first[Col.STATE]
            for part in (Col.IMAGES, "timestamps"):
                for k in next_obs[part]:
                    next_obs[part][k][i] = first[part][k]
            if Col.INSTRUCTION in next_obs:  # rebuilt: the new text may be longer than the array's width
                texts = list(next_obs[Col.INSTRUCTION])
                texts[i] = first[Col.INSTRUCTION]
                next_obs[Col.INSTRUCTION] = instruction_array(texts)
            infos[i] = {**infos[i], "final_obs": final, "ended_by": "reward_classifier"}
            terms[i] = True
        return terms, truncs


class GroupHolds(StepHook):
    """A training worker's envs in groups of ``group_size``: the k-th episode of every env
    in a group resets from the same seed, and a group's episodes run in lock-step where the
    envs can hold (an env whose episode ended is not stepped until its group's all have),
    so they come from one policy version and none waits on a slower sibling."""

    def __init__(self, group_size: int, envs, seed: int, worker_id: int, release):
        n = envs.num_envs
        if n % group_size:
            raise ValueError(f"algo.group_size={group_size} does not divide this worker's {n} envs")
        self.size, self.seed, self.worker_id = group_size, seed, worker_id
        self.release = release  # called with the envs of a released group (their chunks end)
        self.episode = np.zeros(n, dtype=np.int64)  # episodes begun per env
        self.held = np.zeros(n, dtype=bool) if getattr(envs, "can_hold", False) else None

    def seeds(self) -> list[int]:
        """The reset seed of each env's current episode."""
        return [group_seed(self.seed, self.worker_id, i // self.size, int(self.episode[i])) for i in range(len(self.episode))]

    def before(self, step: Step) -> None:
        n = len(self.episode)
        step.group = np.array([group_id(self.worker_id, i // self.size, int(self.episode[i])) for i in range(n)])
        self.episode += 1  # the seeds an env resets with if its episode ends now
        step.reset_seeds = self.seeds()
        self.episode -= 1
        if self.held is not None:
            step.active = ~self.held

    def after(self, step: Step) -> None:
        done = step.done
        self.episode[done] += 1
        if self.held is None:
            return
        self.held |= done
        ended = np.repeat(self.held.reshape(-1, self.size).all(axis=1), self.size)
        if ended.any():
            self.held[ended] = False
            self.release(np.flatnonzero(ended))
