"""The env contract, checked against every simulator backend installed here.

Each case builds its env once per module (ManiSkill env creation takes seconds). Backends
whose package is missing are skipped. robosuite runs in its own virtualenv:
see ``test_robosuite_contract.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from contract_checks import (
    check_bad_actions_refused,
    check_clipping,
    check_gripper_sign,
    check_rollout,
    check_rotation,
    check_translation,
    check_truncation,
    gym_check_env,
)

from rlinf_user.config.schema import EnvConfig
from rlinf_user.env.registry import make_env

MAX_STEPS = 10


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    package: str  # importorskip'd before building
    cfg: dict[str, Any]


CASES = [
    Case("maniskill-PickCube", "mani_skill", dict(backend="maniskill", task="PickCube-v1")),
    Case("maniskill-PushCube", "mani_skill", dict(backend="maniskill", task="PushCube-v1")),
    Case(
        "maniskill-PegInsertionSide",
        "mani_skill",
        dict(backend="maniskill", task="PegInsertionSide-v1"),
    ),
    Case(
        "maniskill-PickCube-rgb64",
        "mani_skill",
        dict(backend="maniskill", task="PickCube-v1", cameras=["base_camera"], image_size=64),
    ),
    Case("gym_hil-PandaPickCube", "gym_hil", dict(backend="gym_hil", task="PandaPickCube")),
    Case("reach", "numpy", dict(backend="reach", task="Reach")),
    Case("reach-color", "numpy", dict(backend="reach", task="ReachColor", cameras=["top"], kwargs={"image_size": 32})),
]


# ---- probes: read the simulator's own state, in the robot base frame -------------------


def _quat_wxyz_to_matrix(q: np.ndarray) -> np.ndarray:
    w, x, y, z = (float(v) for v in q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def _maniskill_tcp_in_base(env: Any) -> Any:
    agent = env.base_env.agent
    return agent.robot.pose.inv() * agent.tcp.pose


def _maniskill_opening(env: Any) -> float:
    robot = env.base_env.agent.robot
    names = [j.name for j in robot.get_active_joints()]
    qpos = robot.get_qpos()[0].cpu().numpy()
    return float(sum(qpos[names.index(n)] for n in names if "finger" in n))


def _gym_hil_base(env: Any) -> tuple[np.ndarray, np.ndarray]:
    body = env.base_env.data.body("link0")
    return np.asarray(body.xpos), np.asarray(body.xmat).reshape(3, 3)


def _gym_hil_tcp(env: Any) -> np.ndarray:
    origin, rot = _gym_hil_base(env)
    return rot.T @ (np.asarray(env.base_env.data.sensor("2f85/pinch_pos").data) - origin)


def _gym_hil_opening(env: Any) -> float:
    data = env.base_env.data
    return float(np.linalg.norm(data.body("left_pad").xpos - data.body("right_pad").xpos))


PROBES = {
    "maniskill": dict(
        tcp=lambda env: _maniskill_tcp_in_base(env).p[0].cpu().numpy(),
        rot=lambda env: _quat_wxyz_to_matrix(_maniskill_tcp_in_base(env).q[0].cpu().numpy()),
        opening=_maniskill_opening,
    ),
    "gym_hil": dict(tcp=_gym_hil_tcp, rot=None, opening=_gym_hil_opening),
    "reach": dict(tcp=lambda env: env.tcp, rot=None, opening=None),
}


# ---- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.id)
def case(request: pytest.FixtureRequest) -> Any:
    c: Case = request.param
    pytest.importorskip(c.package)
    env = make_env(EnvConfig(max_episode_steps=MAX_STEPS, **c.cfg), seed=0)
    yield c, env
    env.close()


@pytest.fixture
def env(case: Any) -> Any:
    return case[1]


# ---- tests ------------------------------------------------------------------------------


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


def test_gripper_plus_one_closes(case: Any) -> None:
    c, env = case
    if not env.action_spec.active[6]:
        pytest.skip(f"{c.id} has no gripper")
    check_gripper_sign(env, PROBES[c.cfg["backend"]]["opening"])


def test_translation_moves_tcp_in_base_frame(case: Any) -> None:
    c, env = case
    check_translation(env, PROBES[c.cfg["backend"]]["tcp"])


def test_rotation_turns_tcp_about_base_axes(case: Any) -> None:
    c, env = case
    if not all(env.action_spec.active[3:6]):
        pytest.skip(f"{c.id} declares rotation inactive")
    check_rotation(env, PROBES[c.cfg["backend"]]["rot"])


def test_action_spec_declares_frame_and_limits(env: Any) -> None:
    spec = env.action_spec
    assert spec.frame == "base"
    assert spec.max_translation > 0
    assert all(spec.active[:3])
