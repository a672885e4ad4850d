"""A disaggregated learner prefetches its next call's batches from the remote replay; its
update-to-data budget may ask the next call for more or fewer than were prefetched."""

import numpy as np

from rlinf_user.runtime.learning.learner import fit_batches


def batches(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n)
    return {"reward": np.repeat(ids[:, None], 4, 1).astype(np.float32), "obs/state": np.zeros((n, 4, 3))}


def test_a_shortfall_is_sampled_now_and_a_surplus_left_out():
    asked = []

    def more(k):
        asked.append(k)
        return batches(100, k)

    got = fit_batches(batches(0, 25), 50, more)  # 25 prefetched, 50 wanted (the CI failure: IndexError at 25)
    assert asked == [25] and got["reward"].shape == (50, 4) and got["obs/state"].shape == (50, 4, 3)
    assert got["reward"][24, 0] == 24 and got["reward"][25, 0] == 100
    got = fit_batches(batches(0, 50), 10, more)
    assert asked == [25] and got["reward"].shape == (10, 4) and got["reward"][9, 0] == 9
    same = batches(0, 50)
    assert fit_batches(same, 50, more) is same and asked == [25]
