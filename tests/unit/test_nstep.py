"""n-step returns kept by the replay buffer, checked against a direct computation."""

import numpy as np
import pytest

from rlinf_user.data.replay import ReplayBuffer
from rlinf_user.runtime.learning.replay_service import ReplayService


def stream_rows(env_id, steps, rewards, term=None, trunc=None):
    n = len(steps)
    state = np.stack([np.full(3, env_id * 1000 + s, np.float32) for s in steps])
    return {
        "obs/state": state,
        "next_obs/state": state + 0.5,  # next_obs of step s is s + 0.5
        "action": np.zeros((n, 7), np.float32),
        "reward": np.asarray(rewards, np.float32),
        "terminated": np.asarray(term if term is not None else np.zeros(n), np.float32),
        "truncated": np.asarray(trunc if trunc is not None else np.zeros(n), np.float32),
        "env_id": np.full(n, env_id, np.int64),
        "step": np.asarray(steps, np.int64),
        "policy_version": np.zeros(n, np.int64),
        "intervention": np.zeros(n, bool),
    }


def cat(*chunks):
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def reference(episode_rewards, terminal, n, gamma):
    """Per row of one episode: (return, discount, index of the bootstrap row)."""
    out, T = [], len(episode_rewards)
    for t in range(T):
        k = min(n, T - t)
        ret = sum(gamma**i * episode_rewards[t + i] for i in range(k))
        disc = 0.0 if (terminal and t + k == T) else gamma**k
        out.append((ret, disc, t + k - 1))
    return out


def all_rows(rb):
    return rb.gather(np.arange(rb.size))


def test_interleaved_streams_get_their_own_returns():
    gamma, n = 0.9, 3
    rb = ReplayBuffer(capacity=100, nstep=n, gamma=gamma)
    r0 = [1.0, 2.0, 3.0, 4.0, 5.0]  # env 0: ends terminated at its 5th step
    r1 = [10.0, 20.0, 30.0, 40.0]  # env 1: still running
    # rows arrive in chunks of both envs, interleaved as a two-env worker sends them
    rb.add(cat(stream_rows(0, [0, 1], r0[:2]), stream_rows(1, [0, 1], r1[:2])))
    rb.add(cat(stream_rows(0, [2, 3, 4], r0[2:], term=[0, 0, 1]), stream_rows(1, [2, 3], r1[2:])))
    b = all_rows(rb)
    pos0 = [0, 1, 4, 5, 6]
    pos1 = [2, 3, 7, 8]
    for pos, (ret, disc, boot) in zip(pos0, reference(r0, True, n, gamma)):
        assert b["reward"][pos] == pytest.approx(ret)
        assert b["discount"][pos] == pytest.approx(disc)
        assert b["next_obs/state"][pos][0] == pytest.approx(boot + 0.5)
    # env 1's newest rows have open windows: their k < n returns, bootstrapping from the newest row
    for pos, (ret, disc, boot) in zip(pos1, reference(r1, False, n, gamma)):
        assert b["reward"][pos] == pytest.approx(ret)
        assert b["discount"][pos] == pytest.approx(disc)
        assert b["next_obs/state"][pos][0] == pytest.approx(1000 + boot + 0.5)
    # the logged/stored one-step columns are untouched
    np.testing.assert_array_equal(rb.storage["reward"][pos0], r0)


def test_episode_ends_and_gaps_cut_the_window():
    gamma, n = 0.5, 4
    rb = ReplayBuffer(capacity=50, nstep=n, gamma=gamma)
    rb.add(stream_rows(0, [0, 1, 2], [1.0, 1.0, 1.0], trunc=[0, 0, 1]))  # time limit at step 2
    rb.add(stream_rows(0, [3, 4], [8.0, 8.0]))  # the next episode, same env
    rb.add(stream_rows(0, [9, 10], [100.0, 100.0]))  # a gap (a restarted worker): new stream
    b = all_rows(rb)
    # truncation bootstraps (discount gamma^k), and never sums the next episode's rewards
    assert b["reward"][0] == pytest.approx(1 + 0.5 + 0.25)
    assert b["discount"][0] == pytest.approx(0.125)
    assert b["next_obs/state"][0][0] == pytest.approx(2.5)
    assert b["reward"][3] == pytest.approx(8 + 4) and b["next_obs/state"][3][0] == pytest.approx(4.5)
    assert b["reward"][4] == pytest.approx(8.0)
    assert b["reward"][5] == pytest.approx(100 + 50)


def test_one_step_is_unchanged_and_the_ring_wraps():
    rb1 = ReplayBuffer(capacity=8)
    rb3 = ReplayBuffer(capacity=8, nstep=3, gamma=0.9)
    rewards = np.arange(20, dtype=np.float32)
    for lo in range(0, 20, 5):
        c = stream_rows(0, list(range(lo, lo + 5)), rewards[lo : lo + 5])
        rb1.add(c)
        rb3.add(c)
    assert "discount" not in rb1.gather(np.arange(8))
    b = all_rows(rb3)
    # positions hold steps 16..19 (positions 0..3) and 12..15 (4..7)
    step_at = {p: (16 + p if p < 4 else 8 + p) for p in range(8)}
    for p, s in step_at.items():
        k = min(3, 20 - s)
        assert b["reward"][p] == pytest.approx(sum(0.9**i * (s + i) for i in range(k)))
        assert b["next_obs/state"][p][0] == pytest.approx(s + k - 1 + 0.5)


def test_recompute_after_relabelling_and_restart_give_the_same_targets(tmp_path):
    gamma, n = 0.9, 3
    chunks = [stream_rows(0, list(range(i, i + 4)), np.full(4, i, np.float32)) for i in range(0, 12, 4)]
    rb = ReplayBuffer(capacity=100, directory=tmp_path / "log", nstep=n, gamma=gamma)
    for c in chunks:
        rb.add(c)
    before = all_rows(rb)
    rb.storage["reward"][:] = 1.0
    rb.recompute_nstep()
    relabelled = all_rows(rb)
    assert relabelled["reward"][0] == pytest.approx(1 + 0.9 + 0.81)
    rb.close()
    again = ReplayBuffer(capacity=100, directory=tmp_path / "log", nstep=n, gamma=gamma)
    again.restore()  # a restarted learner rebuilds the returns from the log
    np.testing.assert_allclose(all_rows(again)["reward"], before["reward"])
    again.close()


def test_the_service_gives_both_sides_of_a_batch_n_step_targets(tmp_path):
    svc = ReplayService(capacity=100, directory=None, nstep=2, gamma=0.5, interventions_as_demos=True)
    c = stream_rows(0, [0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
    c["intervention"][:] = True
    svc.add(c)
    batch = svc.sample(8, num_batches=1, demo_ratio=0.5)
    assert batch["discount"].shape == (1, 8)
    # every row is from the same 4-step stream: reward = r_t + 0.5 r_{t+1} except the last
    expected = {1.0: 2.0, 2.0: 3.5, 3.0: 5.0, 4.0: 4.0}
    for s, r in zip(batch["obs/state"][0, :, 0], batch["reward"][0]):
        assert r == pytest.approx(expected[float(s) + 1.0])
