"""Evaluation reports what it measured: a Wilson interval, how many distinct initial
states it covered, and a deterministic reset as one trial."""

import numpy as np
import pytest

from rlinf_user import seeds
from rlinf_user.config.compose import ConfigError, compose_config, validate
from rlinf_user.env.registry import make_env
from rlinf_user.env.spec import EnvSpec
from rlinf_user.evaluation import describe_eval, evaluate_policy, wilson
from rlinf_user.policies.base import build_policy


def test_wilson_interval_matches_the_textbook_values():
    assert wilson(0, 10) == (0.0, 0.2775)  # 0 of 10 is not "0%, certainly"
    assert wilson(10, 10) == (0.7225, 1.0)
    lo, hi = wilson(45, 50)
    assert (lo, hi) == (0.7864, 0.9565) and lo < 0.9 < hi
    assert wilson(0, 0) == (0.0, 1.0)


@pytest.fixture
def reach():
    cfg = compose_config(["env.max_episode_steps=5"], sim="reach")
    env = make_env(cfg.env, seed=0)
    policy = build_policy(cfg.policy, EnvSpec.of_env(env))
    yield env, policy
    env.close()


def test_a_randomised_task_is_evaluated_over_distinct_held_out_states(reach):
    env, policy = reach
    result = evaluate_policy(env, policy, 6)
    assert result["episodes"] == 6 and result["distinct_initial_states"] == 6
    assert not result["deterministic_reset"]
    assert [e["seed"] for e in result["per_episode"]] == [seeds.TEST_EPISODE_SEED + k for k in range(6)]
    assert result["split"] == "test"
    lo, hi = result["success_ci95"]
    assert lo <= result["success_rate"] <= hi
    assert "over 6 distinct initial states" in describe_eval(result)
    again = evaluate_policy(env, policy, 6)  # the same held-out states every evaluation
    assert [e["initial_state"] for e in again["per_episode"]] == [e["initial_state"] for e in result["per_episode"]]


def test_validation_and_test_are_different_held_out_states(reach):
    """Training's evaluations (and best.pt) use the validation seeds; reports use the test
    seeds, which nothing selects on: the two never share an initial state."""
    env, policy = reach
    val = evaluate_policy(env, policy, 5, split="validation")
    test = evaluate_policy(env, policy, 5)
    assert [e["seed"] for e in val["per_episode"]] == [seeds.VALIDATION_EPISODE_SEED + k for k in range(5)]
    assert not {e["initial_state"] for e in val["per_episode"]} & {e["initial_state"] for e in test["per_episode"]}
    assert seeds.VALIDATION_EPISODE_SEED + 10**8 < seeds.TEST_EPISODE_SEED  # room for any evaluation's episodes
    with pytest.raises(ValueError, match="validation .* or test"):
        seeds.episode_seed("train")


def test_a_deterministic_reset_is_one_trial_and_said_so(reach):
    env, policy = reach
    reset = env.reset
    env.reset = lambda seed=None, options=None: reset(seed=0)  # a task that ignores the seed
    result = evaluate_policy(env, policy, 20)
    assert result["deterministic_reset"] and result["episodes"] == 1 and result["distinct_initial_states"] == 1
    assert result["success_ci95"] == list(wilson(result["successes"], 1))
    assert "1 trial: the reset is deterministic" in describe_eval(result)


def test_episodes_side_by_side_on_several_envs_are_the_same_episodes_in_batched_calls():
    """eval_envs: episode k still resets with seed + k (on whichever env is free) and its
    result is the one-env evaluation's; the policy is called once per step for all envs."""
    cfg = compose_config(["env.max_episode_steps=7"], sim="reach")
    envs = [make_env(cfg.env, seed=i) for i in range(3)]
    policy = build_policy(cfg.policy, EnvSpec.of_env(envs[0]))
    for env in envs:  # a render that shows the step within the episode
        env.render = lambda env=env: np.full((2, 2, 3), env.t, np.uint8)
        env.reset = lambda seed=None, options=None, env=env, reset=env.reset: (setattr(env, "t", 0), reset(seed=seed))[1]
        env.step = lambda a, env=env, step=env.step: (setattr(env, "t", env.t + 1), step(a))[1]
    one = evaluate_policy(envs[0], policy, 8, video_episodes=2)
    sizes = []
    act = policy.act
    policy.act = lambda obs, **kw: sizes.append(len(obs["state"])) or act(obs, **kw)
    side = evaluate_policy(envs, policy, 8, video_episodes=2)
    for a, b in zip(one["per_episode"], side["per_episode"], strict=True):
        assert (a["seed"], a["initial_state"], a["length"], a["success"]) == (b["seed"], b["initial_state"], b["length"], b["success"])
        assert a["return"] == pytest.approx(b["return"], rel=1e-5, abs=1e-6)
    assert side["episodes"] == 8 and side["distinct_initial_states"] == 8
    assert max(sizes) == 3 and sum(sizes) == 8 * 7  # one call per step for every env, 8 x 7 steps in all
    assert len(sizes) < 8 * 7 / 2
    shown = [int(f[0, 0, 0]) for f in side["frames"]]
    assert shown == [int(f[0, 0, 0]) for f in one["frames"]] == [*range(7), *range(7)]  # the first two episodes, in order
    reset = envs[1].reset
    envs[1].reset = lambda seed=None, options=None: reset(seed=0)  # episode 1 starts on env 1
    envs[0].reset = envs[1].reset
    det = evaluate_policy(envs, policy, 8)
    assert det["deterministic_reset"] and det["episodes"] == 1
    for env in envs:
        env.close()


