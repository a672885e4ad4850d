"""Backend-independent checks of the env contract, shared by the contract test modules.

Each check takes a built :class:`~rlinf_user.env.base.ContractEnv` and, where it needs to
look inside the simulator, a *probe*: a function reading the backend's own state (TCP
position / orientation in the robot base frame, finger opening). No simulator is mocked.
This module holds no tests itself; it imports only numpy, gymnasium and rlinf_user.env.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.utils import env_checker, passive_env_checker

from rlinf_user.env.contract import ContractError, validate_observation, validate_step

Probe = Callable[[Any], Any]


def gym_check_env(env: Any) -> None:
    """``gymnasium.utils.env_checker.check_env(env, skip_render_check=True)``.

    The contract's observation space holds ``"images": Dict({})`` for an env without
    cameras, and gymnasium's checker refuses *empty* Dict spaces outright. For such envs
    this runs the same sequence of gymnasium checks that ``check_env`` runs, checking the
    observation space per non-empty sub-space instead of refusing the empty one.
    """
    if len(env.observation_space["images"].spaces):
        env_checker.check_env(env, skip_render_check=True)
        return
    passive_env_checker.check_action_space(env.action_space)
    env_checker.check_space_limit(env.action_space, "action")
    for sub in env.observation_space.spaces.values():
        if not hasattr(sub, "spaces") or len(sub.spaces):
            passive_env_checker.check_observation_space(sub)
    env_checker.check_space_limit(env.observation_space, "observation")
    env_checker.check_seed_deprecation(env)
    env_checker.check_reset_return_info_deprecation(env)
    env_checker.check_reset_return_type(env)
    env_checker.check_reset_seed_determinism(env)
    env_checker.check_reset_options(env)
    passive_env_checker.env_reset_passive_checker(env)
    passive_env_checker.env_step_passive_checker(env, env.action_space.sample())
    env_checker.check_step_determinism(env)
    env_checker.check_returned_data_not_reused(env)


def check_rollout(env: Any, steps: int, seed: int = 0) -> None:
    """Reset and random steps: every output validates, flags are exclusive bools."""
    obs, info = env.reset(seed=seed)
    validate_observation(obs, env.observation_space)
    assert type(info["success"]) is bool
    rng = np.random.default_rng(seed)
    last_stamp = float(obs["timestamps"]["state"])
    for _ in range(steps):
        result = env.step(rng.uniform(-1, 1, 7).astype(np.float32))
        validate_step(result, env.observation_space)
        obs, reward, terminated, truncated, info = result
        assert type(info["success"]) is bool, type(info["success"])
        assert type(terminated) is bool and type(truncated) is bool
        assert not (terminated and truncated)
        assert isinstance(reward, float)
        stamp = float(obs["timestamps"]["state"])
        assert stamp > last_stamp, "simulated time must advance every step"
        last_stamp = stamp
        if terminated or truncated:
            obs, info = env.reset()
            last_stamp = float(obs["timestamps"]["state"])


def check_bad_actions_refused(env: Any) -> None:
    """NaN/Inf or a wrong shape raise ContractError before touching the simulator."""
    env.reset(seed=1)
    for bad in ([np.nan] + [0.0] * 6, [0.0] * 6 + [np.inf], [0.0] * 6):
        try:
            env.step(np.asarray(bad, dtype=np.float32))
        except ContractError:
            continue
        raise AssertionError(f"action {bad} was accepted")


def check_clipping(env: Any, seed: int = 2) -> None:
    """Out-of-range actions act exactly like the clipped action (and do not crash)."""
    big = np.asarray([5.0, -7.0, 3.0, 0.0, 0.0, 0.0, 9.0], dtype=np.float32)
    env.reset(seed=seed)
    obs_big = env.step(big)[0]
    env.reset(seed=seed)
    obs_clip = env.step(np.clip(big, -1, 1))[0]
    validate_observation(obs_big, env.observation_space)
    np.testing.assert_allclose(obs_big["state"], obs_clip["state"], rtol=1e-5, atol=1e-6)


def check_truncation(env: Any) -> None:
    """A still robot is truncated exactly at ``max_episode_steps``, never terminated too."""
    env.reset(seed=3)
    still = np.zeros(7, dtype=np.float32)
    still[6] = -1.0  # hold the gripper open
    for t in range(1, env.max_episode_steps + 1):
        _, _, terminated, truncated, info = env.step(still)
        assert not terminated, f"a still robot terminated at step {t}: {info}"
        assert truncated == (t == env.max_episode_steps), (t, truncated)


def check_gripper_sign(env: Any, opening: Probe, steps: int = 8) -> None:
    """Contract +1 closes the fingers and -1 opens them, measured in the simulator."""
    env.reset(seed=4)
    action = np.zeros(7, dtype=np.float32)
    action[6] = -1.0
    for _ in range(steps):
        env.step(action)
    opened = opening(env)
    action[6] = 1.0
    for _ in range(steps):
        env.step(action)
    closed = opening(env)
    assert closed < opened - 0.01, f"+1 should close: opening {opened:.4f} -> {closed:.4f}"
    action[6] = -1.0
    for _ in range(steps):
        env.step(action)
    reopened = opening(env)
    assert reopened > closed + 0.01, f"-1 should open: opening {closed:.4f} -> {reopened:.4f}"


def check_translation(env: Any, tcp_position: Probe, steps: int = 3) -> None:
    """``+1`` on dx / dy / dz moves the TCP along +x / +y / +z of the base frame."""
    for axis in range(3):
        env.reset(seed=5)
        before = np.asarray(tcp_position(env), dtype=np.float64)
        action = np.zeros(7, dtype=np.float32)
        action[axis] = 1.0
        for _ in range(steps):
            env.step(action)
        delta = np.asarray(tcp_position(env), dtype=np.float64) - before
        others = np.delete(np.abs(delta), axis)
        expected = steps * env.action_spec.max_translation
        assert delta[axis] > 0.25 * expected, f"axis {axis}: moved {delta} (asked {expected})"
        assert delta[axis] > 3 * others.max(), f"axis {axis}: moved {delta}"


def check_rotation(env: Any, tcp_rotation: Probe, steps: int = 3) -> None:
    """``+1`` on drx / dry / drz turns the TCP positively about base x / y / z."""
    from scipy.spatial.transform import Rotation

    for axis in range(3):
        env.reset(seed=6)
        before = np.asarray(tcp_rotation(env), dtype=np.float64)
        action = np.zeros(7, dtype=np.float32)
        action[3 + axis] = 1.0
        for _ in range(steps):
            env.step(action)
        after = np.asarray(tcp_rotation(env), dtype=np.float64)
        rotvec = Rotation.from_matrix(after @ before.T).as_rotvec()  # in the base frame
        others = np.delete(np.abs(rotvec), axis)
        assert rotvec[axis] > 0.05, f"axis {axis}: rotation vector {rotvec}"
        assert rotvec[axis] > 2 * others.max(), f"axis {axis}: rotation vector {rotvec}"
