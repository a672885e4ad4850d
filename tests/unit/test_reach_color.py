"""ReachColor: the goal is known only from the camera and the instruction."""

import numpy as np
import pytest

from rlinf_user.config.compose import compose_config
from rlinf_user.env.registry import make_env, validate_env_config
from rlinf_user.sims.reach import COLORS, ReachEnv


def env(**kw):
    return make_env(compose_config([f"env.kwargs.{k}={v}" for k, v in kw.items()], sim="reach_color").env, seed=0)


def test_the_instruction_names_the_colour_drawn_at_the_goal_and_the_state_hides_it():
    e = env()
    names = set()
    for seed in range(20):
        obs, _ = e.reset(seed=seed)
        u = e.unwrapped
        assert obs["state"].shape == (3,) and np.allclose(obs["state"], u.tcp)  # the TCP only
        colour = obs["instruction"].removeprefix("reach the ").removesuffix(" target")
        names.add(colour)
        r, c = (int(v) for v in u._pixels(u.goal))
        assert tuple(obs["images"]["top"][r, c]) == COLORS[colour]  # the goal is drawn in the named colour
        other = [p for p in u._targets if not np.allclose(p, u.goal)][0]
        r2, c2 = (int(v) for v in u._pixels(other))
        assert tuple(obs["images"]["top"][r2, c2]) != COLORS[colour]  # the distractor is another colour
        tr, tc = (int(v) for v in u._pixels(u.tcp))
        assert tuple(obs["images"]["top"][tr, tc]) == (255, 255, 255)  # the TCP's cross
    assert len(names) >= 3  # colours vary between episodes


def test_a_scripted_expert_with_the_goal_succeeds_and_the_step_keeps_the_instruction():
    e = env()
    wins = 0
    for seed in range(10):
        obs, _ = e.reset(seed=100 + seed)
        text = obs["instruction"]
        for _ in range(40):
            a = np.zeros(7, np.float32)
            a[:3] = np.clip((e.unwrapped.goal - obs["state"]) / 0.02, -1, 1)
            obs, _, term, trunc, info = e.step(a)
            assert obs["instruction"] == text
            if term or trunc:
                break
        wins += info["success"]
    assert wins == 10


def test_bad_reach_color_configs_are_refused():
    with pytest.raises(ValueError, match="one camera, top"):
        ReachEnv("ReachColor", cameras=["front"])
    with pytest.raises(ValueError, match="writes its own instruction"):
        validate_env_config(compose_config(["env.instruction=go"], sim="reach_color").env)
    with pytest.raises(ValueError, match="16..512"):
        ReachEnv("ReachColor", image_size=8)
