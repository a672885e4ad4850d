"""On-policy data: GAE over ordered per-env segments, GRPO's groups, chunks, the spec."""

import numpy as np
import pytest

from rlinf_user.algorithms.ppo.credit import OnPolicyStore, gae
from rlinf_user.env.spec import Col, EnvSpec, flat_obs, nest_columns
from rlinf_user.runtime.rollout.chunks import ChunkQueue


def _rows(env, step, reward, value, term=None, trunc=None, version=0, group=None):
    n = len(step)
    cols = {
        "obs/state": np.zeros((n, 2), np.float32),
        "next_obs/state": np.arange(n, dtype=np.float32)[:, None].repeat(2, 1) + 100,  # marks which row bootstraps
        Col.ACTION: np.zeros((n, 7), np.float32),
        Col.REWARD: np.asarray(reward, np.float32),
        Col.TERMINATED: np.asarray(term if term is not None else [0] * n, np.float32),
        Col.TRUNCATED: np.asarray(trunc if trunc is not None else [0] * n, np.float32),
        Col.ENV_ID: np.full(n, env, np.int64),
        Col.STEP: np.asarray(step, np.int64),
        Col.VALUE: np.asarray(value, np.float32),
        Col.LOG_PROB: np.zeros(n, np.float32),
        Col.SAMPLE: np.zeros((n, 1, 7), np.float32),
        Col.POLICY_VERSION: np.full(n, version, np.int64),
    }
    if group is not None:
        cols[Col.GROUP] = np.asarray(group, np.int64)
    return cols


