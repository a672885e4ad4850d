"""A learned reward that ends episodes (reward.ends_episode): which steps it terminates."""

import numpy as np

from rlinf_user.runtime.env_worker import EnvWorker


class _Envs:
    def __init__(self):
        self.ended = []

    def end_episode(self, i):
        self.ended.append(i)
        return {"state": np.full(2, 9.0, np.float32), "images": {}, "timestamps": {"state": 0.0}}


def test_a_success_on_the_time_limit_step_is_terminated_and_running_ones_are_reset():
    worker = EnvWorker.__new__(EnvWorker)  # only _end_classified's own state is needed
    worker.envs = _Envs()
    next_obs = {"state": np.arange(8, dtype=np.float32).reshape(4, 2), "images": {}, "timestamps": {"state": np.zeros(4)}}
    infos = [{} for _ in range(4)]
    classified = np.array([True, True, False, True])
    terms = np.array([False, False, False, True])
    truncs = np.array([False, True, True, False])  # env 1: classified on the step the time limit cut
    terms, truncs = worker._end_classified(classified, next_obs, terms, truncs, infos)
    assert terms.tolist() == [True, True, False, True]
    assert truncs.tolist() == [False, False, True, False]
    assert worker.envs.ended == [0]  # only the running episode is ended here (1 and 3 ended already)
    assert infos[0]["ended_by"] == "reward_classifier" and next_obs["state"][0].tolist() == [9.0, 9.0]
    assert next_obs["state"][1].tolist() == [2.0, 3.0]  # the batch already reset env 1