def test_a_served_policy_that_reconnects_reruns_the_episodes_in_flight_and_one_that_is_gone_keeps_the_finished(reach):
    """EpisodeInterrupted (the server came back): every episode in flight is listed as
    interrupted and runs again from its initial state; PolicyUnavailable: the evaluation stops
    with the episodes it finished, marked incomplete."""
    from rlinf_user.evaluation import EvaluationStopped
    from rlinf_user.policies.base import EpisodeInterrupted, PolicyUnavailable

    env, policy = reach
    clean = evaluate_policy(env, policy, 4)
    calls, act = [0], policy.act

    def flaky(obs, **kw):
        calls[0] += 1
        if calls[0] in (7, 8):  # episode 1, two steps in (episodes last 5 steps); then again at once
            raise EpisodeInterrupted("the server restarted")
        return act(obs, **kw)

    policy.act = flaky
    result = evaluate_policy(env, policy, 4)
    assert [r["episode"] for r in result["interrupted"]] == [1, 1] and result["interrupted"][0]["length"] == 1
    assert result["complete"] and result["episodes"] == 4
    for a, b in zip(clean["per_episode"], result["per_episode"], strict=True):  # the same episodes, in full
        assert (a["seed"], a["initial_state"], a["length"]) == (b["seed"], b["initial_state"], b["length"])
    def gone_after_12(obs, **kw):
        calls[0] += 1
        if calls[0] > 12:  # two episodes of 5 steps finished, the third in flight
            raise PolicyUnavailable("gone")
        return act(obs, **kw)

    def restarting_forever(obs, **kw):
        raise EpisodeInterrupted("restarting forever")

    calls[0] = 0
    policy.act = gone_after_12
    with pytest.raises(EvaluationStopped, match="gone") as stop:
        evaluate_policy(env, policy, 4)
    assert stop.value.result["complete"] is False and stop.value.result["episodes"] == 2
    assert stop.value.result["stopped"] == "gone" and [r["episode"] for r in stop.value.result["per_episode"]] == [0, 1]
    policy.act = restarting_forever
    with pytest.raises(EvaluationStopped, match="episode 0 was interrupted 4 times"):
        evaluate_policy(env, policy, 4)


def test_eval_envs_is_checked():
    from rlinf_user.evaluation import eval_env_count

    sim, robot = compose_config([], sim="reach").env, compose_config(["env.edge.host=127.0.0.1"], robot="franka").env
    assert eval_env_count(sim, 25, 50) == 25 and eval_env_count(sim, 25, 4) == 4 and eval_env_count(sim, None, 9) == 1
    assert eval_env_count(robot, 25, 50) == 1  # a fleet's robot member too, whatever the run's setting
    with pytest.raises(ConfigError, match="eval_envs=0"):
        validate(compose_config(["eval_envs=0"], sim="reach"))
    with pytest.raises(ConfigError, match="1 on a robot"):
        validate(compose_config(["eval_envs=4", "env.edge.host=127.0.0.1"], robot="franka"))


def test_training_streams_never_reach_the_held_out_seeds():
    top = seeds.MAX_RUN_SEED - 1
    highest_worker_env = seeds.worker_seed(top, 1023, generation=99) + seeds.ENV_IN_BATCH_STRIDE * 4096
    assert highest_worker_env < seeds.VALIDATION_EPISODE_SEED
    assert top + seeds.DEMO_EPISODE_OFFSET + 1_000_000 < seeds.VALIDATION_EPISODE_SEED
    teleop = [seeds.teleop_episode_seed(s, k) for s in (0, 1, top) for k in (0, 999, 10**6)]
    assert max(teleop) < seeds.VALIDATION_EPISODE_SEED
    # each run seed records its own scenes: seed 0 from 0 (as before), seed s from s x 1000
    assert seeds.teleop_episode_seed(0, 5) == 5 and seeds.teleop_episode_seed(1, 0) == 1000
    assert not {seeds.teleop_episode_seed(0, k) for k in range(20)} & {seeds.teleop_episode_seed(1, k) for k in range(20)}
    assert seeds.eval_worker_seed(top) < seeds.VALIDATION_EPISODE_SEED
    groups = [seeds.group_seed(s, w, g, e) for s in (0, top) for w in (0, 999) for g in (0, 10**6) for e in (0, 10**7)]
    assert max(groups) < seeds.VALIDATION_EPISODE_SEED
    with pytest.raises(ConfigError, match="held-out range"):
        validate(compose_config([f"seed={seeds.MAX_RUN_SEED}"], sim="reach"))