def _reference_gae(r, v, next_v_last, gamma, lam):
    adv, last = np.zeros(len(r)), 0.0
    for t in reversed(range(len(r))):
        nv = next_v_last if t == len(r) - 1 else v[t + 1]
        delta = r[t] + gamma * nv - v[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


def test_gae_matches_the_textbook_recursion_and_bootstraps_the_segment_end():
    r, v = [1.0, 0.0, 2.0, 0.5], [0.3, 0.1, 0.7, 0.2]
    boot = []

    def value_fn(cols):
        boot.append(cols["obs/state"][:, 0].tolist())
        return np.full(len(cols["obs/state"]), 0.9)

    adv, ret = gae(_rows(3, [0, 1, 2, 3], r, v), value_fn, 0.9, 0.8)
    np.testing.assert_allclose(adv, _reference_gae(r, v, 0.9, 0.9, 0.8), rtol=1e-5)
    np.testing.assert_allclose(ret, adv + np.asarray(v), rtol=1e-5)
    assert boot == [[103.0]]  # only the last row asked for V(next observation)


def test_gae_never_crosses_episodes_or_gaps_and_truncation_bootstraps():
    # steps 0-1 (terminated at 1), 2-3 (truncated at 3), then a gap: 7-8
    cols = _rows(0, [0, 1, 2, 3, 7, 8], [1, 1, 1, 1, 1, 1], [0.5] * 6, term=[0, 1, 0, 0, 0, 0], trunc=[0, 0, 0, 1, 0, 0])
    asked = []

    def value_fn(c):
        asked.extend(c["obs/state"][:, 0].tolist())
        return np.full(len(c["obs/state"]), 10.0)

    adv, _ = gae(cols, value_fn, 1.0, 1.0)
    assert asked == [103.0, 105.0]  # the truncated row and the last row; not the terminal one
    assert adv[1] == pytest.approx(1 - 0.5)  # terminal: no bootstrap
    assert adv[3] == pytest.approx(1 + 10 - 0.5)  # truncated: V(final observation)
    assert adv[2] == pytest.approx((1 + 0.5 - 0.5) + adv[3])
    assert adv[0] == pytest.approx((1 + 0.5 - 0.5) + adv[1])  # stops at the terminal step
    assert adv[4] == pytest.approx((1 + 0.5 - 0.5) + adv[5])  # after the gap: its own run


def test_the_store_orders_out_of_order_chunks_and_drops_stale_rows():
    store = OnPolicyStore(gamma=0.9, lam=0.95)
    late = _rows(1, [2, 3], [1, 1], [0, 0], version=3)
    early = _rows(1, [0, 1], [1, 1], [0, 0], version=2)
    stale = _rows(2, [0, 1], [5, 5], [0, 0], version=1)
    for c in (late, early, stale):
        store.add(c)
    batch = store.take(lambda c: np.zeros(len(c["obs/state"])), version=3, max_lag=1)
    assert batch[Col.STEP].tolist() == [0, 1, 2, 3] and (batch[Col.ENV_ID] == 1).all()
    assert store.dropped_stale == 2 and store.rows() == 0
    g, lam = 0.9, 0.95
    expected = _reference_gae([1, 1, 1, 1], [0, 0, 0, 0], 0.0, g, lam)
    np.testing.assert_allclose(batch["advantage"], expected, rtol=1e-5)
    with pytest.raises(ValueError, match="lacks"):
        store.add({k: v for k, v in early.items() if k != Col.LOG_PROB})


def test_grpo_normalises_returns_within_a_group_once_it_is_complete():
    store = OnPolicyStore(gamma=1.0, lam=1.0, group_size=2)
    # group 7: env 0 gets return 3, env 1 gets return 1 (episodes of different lengths)
    store.add(_rows(0, [0, 1, 2], [1, 1, 1], [0, 0, 0], term=[0, 0, 1], group=[7, 7, 7]))
    assert store.rows() == 0  # half the group has ended
    store.add(_rows(1, [0, 1], [0, 0], [0, 0], group=[7, 7]))  # still running
    assert store.rows() == 0
    store.add(_rows(1, [2], [1], [0], trunc=[1], group=[7]))
    assert store.rows() == 6
    batch = store.take(lambda c: None, version=0)
    adv = dict(zip(zip(batch[Col.ENV_ID].tolist(), batch[Col.STEP].tolist()), batch["advantage"].tolist()))
    assert adv[(0, 0)] == pytest.approx(1.0) and adv[(1, 2)] == pytest.approx(-1.0)  # (3-2)/1, (1-2)/1
    assert store.rows() == 0 and store.pending_groups() == 0


def test_grpo_step_baseline_credits_an_action_only_with_what_follows_it():
    """baseline=step: advantage at t = reward-to-go minus the other episodes' mean
    reward-to-go at t (0 past their end), scaled by one std for the whole group."""
    store = OnPolicyStore(gamma=1.0, lam=1.0, group_size=2, baseline="step")
    store.add(_rows(0, [0, 1, 2], [1, 0, 5], [0, 0, 0], term=[0, 0, 1], group=[3, 3, 3]))  # to-go 6, 5, 5
    store.add(_rows(1, [0, 1], [2, 1], [0, 0], trunc=[0, 1], group=[3, 3]))  # to-go 3, 1 (then 0)
    batch = store.take(lambda c: None, version=0)
    adv = dict(zip(zip(batch[Col.ENV_ID].tolist(), batch[Col.STEP].tolist()), batch["advantage"].tolist()))
    resid = np.array([6 - 3, 5 - 1, 5 - 0, 3 - 6, 1 - 5])
    expected = resid / resid.std()
    got = [adv[(0, 0)], adv[(0, 1)], adv[(0, 2)], adv[(1, 0)], adv[(1, 1)]]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    # the same group scored by episode: every step gets its episode's normalised return
    store = OnPolicyStore(gamma=1.0, lam=1.0, group_size=2)
    store.add(_rows(0, [0, 1, 2], [1, 0, 5], [0, 0, 0], term=[0, 0, 1], group=[3, 3, 3]))
    store.add(_rows(1, [0, 1], [2, 1], [0, 0], trunc=[0, 1], group=[3, 3]))
    assert set(store.take(lambda c: None, version=0)["advantage"].round(5).tolist()) == {1.0, -1.0}
    with pytest.raises(ValueError, match="baseline"):
        OnPolicyStore(1.0, 1.0, 2, baseline="critic")


def test_chunks_run_step_by_step_and_never_cross_an_episode():
    q = ChunkQueue(2)
    assert q.empty_rows().tolist() == [0, 1]
    q.put(np.array([0, 1]), np.arange(2 * 3 * 1, dtype=np.float32).reshape(2, 3, 1), {"value": np.array([5.0, 6.0])}, 4)
    a, extras, version = q.pop()
    assert a[:, 0].tolist() == [0, 3] and version == 4 and extras["value"].tolist() == [5, 6]
    q.drop([1])  # env 1's episode ended: its chunk is thrown away
    assert q.empty_rows().tolist() == [1]
    q.put(np.array([1]), np.full((1, 3, 1), 9, np.float32), {"value": np.array([7.0])}, 5)
    a, _, version = q.pop()
    assert a[:, 0].tolist() == [1, 9] and version == 4  # the oldest version among the actions
    with pytest.raises(FloatingPointError):
        q.put(np.array([0]), np.full((1, 3, 1), np.nan, np.float32), {}, 6)


def test_popped_extras_stay_with_their_step_when_new_chunks_arrive():
    """A pending transition keeps the log-prob/value/sample it was acted with: the next
    query writes the queue's arrays in place and must not reach the rows already popped."""
    q = ChunkQueue(2)
    q.put(np.array([0, 1]), np.zeros((2, 1, 1), np.float32), {"log_prob": np.array([-1.0, -2.0])}, 0)
    _, first, _ = q.pop()
    q.put(np.array([0, 1]), np.ones((2, 1, 1), np.float32), {"log_prob": np.array([-3.0, -4.0])}, 0)
    _, second, _ = q.pop()
    assert first["log_prob"].tolist() == [-1.0, -2.0] and second["log_prob"].tolist() == [-3.0, -4.0]


def test_spec_round_trips_and_columns_nest():
    spec = EnvSpec(state_dim=9, cameras={"wrist": [64, 64]}, active_dims=(0, 1, 2, 6), instruction=True)
    assert spec.action_dim == 4 and spec.env_state_dim == 9 and spec.cameras == {"wrist": (64, 64)}
    assert EnvSpec.from_dict(spec.to_dict()) == spec
    old = {"state_dim": 9, "cameras": {}, "action_dim": 4, "active_dims": [0, 1, 2, 6], "contract_action_dim": 7}
    assert EnvSpec.from_dict(old).active_dims == (0, 1, 2, 6)  # a checkpoint written before EnvSpec
    np.testing.assert_array_equal(spec.expand_action(np.ones((2, 4), np.float32))[0], [1, 1, 1, 0, 0, 0, 1])
    with pytest.raises(ValueError, match="outside"):
        EnvSpec(state_dim=3, active_dims=(0, 9))
    obs = {"state": np.zeros((2, 9), np.float32), "images": {"wrist": np.zeros((2, 64, 64, 3), np.uint8)},
           "instruction": ["pick the red block", "pick the blue block"]}  # fmt: skip
    cols = flat_obs("obs", obs)
    assert set(cols) == {"obs/state", "obs/images/wrist", "obs/instruction"}
    assert cols["obs/instruction"].tolist() == obs["instruction"]
    nested = nest_columns({**cols, "reward": np.zeros(2)})
    assert nested["obs"]["images"]["wrist"].shape == (2, 64, 64, 3) and "reward" in nested


def test_a_chunk_of_steps_becomes_one_decision_row():
    """Chunk-level credit: the rows of the steps one chunk ran fold into one row (first
    observation and extras, last next-observation and flags, summed reward, a decision
    sequence number); an episode end closes a chunk early; a round's end closes them all."""
    from rlinf_user.runtime.rollout.chunks import DecisionRows

    d = DecisionRows(2)

    def step(t, closes, term=(0, 0)):
        cols = {
            "obs/state": np.array([[t], [10 + t]], np.float32),
            "next_obs/state": np.array([[t + 1], [11 + t]], np.float32),
            Col.REWARD: np.array([1.0, 2.0], np.float32),
            Col.TERMINATED: np.array(term, np.float32),
            Col.TRUNCATED: np.zeros(2, np.float32),
            Col.LOG_PROB: np.array([[t], [t]], np.float32),
            Col.INTERVENTION: np.array([t == 1, False]),
            Col.STEP: np.array([t, t], np.int64),
        }
        return d.add(cols, np.array([True, True]), np.array(closes))

    assert step(0, [False, False]) is None
    assert step(1, [False, False]) is None
    rows = step(2, [True, False], term=(0, 1))  # env 0's chunk is used up; env 1 ... not yet closed
    assert rows["obs/state"].tolist() == [[0.0]] and rows["next_obs/state"].tolist() == [[3.0]]
    assert rows[Col.REWARD].tolist() == [3.0] and rows[Col.LOG_PROB].tolist() == [[0.0]]
    assert rows[Col.INTERVENTION].tolist() == [True] and rows[Col.STEP].tolist() == [0]
    rows = step(3, [True, True])
    assert rows[Col.STEP].tolist() == [1, 0] and rows["obs/state"].tolist() == [[3.0], [10.0]]
    assert rows[Col.REWARD].tolist() == [1.0, 8.0] and rows[Col.TERMINATED].tolist() == [0.0, 0.0]
    assert step(4, [False, False]) is None
    rest = d.close_all()
    assert rest[Col.STEP].tolist() == [2, 1] and d.close_all() is None
    # held envs (not live) make no step and close nothing
    cols = {Col.REWARD: np.ones(2, np.float32), Col.TERMINATED: np.zeros(2), Col.TRUNCATED: np.zeros(2)}
    out = d.add(cols, np.array([False, True]), np.array([True, True]))
    assert out[Col.STEP].tolist() == [2] and out[Col.REWARD].tolist() == [1.0]


def test_per_step_decisions_take_the_rows_as_they_are():
    """Chunks of one step: every live env's row comes back unchanged, numbered per env."""
    from rlinf_user.runtime.rollout.chunks import DecisionRows

    d = DecisionRows(3)
    cols = {"obs/state": np.arange(3, dtype=np.float32)[:, None], Col.REWARD: np.array([1.0, 2.0, 3.0], np.float32),
            Col.STEP: np.array([7, 7, 7])}  # fmt: skip
    live = np.array([True, False, True])
    rows = d.add(cols, live, live)
    assert rows["obs/state"][:, 0].tolist() == [0.0, 2.0] and rows[Col.REWARD].tolist() == [1.0, 3.0]
    assert rows[Col.STEP].tolist() == [0, 0]
    rows = d.add(cols, np.ones(3, bool), np.ones(3, bool))
    assert rows[Col.STEP].tolist() == [1, 0, 1] and d.close_all() is None


def _as_chunks(per_step: dict, starts: list[int], h: int) -> dict:
    """The rows of ``per_step`` (one env, steps in order) grouped into chunks that begin at
    ``starts``: action-level rows (values per action, each action's reward, how many ran)."""
    n = len(per_step[Col.REWARD])
    ends = [*starts[1:], n]
    rows = {k: [] for k in (Col.STEP_REWARDS, Col.VALUE, Col.CHUNK_STEPS)}
    pick = [e - 1 for e in ends]  # the row's flags and next observation: its last step's
    out = {k: v[pick].copy() for k, v in per_step.items()}
    for s, e in zip(starts, ends):
        sr, val = np.zeros(h, np.float32), np.zeros(h, np.float32)
        sr[: e - s], val[: e - s] = per_step[Col.REWARD][s:e], per_step[Col.VALUE][s:e]
        rows[Col.STEP_REWARDS].append(sr)
        rows[Col.VALUE].append(val)
        rows[Col.CHUNK_STEPS].append(e - s)
    out.update({k: np.asarray(v) for k, v in rows.items()})
    out[Col.STEP] = np.arange(len(starts), dtype=np.int64)
    out[Col.REWARD] = out[Col.STEP_REWARDS].sum(1)
    return out


def test_action_level_gae_is_per_step_gae_over_the_actions_that_ran():
    """Chunks of up to 3 actions (an episode ends mid-chunk, then one is truncated and
    the data ends): with per-action values equal to per-step values, every action's
    advantage is exactly what per-step GAE gives its step, and nothing past what ran."""
    from rlinf_user.algorithms.ppo.credit import gae_actions

    rng = np.random.default_rng(0)
    r, v = rng.normal(size=9).round(2), rng.normal(size=9).round(2)
    term, trunc = [0, 0, 0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1, 0]
    per_step = _rows(0, list(range(9)), r, v, term=term, trunc=trunc)
    want, want_ret = gae(per_step, lambda c: np.full(len(c["obs/state"]), 0.4), 0.9, 0.8)
    # chunks: [0,1,2], [3,4] (the episode ends at 4), [5,6,7] (truncated at 7), [8]
    chunks = _as_chunks(per_step, [0, 3, 5, 8], 3)
    asked = []

    def value_fn(c):  # per-action values of the next observation: the first one bootstraps
        asked.extend(c["obs/state"][:, 0].tolist())
        return np.tile([0.4, -5.0, -5.0], (len(c["obs/state"]), 1))

    adv, ret = gae_actions(chunks, value_fn, 0.9, 0.8)
    ran = np.arange(3)[None] < chunks[Col.CHUNK_STEPS][:, None]
    np.testing.assert_allclose(adv[ran], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret[ran], want_ret, rtol=1e-5, atol=1e-6)
    assert not adv[~ran].any() and not ret[~ran].any()
    assert asked == [107.0, 108.0]  # the truncated chunk's and the last one's next observation


def test_action_level_rows_keep_each_actions_reward():
    from rlinf_user.runtime.rollout.chunks import DecisionRows

    rows = DecisionRows(2, per_action=True)
    rows.width = 3

    def step(reward, closes, done=(0, 0)):
        cols = {
            "obs/state": np.zeros((2, 1), np.float32), "next_obs/state": np.zeros((2, 1), np.float32),
            Col.REWARD: np.asarray(reward, np.float32), Col.TERMINATED: np.asarray(done, np.float32),
            Col.TRUNCATED: np.zeros(2, np.float32),
        }  # fmt: skip
        return rows.add(cols, np.ones(2, bool), np.asarray(closes, bool))

    assert step([1, 10], [0, 0]) is None
    out = step([2, 20], [1, 0], done=(1, 0))  # env 0's episode ends after 2 of 3 actions
    np.testing.assert_array_equal(out[Col.STEP_REWARDS], [[1, 2, 0]])
    assert out[Col.CHUNK_STEPS].tolist() == [2] and out[Col.REWARD].tolist() == [3]
    out = step([5, 30], [1, 1])
    np.testing.assert_array_equal(out[Col.STEP_REWARDS], [[5, 0, 0], [10, 20, 30]])
    assert out[Col.CHUNK_STEPS].tolist() == [1, 3]


def test_chunks_stored_while_the_learner_takes_are_neither_lost_nor_half_joined():
    """The learner's sink stores chunks while its training loop takes them (two threads): every
    row comes out exactly once, every taken batch's columns of one length."""
    import sys
    import threading

    store = OnPolicyStore(gamma=0.9, lam=0.95)
    n_chunks, per = 2000, 4
    values = lambda obs: np.zeros(len(next(iter(obs.values()))), np.float32)  # noqa: E731

    def feed():
        for k in range(n_chunks):
            rows = _rows(np.full(per, k % 7), np.arange(per) + per * k, np.ones(per), np.zeros(per))
            rows.update({f"obs/extra{j}": np.zeros(per, np.float32) for j in range(100)})  # a long join
            store.add(rows)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as they can
    t = threading.Thread(target=feed)
    t.start()
    taken = 0
    try:
        while t.is_alive() or store.rows():
            batch = store.take(values, version=0)
            if batch is not None:
                assert len({len(v) for v in batch.values()}) == 1
                taken += len(batch[Col.REWARD])
    finally:
        t.join()
        sys.setswitchinterval(switch)
    assert taken == n_chunks * per
