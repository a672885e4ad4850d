"""robosuite contract checks. Not collected by default (no ``test_`` prefix): robosuite
needs its own virtualenv, and ``test_robosuite_contract.py`` runs this module there with
``.venv-robosuite/bin/python -m pytest``. Run it directly the same way."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("robosuite")

from contract_checks import (  # noqa: E402
    check_bad_actions_refused,
    check_clipping,
    check_gripper_sign,
    check_rollout,
    check_rotation,
    check_translation,
    check_truncation,
    gym_check_env,
)

from rlinf_user.config.schema import EnvConfig  # noqa: E402
from rlinf_user.env.registry import make_env  # noqa: E402
from rlinf_user.sims.robosuite import robocasa_available  # noqa: E402

MAX_STEPS = 10
CASES = {
    "Lift": dict(task="Lift"),
    "Lift-agentview64": dict(task="Lift", cameras=["agentview"], image_size=64),
}


def _base_frame(env: Any) -> tuple[np.ndarray, np.ndarray]:
    sim = env.base_env.sim
    body = sim.model.body_name2id(env.base_env.robots[0].robot_model.root_body)
    return np.array(sim.data.body_xpos[body]), np.array(sim.data.body_xmat[body]).reshape(3, 3)


def _eef_site(env: Any) -> int:
    return env.base_env.robots[0].eef_site_id["right"]


def tcp_position(env: Any) -> np.ndarray:
    origin, rot = _base_frame(env)
    return rot.T @ (np.array(env.base_env.sim.data.site_xpos[_eef_site(env)]) - origin)


def tcp_rotation(env: Any) -> np.ndarray:
    _, rot = _base_frame(env)
    return rot.T @ np.array(env.base_env.sim.data.site_xmat[_eef_site(env)]).reshape(3, 3)


def finger_opening(env: Any) -> float:
    robot = env.base_env.robots[0]
    qpos = env.base_env.sim.data.qpos[robot._ref_gripper_joint_pos_indexes["right"]]
    return float(qpos[0] - qpos[1])


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def env(request: pytest.FixtureRequest) -> Any:
    built = make_env(
        EnvConfig(backend="robosuite", max_episode_steps=MAX_STEPS, **CASES[request.param]),
        seed=0,
    )
    yield built
    built.close()


def test_env_modules_import_without_torch() -> None:
    code = (
        "import sys, rlinf_user.env.contract, rlinf_user.env.base, rlinf_user.env.registry, "
        "rlinf_user.env.vector, rlinf_user.sims.robosuite; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_gymnasium_env_checker(env: Any) -> None:
    gym_check_env(env)


def test_reset_and_step_follow_the_contract(env: Any) -> None:
    check_rollout(env, steps=2 * MAX_STEPS + 3)


def test_nan_and_malformed_actions_raise(env: Any) -> None:
    check_bad_actions_refused(env)


def test_out_of_range_actions_are_clipped(env: Any) -> None:
    check_clipping(env)


def test_truncates_at_max_episode_steps(env: Any) -> None:
    check_truncation(env)


def test_gripper_plus_one_closes(env: Any) -> None:
    check_gripper_sign(env, finger_opening)


def test_translation_moves_tcp_in_base_frame(env: Any) -> None:
    check_translation(env, tcp_position)


def test_rotation_turns_tcp_about_base_axes(env: Any) -> None:
    check_rotation(env, tcp_rotation)


def test_action_spec_matches_osc_pose() -> None:
    built = make_env(EnvConfig(backend="robosuite", task="Lift"))
    try:
        assert built.action_spec.frame == "base"
        assert built.action_spec.max_translation == pytest.approx(0.05)
        assert built.action_spec.max_rotation == pytest.approx(0.5)
    finally:
        built.close()


def test_unknown_task_names_the_choices() -> None:
    with pytest.raises((ValueError, ImportError), match="Lift"):
        make_env(EnvConfig(backend="robosuite", task="NoSuchTask"))


@pytest.mark.skipif(robocasa_available(), reason="RoboCasa is installed")
def test_robocasa_task_without_robocasa_names_the_install() -> None:
    with pytest.raises(ImportError, match="robocasa"):
        make_env(EnvConfig(backend="robosuite", task="PnPCounterToCab"))
