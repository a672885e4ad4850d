"""ContractEnv's guarantees, on a minimal point-mass backend defined here."""

import numpy as np
import pytest

from rlinf_user.env.base import ContractEnv
from rlinf_user.env.contract import ContractError, make_observation, validate_step


class PointMass(ContractEnv):
    max_episode_steps = 5

    def __init__(self, nan_at=None):
        self.nan_at = nan_at
        self._init_spaces(3, {})

    def _reset(self, seed):
        self.pos = np.zeros(3)
        self.t = 0
        return make_observation(self.pos, stamp=0.0), {}

    def _step(self, action):
        self.t += 1
        self.pos = self.pos + 0.1 * action[:3]
        state = self.pos.copy()
        if self.nan_at == self.t:
            state[0] = np.nan
        success = bool(self.pos[0] >= 0.2)
        return make_observation(state, stamp=self.t * 0.1), float(self.pos[0]), success, {"success": success}


def test_truncates_at_limit_and_keeps_terminated_apart():
    env = PointMass()
    env.reset(seed=0)
    for _i in range(5):
        result = env.step(np.zeros(7))
        validate_step(result, env.observation_space)
    _, _, terminated, truncated, info = result
    assert truncated and not terminated and info["success"] is False


def test_success_terminates_and_the_batch_wrapper_adds_the_bonus():
    from rlinf_user.env.shaping import ShapedVectorEnv
    from rlinf_user.env.vector import EnvBatch

    env = PointMass()
    env.reset()
    _, r1, te1, _, _ = env.step(np.array([1, 0, 0, 0, 0, 0, 0]))
    _, r2, te2, tr2, info = env.step(np.array([1, 0, 0, 0, 0, 0, 0]))
    assert not te1 and r1 == pytest.approx(0.1)
    assert te2 and not tr2 and info["success"] and r2 == pytest.approx(0.2)  # the env's own reward
    batch = ShapedVectorEnv(EnvBatch([PointMass, PointMass]), bonus=10.0)
    batch.reset(seed=0)
    push = np.array([[1.0, 0, 0, 0, 0, 0, 0], [0.5, 0, 0, 0, 0, 0, 0]])
    _, r, te, _, _ = batch.step(push)
    np.testing.assert_allclose(r, [0.1, 0.05], rtol=1e-5)
    _, r, te, _, infos = batch.step(push)
    assert te.tolist() == [True, False] and infos[0]["success"]
    np.testing.assert_allclose(r, [0.2 + 10.0, 0.1], rtol=1e-5)  # only the successful end earns it
    assert batch.num_envs == 2 and len(batch.envs) == 2  # the rest is the wrapped batch's


def test_actions_nan_refused_and_out_of_range_clipped():
    env = PointMass()
    env.reset()
    with pytest.raises(ContractError, match="NaN"):
        env.step(np.array([np.nan, 0, 0, 0, 0, 0, 0]))
    with pytest.raises(ContractError, match="shape"):
        env.step(np.zeros(6))
    obs, *_ = env.step(np.array([50.0, -50.0, 0, 0, 0, 0, 0]))
    np.testing.assert_allclose(obs["state"], [0.1, -0.1, 0.0])


def test_nan_observation_is_an_error_not_data():
    env = PointMass(nan_at=2)
    env.reset()
    env.step(np.zeros(7))
    with pytest.raises(ContractError, match="NaN"):
        env.step(np.zeros(7))


def test_a_batch_ends_one_episode_on_request_and_leaves_the_others():
    from rlinf_user.env.vector import EnvBatch

    batch = EnvBatch([PointMass, PointMass])
    batch.reset(seed=0)
    obs, *_ = batch.step(np.tile([1.0, 0, 0, 0, 0, 0, 0], (2, 1)))
    np.testing.assert_allclose(obs["state"][:, 0], [0.1, 0.1])
    first = batch.end_episode(1)  # e.g. a learned reward said success
    np.testing.assert_allclose(first["state"], [0.0, 0.0, 0.0])
    assert batch.envs[1].t == 0 and batch.envs[0].t == 1
    obs, _, terms, truncs, _ = batch.step(np.tile([1.0, 0, 0, 0, 0, 0, 0], (2, 1)))
    np.testing.assert_allclose(obs["state"][:, 0], [0.0, 0.1])  # env 0 reached success and was auto-reset
    assert terms.tolist() == [True, False] and not truncs.any()


def test_reach_sim_draws_episodes_from_its_seed_and_refuses_bad_options():
    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_env, validate_env_config
    from rlinf_user.sims.reach import ReachEnv

    cfg = compose_config([], sim="reach")
    a, b = make_env(cfg.env, seed=3), make_env(cfg.env, seed=3)
    first = [a.reset()[0]["state"] for _ in range(3)]
    assert all(np.array_equal(x, y) for x, y in zip(first, [b.reset()[0]["state"] for _ in range(3)]))
    assert not np.array_equal(first[0], first[1])  # a new goal and start every episode
    obs, _ = a.reset(seed=11)
    goal = obs["state"][3:6]
    for _ in range(60):  # head for the goal: success terminates within the time limit
        obs, reward, term, trunc, info = a.step(np.r_[np.clip((goal - a.tcp) / 0.02, -1, 1), np.zeros(4)])
        if term or trunc:
            break
    assert term and info["success"] and info["distance"] < 0.03 and reward > 0.7
    for bad, match in (("+env.kwargs.speed=2", "not reach options"), ("env.cameras=[front]", "no cameras"),
                       ("env.reward=shaped", "dense or sparse"), ("env.task=Push", "not supported")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            validate_env_config(compose_config([bad], sim="reach").env)
    assert isinstance(a, ReachEnv)
