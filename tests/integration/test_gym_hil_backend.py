"""gym_hil-specific behaviour: task/camera errors, camera observations, the second task,
and reproducible seeding of gym_hil's global-numpy block placement."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gym_hil")

from contract_checks import check_rollout  # noqa: E402

from rlinf_user.config.schema import EnvConfig  # noqa: E402
from rlinf_user.env.contract import validate_observation, validate_step  # noqa: E402
from rlinf_user.env.registry import make_env  # noqa: E402


def _cfg(**kw: object) -> EnvConfig:
    return EnvConfig(backend="gym_hil", **{"task": "PandaPickCube", **kw})


def test_unknown_task_and_camera_raise() -> None:
    with pytest.raises(ValueError, match="PandaPickCube"):
        make_env(_cfg(task="PickCube-v1"))
    with pytest.raises(ValueError, match="front"):
        make_env(_cfg(cameras=["base_camera"]))


def test_camera_observations() -> None:
    env = make_env(_cfg(cameras=["front", "wrist"], image_size=32, max_episode_steps=3), seed=0)
    try:
        obs, _ = env.reset()
        validate_observation(obs, env.observation_space)
        assert obs["state"].shape == (18,)  # agent_pos only: no privileged block position
        result = env.step(np.zeros(7, dtype=np.float32))
        validate_step(result, env.observation_space)
        for name in ("front", "wrist"):
            image = result[0]["images"][name]
            assert image.shape == (32, 32, 3) and image.std() > 1.0, name
            assert result[0]["timestamps"][name] == result[0]["timestamps"]["state"]
    finally:
        env.close()


def test_arrange_boxes_follows_the_contract() -> None:
    env = make_env(_cfg(task="PandaArrangeBoxes", max_episode_steps=5), seed=0)
    try:
        check_rollout(env, steps=7)
    finally:
        env.close()


def test_random_block_position_is_seeded_without_touching_global_numpy() -> None:
    env = make_env(_cfg(kwargs={"random_block_position": True}), seed=0)
    try:
        np.random.seed(123)
        expected_global = np.random.random()
        np.random.seed(123)
        block = [env.reset(seed=s)[0]["state"][-3:].copy() for s in (1, 1, 2)]
        assert np.random.random() == expected_global, "reset consumed numpy's global RNG"
        np.testing.assert_array_equal(block[0], block[1])
        assert not np.allclose(block[0], block[2])
    finally:
        env.close()


def test_a_gripper_threshold_drives_the_gripper_as_the_edge_does() -> None:
    """gripper_threshold=0.5: closed above +0.5, open below -0.5, held in between (the
    edge's safety.gripper_threshold), never the half-closed command a continuous -0.4
    gives; a value outside [0, 1) is refused."""

    def command_after(env, values):
        env.reset(seed=0)
        out = []
        for g in values:
            a = np.zeros(7, np.float32)
            a[6] = g
            out.append(round(float(env.step(a)[0]["state"][14]), 2))
        return out

    continuous = make_env(_cfg(), seed=0)
    binary = make_env(_cfg(kwargs={"gripper_threshold": 0.5}), seed=0)
    try:
        assert command_after(continuous, [-0.4]) == [0.3]
        assert command_after(binary, [-0.4, 0.6, 0.2, -0.2, -0.7, 0.3]) == [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
        binary.step(np.r_[np.zeros(6), 1.0].astype(np.float32))
        assert command_after(binary, [0.0]) == [0.0]  # a reset opens it again
    finally:
        continuous.close()
        binary.close()
    with pytest.raises(ValueError, match="gripper_threshold"):
        make_env(_cfg(kwargs={"gripper_threshold": 1.5}))


def test_camera_crops_and_render_size_apply_where_the_env_is_built() -> None:
    """env.crops + env.render_size: the sim renders at 160, the box is cut, every camera is
    resized to image_size; the pixels are crop_resize's (the edge's own camera crop)."""
    from rlinf_user.env.registry import validate_env_config
    from rlinf_user.robots.cameras.base import crop_resize

    crop = [20, 10, 120, 100]
    cropped = make_env(_cfg(cameras=["front", "wrist"], image_size=64, render_size=160, crops={"front": crop}), seed=0)
    full = make_env(_cfg(cameras=["front", "wrist"], image_size=160), seed=0)
    try:
        assert cropped.observation_space["images"]["front"].shape == (64, 64, 3)
        obs, _ = cropped.reset(seed=3)
        ref, _ = full.reset(seed=3)
        np.testing.assert_array_equal(obs["images"]["front"], crop_resize(ref["images"]["front"], tuple(crop), (64, 64)))
        np.testing.assert_array_equal(obs["images"]["wrist"], crop_resize(ref["images"]["wrist"], None, (64, 64)))
        nxt = cropped.step(np.zeros(7, np.float32))[0]
        assert nxt["images"]["front"].shape == (64, 64, 3)
        assert cropped.max_episode_steps == full.max_episode_steps  # the backend's attributes pass through
    finally:
        cropped.close()
        full.close()
    with pytest.raises(ValueError, match="outside the camera's 160x160 frame"):
        make_env(_cfg(cameras=["front"], image_size=64, render_size=160, crops={"front": [100, 0, 100, 100]}))
    for crops, match in (({"side": crop}, "not one of this env's cameras"), ({"front": [0, 0, 4, 4]}, "under 8x8"),
                         ({"front": [0, 0, 10]}, r"\[x, y, w, h\]")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            validate_env_config(_cfg(cameras=["front"], crops=crops))


@pytest.mark.parametrize("task", ["PandaPickCube", "PandaArrangeBoxes"])
def test_the_fast_controller_gives_gym_hil_s_own_torques_to_the_bit(task: str) -> None:
    """The env runs gym_hil's operational-space controller through ``FastOpspace``; the
    same env with gym_hil's own ``apply_action`` must see the same states to the last bit
    over whole episodes of random motion and gripper commands (a grasp and lifts happen),
    and the fast one must be the one in use."""
    kwargs = {"random_block_position": True} if task == "PandaPickCube" else {}
    fast = make_env(_cfg(task=task, max_episode_steps=40, kwargs=kwargs), seed=0)
    ref = make_env(_cfg(task=task, max_episode_steps=40, kwargs=kwargs), seed=0)
    try:
        assert "apply_action" in vars(fast.base_env)  # the fast controller is installed
        del ref.base_env.apply_action  # back to gym_hil's own method
        assert "apply_action" not in vars(ref.base_env)
        rng = np.random.default_rng(0)
        for episode in range(2):
            a, _ = fast.reset(seed=episode)
            b, _ = ref.reset(seed=episode)
            np.testing.assert_array_equal(a["state"], b["state"])
            for _ in range(40):
                action = rng.uniform(-1, 1, 7).astype(np.float32)
                a, ra, ta, tra, _ = fast.step(action)
                b, rb, tb, trb, _ = ref.step(action)
                np.testing.assert_array_equal(a["state"], b["state"])
                assert (ra, ta, tra) == (rb, tb, trb)
                if ta or tra:
                    break
    finally:
        fast.close()
        ref.close()
