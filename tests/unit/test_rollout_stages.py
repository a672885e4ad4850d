"""The rollout's stages one at a time, on real reach envs (NumPy kinematics) and a real
policy: observation, act, step hooks, transition writer, episode bookkeeping."""

import numpy as np
import pytest

from rlinf_user.config.compose import compose_config
from rlinf_user.env.registry import make_vector_env
from rlinf_user.env.spec import Col, EnvSpec
from rlinf_user.runtime.rollout.act import Actor
from rlinf_user.runtime.rollout.episodes import EpisodeBook
from rlinf_user.runtime.rollout.fleet import Adapter
from rlinf_user.runtime.rollout.hooks import GroupHolds
from rlinf_user.runtime.rollout.observe import Observer
from rlinf_user.runtime.rollout.step import Step, StepHook
from rlinf_user.runtime.rollout.writer import TransitionWriter


@pytest.fixture
def reach():
    cfg = compose_config(["env.max_episode_steps=3", "policy.hidden=[16,16]"], sim="reach")
    envs = make_vector_env(cfg.env, 4, seed=1)
    spec = EnvSpec.of_env(envs)
    yield cfg, envs, spec, Adapter(spec, spec, 0)
    envs.close()


def _step(envs, actions, version=0, random=False, **kw) -> Step:
    n = envs.num_envs
    step = Step({}, actions, {}, version, random, np.zeros(n, dtype=bool), **kw)
    hold = {} if step.active is None else {"active": step.active}
    step.next_obs, step.reward, step.terminated, step.truncated, step.infos = envs.step(actions, reset_seeds=step.reset_seeds, **hold)
    return step


def test_the_actor_acts_with_its_policy_or_at_random(reach):
    cfg, envs, spec, adapter = reach
    actor = Actor(cfg, envs, on_policy=False, served=False, seed=0)
    actor.attach(spec, adapter)
    obs = envs.reset(seed=0)
    a, _ = actor.act(obs, random=False)
    assert a.shape == (4, spec.contract_action_dim) and np.isfinite(a).all() and actor.version == -1
    assert actor.chunks.due().all()  # a per-step policy: each action is a whole chunk
    r, extras = actor.act(obs, random=True)
    assert extras == {} and np.abs(r[:, list(spec.active_dims)]).max() <= 1.0
    actor.close()


def test_group_holds_share_reset_seeds_and_hold_an_early_finisher(reach):
    cfg, envs, spec, _ = reach
    released = []
    groups = GroupHolds(2, envs, seed=5, worker_id=0, release=released.append)
    seeds = groups.seeds()
    assert seeds[0] == seeds[1] and seeds[2] == seeds[3] and seeds[0] != seeds[2]
    obs = envs.reset(seeds=seeds)
    assert np.array_equal(obs[Col.STATE][0], obs[Col.STATE][1])
    step = Step({}, np.zeros((4, spec.contract_action_dim), np.float32), {}, 0, False, np.zeros(4, bool))
    groups.before(step)
    assert step.group[0] == step.group[1] != step.group[2] and step.active.all()
    step.terminated, step.truncated = np.array([True, False, False, False]), np.zeros(4, bool)
    groups.after(step)
    assert groups.held.tolist() == [True, False, False, False] and groups.episode.tolist() == [1, 0, 0, 0]
    groups.before(step)
    assert step.active.tolist() == [False, True, True, True]  # env 0 waits for env 1
    step.terminated = np.array([False, True, False, False])
    groups.after(step)
    assert not groups.held.any() and [r.tolist() for r in released] == [[0, 1]]  # the group starts together


def test_the_writer_stores_live_rows_with_col_names_and_flushes_at_chunk_steps(reach):
    cfg, envs, spec, adapter = reach
    obs = envs.reset(seed=0)
    writer = TransitionWriter(4, worker_id=2, sink=None, on_policy=False, per_action_credit=False, chunk_steps=6)
    actions = np.zeros((4, spec.contract_action_dim), np.float32)
    step = _step(envs, actions, version=7, active=np.array([True, True, False, True]))
    step.obs = obs
    writer.write(step, step.next_obs, np.ones(4, bool), 1)
    assert writer.pending_rows == 3 and writer.rows_sent == 3 and not writer.out.backlog
    rows = writer.pending[0]
    assert rows[Col.ENV_ID].tolist() == [2000, 2001, 2003] and (rows[Col.POLICY_VERSION] == 7).all()
    assert set(Col.REQUIRED) <= set(rows) and rows[Col.STEP].tolist() == [0, 0, 0]
    step = _step(envs, actions)
    step.obs = step.next_obs
    writer.write(step, step.next_obs, np.ones(4, bool), 1)  # 7 rows >= 6: sent (no sink: kept in the backlog)
    assert writer.pending == [] and len(writer.out.backlog) == 1 and writer.rows_sent == 7
    assert writer.out.backlog[0][1][Col.STEP].tolist() == [0, 0, 0, 1, 1, 0, 1]  # env 2 made one step only
    writer.close()


