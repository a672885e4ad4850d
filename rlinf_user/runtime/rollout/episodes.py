"""Episode bookkeeping: each env's return, length and intervention steps, and a record of
every episode that ends (with what the step hooks add: a classifier's verdict)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_user.runtime.rollout.step import Step, StepHook


class EpisodeBook:
    def __init__(self, num_envs: int, member: str):
        self.member = member
        self.ret = np.zeros(num_envs)
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.interventions = np.zeros(num_envs, dtype=np.int64)

    def step(self, step: Step, hooks: list[StepHook]) -> list[dict[str, Any]]:
        """Count this step; the records of the episodes it ended."""
        live = step.live
        self.ret += step.reward
        self.length += live
        self.interventions += step.intervention
        ended = []
        for i in np.flatnonzero(step.done):
            rec = {
                "member": self.member,
                "return": float(self.ret[i]),
                "length": int(self.length[i]),
                "success": bool(step.infos[i].get("success", False)),
                "policy_version": step.version,
                "intervention_steps": int(self.interventions[i]),
            }
            for hook in hooks:
                rec.update(hook.episode_record(int(i)))
            self.ret[i], self.length[i], self.interventions[i] = 0.0, 0, 0
            ended.append(rec)
        return ended

    def restart(self) -> None:
        """The episodes in progress were cut short: their statistics start over."""
        self.ret[:], self.length[:], self.interventions[:] = 0, 0, 0
