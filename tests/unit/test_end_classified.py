"""A learned reward that ends episodes (reward.ends_episode): which steps it terminates."""

import numpy as np

from rlinf_user.runtime.rollout.hooks import LearnedReward


class _Envs:
    num_envs = 4

    def __init__(self):
        self.ended = []

    def end_episode(self, i):
        self.ended.append(i)
        return {"state": np.full(2, 9.0, np.float32), "images": {}, "timestamps": {"state": 0.0}}


def test_a_success_on_the_time_limit_step_is_terminated_and_running_ones_are_reset():
    envs = _Envs()
    hook = LearnedReward(client=None, envs=envs, ends_episode=True)
    next_obs = {"state": np.arange(8, dtype=np.float32).reshape(4, 2), "images": {}, "timestamps": {"state": np.zeros(4)}}
    infos = [{} for _ in range(4)]
    classified = np.array([True, True, False, True])
    terms = np.array([False, False, False, True])
    truncs = np.array([False, True, True, False])  # env 1: classified on the step the time limit cut
    terms, truncs = hook.end_classified(classified, next_obs, terms, truncs, infos)
    assert terms.tolist() == [True, True, False, True]
    assert truncs.tolist() == [False, False, True, False]
    assert envs.ended == [0]  # only the running episode is ended here (1 and 3 ended already)
    assert infos[0]["ended_by"] == "reward_classifier" and next_obs["state"][0].tolist() == [9.0, 9.0]
    assert next_obs["state"][1].tolist() == [2.0, 3.0]  # the batch already reset env 1