def test_on_policy_rows_fold_a_chunks_steps_into_one_decision(reach):
    cfg, envs, spec, _ = reach
    envs.reset(seed=0)
    writer = TransitionWriter(4, 0, None, on_policy=True, per_action_credit=False, chunk_steps=1000)
    extras = {Col.LOG_PROB: np.zeros(4, np.float32), Col.VALUE: np.ones(4, np.float32), Col.SAMPLE: np.zeros((4, 1, 3))}
    for k in range(2):  # a chunk of two actions: the first step opens the decision, the second closes it
        step = _step(envs, np.zeros((4, spec.contract_action_dim), np.float32))
        step.obs, step.extras = step.next_obs, extras
        writer.write(step, step.next_obs, np.full(4, k == 1), 2)
    rows = writer.pending[0]
    assert len(writer.pending) == 1 and rows[Col.STEP].tolist() == [0, 0, 0, 0]
    assert Col.LOG_PROB in rows and Col.VALUE in rows  # the policy's extras travel with the row


def test_replay_chunk_rows_fold_a_chunks_steps_keeping_each_reward_and_the_noise_chosen(reach):
    """algo=dsrl's plan: a chunk whose noise was chosen once is one replay row; an episode
    that ends inside a chunk ends its row there (env.max_episode_steps=3, chunks of 2)."""
    cfg, envs, spec, _ = reach
    obs = envs.reset(seed=0)
    writer = TransitionWriter(4, 0, None, on_policy=False, per_action_credit=False, chunk_steps=1000,
                              replay_extras=(Col.NOISE,), chunk_rows=True)  # fmt: skip
    rewards, first_obs = [], obs[Col.STATE].copy()
    for k in range(3):
        step = _step(envs, np.zeros((4, spec.contract_action_dim), np.float32))
        step.obs, step.extras = obs, {Col.NOISE: np.full((4, 6), float(k // 2), np.float32)}
        rewards.append(step.reward.copy())
        writer.write(step, step.next_obs, np.full(4, k % 2 == 1), 2)
        obs = step.next_obs
    rows = {k: np.concatenate([p[k] for p in writer.pending]) for k in writer.pending[0]}
    assert len(rows[Col.REWARD]) == 8 and rows[Col.STEP].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    first, last = slice(0, 4), slice(4, 8)
    np.testing.assert_array_equal(rows[Col.OBS + "/" + Col.STATE][first], first_obs)  # the chunk's first step
    np.testing.assert_allclose(rows[Col.STEP_REWARDS][first], np.stack(rewards[:2], 1))
    assert rows[Col.CHUNK_STEPS].tolist() == [2, 2, 2, 2, 1, 1, 1, 1]
    np.testing.assert_allclose(rows[Col.STEP_REWARDS][last], np.stack([rewards[2], np.zeros(4)], 1))
    assert (rows[Col.NOISE][first] == 0).all() and (rows[Col.NOISE][last] == 1).all()
    assert (rows[Col.TRUNCATED][last] == 1).all()  # the episode's end closed the second chunk after one step


def test_the_episode_book_records_ended_episodes_with_what_hooks_add(reach):
    cfg, envs, spec, _ = reach

    class Verdict(StepHook):
        def episode_record(self, i):
            return {"classified_success": i == 2}

    envs.reset(seed=0)
    book = EpisodeBook(4, "left")
    done = []
    for _ in range(3):  # env.max_episode_steps=3: every episode ends on the third step
        step = _step(envs, np.zeros((4, spec.contract_action_dim), np.float32), version=4)
        done += book.step(step, [Verdict()])
    assert len(done) == 4 and all(r["length"] == 3 and r["member"] == "left" and r["policy_version"] == 4 for r in done)
    assert [r["classified_success"] for r in done] == [False, False, True, False]
    assert (book.length == 0).all() and (book.ret == 0).all()


def test_the_observer_stores_an_ended_episodes_final_observation(reach):
    cfg, envs, spec, adapter = reach
    envs.reset(seed=0)
    observer = Observer()
    observer.adapter = adapter
    for _ in range(3):
        step = _step(envs, np.ones((4, spec.contract_action_dim), np.float32))
    stored = observer.reached(step.next_obs, step.done, step.infos)
    assert step.done.all()
    for i in range(4):  # the batch holds the next episode's first observation; stored is the final one
        np.testing.assert_array_equal(stored[Col.STATE][i], step.infos[i]["final_obs"][Col.STATE])
        assert not np.array_equal(stored[Col.STATE][i], step.next_obs[Col.STATE][i])
