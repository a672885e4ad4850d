"""robosuite 1.5 (and RoboCasa) backend.

robosuite pins numpy<2, so it runs in its own virtualenv built by
``scripts/install_robosuite_env.sh`` (``.venv-robosuite``). This module imports neither
torch nor robosuite at import time.

Action mapping. The robot's default composite controller drives the arm with
``OSC_POSE`` in delta mode, ``input_ref_frame="base"``: ``[dx, dy, dz, drx, dry, drz]`` in
[-1, 1] scaled to ``output_max`` (0.05 m, 0.5 rad in robosuite 1.5.2), translation in
the robot base frame and axis-angle rotation about base-aligned axes applied to the
end-effector orientation: the contract's ``"base"`` frame. robosuite's gripper action is
-1 open / +1 close (moving by a fixed speed each step), the contract's sign, so it passes
through (a gripper with several action dims gets it on each; a robot without one ignores
it and says so in ``ActionSpec.active``). Mobile robots (RoboCasa's PandaOmron) keep
their base still (arm mode).

Observation. ``state`` = ``robot0_proprio-state`` followed by ``object-state``; with
cameras the object state is left out unless ``kwargs.privileged_state=True``. Images are
robosuite's ``<camera>_image`` turned upright. Timestamps are simulated time
(``env.cur_time``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlinf_user.env.base import ContractEnv
from rlinf_user.env.contract import ActionSpec, make_observation

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "robosuite lives in its own virtualenv (it pins numpy<2): run "
    "`bash scripts/install_robosuite_env.sh` and use .venv-robosuite/bin/python"
)
ROBOCASA_HINT = (
    "RoboCasa is not installed in this environment; install it into .venv-robosuite: "
    "`git clone https://github.com/robocasa/robocasa && .venv-robosuite/bin/pip install -e "
    "robocasa && .venv-robosuite/bin/python robocasa/robocasa/scripts/download_kitchen_assets.py`"
)


def _import_robosuite() -> Any:
    os.environ.setdefault("MUJOCO_GL", "egl" if not os.environ.get("DISPLAY") else "glfw")
    try:
        import robosuite
    except ImportError as e:
        raise ImportError(f"robosuite is not importable here. {INSTALL_HINT}") from e
    return robosuite


def robocasa_available() -> bool:
    """True when ``import robocasa`` works (it registers the kitchen tasks)."""
    try:
        import robocasa  # noqa: F401
    except ImportError:
        return False
    return True


def robocasa_tasks() -> list[str]:
    """Kitchen task names from RoboCasa's registry (empty without RoboCasa)."""
    if not robocasa_available():
        return []
    from robocasa.environments import ALL_KITCHEN_ENVIRONMENTS

    return sorted(n for n in ALL_KITCHEN_ENVIRONMENTS if n != "Kitchen")


def robosuite_tasks() -> list[str]:
    """robosuite's own single-arm task names (two-arm tasks do not fit the 7-D contract)."""
    _import_robosuite()
    from robosuite.environments.base import REGISTERED_ENVS

    return sorted(
        name
        for name, cls in REGISTERED_ENVS.items()
        if cls.__module__.startswith("robosuite.") and not name.startswith("TwoArm")
    )


def resolve_task(task: str) -> tuple[str, bool]:
    """Return ``(task, is_robocasa)`` or raise ``ValueError``/``ImportError`` clearly."""
    _import_robosuite()
    if task.startswith("TwoArm"):
        raise ValueError(f"{task} needs two arms; the 7-D contract drives one")
    if task in robosuite_tasks():
        return task, False
    casa = robocasa_tasks()
    if task in casa:
        return task, True
    if not robocasa_available():
        raise ImportError(
            f"robosuite task {task!r} not found (robosuite has: {', '.join(robosuite_tasks())}); "
            f"if it is a RoboCasa kitchen task: {ROBOCASA_HINT}"
        )
    raise ValueError(
        f"task {task!r} is neither a robosuite task ({', '.join(robosuite_tasks())}) nor a "
        f"RoboCasa task ({', '.join(casa)})"
    )


class RobosuiteEnv(ContractEnv):
    """A single-arm robosuite or RoboCasa task under the env contract.

    Success terminates the episode; ``max_episode_steps`` truncates (robosuite's own
    horizon is disabled with ``ignore_done``).
    """

    def __init__(
        self,
        task: str = "Lift",
        *,
        cameras: Sequence[str] = (),
        image_size: int = 128,
        reward: str = "dense",
        max_episode_steps: int = 200,
        control_hz: float = 20.0,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        robosuite = _import_robosuite()
        task, is_casa = resolve_task(task)
        if reward not in ("dense", "sparse"):
            raise ValueError(f"reward must be dense or sparse, got {reward!r}")
        self.task = task
        self.cameras = tuple(cameras)
        self.max_episode_steps = int(max_episode_steps)
        privileged = bool(kwargs.pop("privileged_state", False))
        robot = kwargs.pop("robots", "PandaOmron" if is_casa else "Panda")
        size = int(image_size)
        make_kwargs: dict[str, Any] = dict(
            robots=robot,
            controller_configs=kwargs.pop("controller_configs", None)
            or robosuite.load_composite_controller_config(robot=robot),
            has_renderer=False,
            has_offscreen_renderer=bool(self.cameras),
            use_camera_obs=bool(self.cameras),
            use_object_obs=privileged or not self.cameras,
            reward_shaping=reward == "dense",
            control_freq=float(control_hz),
            horizon=max(self.max_episode_steps, 1) * 10,
            ignore_done=True,
            hard_reset=False,
            seed=seed,
        )
        if self.cameras:
            make_kwargs.update(
                camera_names=list(self.cameras), camera_heights=size, camera_widths=size
            )
        make_kwargs.update(kwargs)
        logger.info("robosuite %s: robot=%s cameras=%s", task, robot, list(self.cameras))
        self._env = robosuite.make(task, **make_kwargs)
        self._check_arm_controller()
        self._opengl_images = robosuite.macros.IMAGE_CONVENTION == "opengl"
        self._pending_seed = seed
        raw = self._env.reset()
        self._init_spaces(self._flat_state(raw).shape[0], {c: (size, size) for c in self.cameras})

    @classmethod
    def from_config(cls, cfg: Any, seed: int | None = None) -> RobosuiteEnv:
        """Build from an ``EnvConfig``; ``cfg.kwargs`` go to ``robosuite.make`` (plus
        ``privileged_state``); ``cfg.control_hz`` sets robosuite's ``control_freq``."""
        return cls(
            cfg.task,
            cameras=list(cfg.cameras or ()),
            image_size=int(cfg.image_size),
            reward=cfg.reward,
            max_episode_steps=int(cfg.max_episode_steps),
            control_hz=float(cfg.control_hz),
            seed=seed,
            **dict(cfg.kwargs or {}),
        )

    @property
    def base_env(self) -> Any:
        """The underlying robosuite env (for inspection and tests)."""
        return self._env

    @property
    def _robot(self) -> Any:
        return self._env.robots[0]

    def _check_arm_controller(self) -> None:
        robot = self._robot
        self._arm = robot.arms[0]
        ctrl = robot.part_controllers[self._arm]
        osc = type(ctrl).__name__ == "OperationalSpaceController"
        if not osc or ctrl.input_type != "delta" or ctrl.control_dim != 6:
            raise ValueError(f"arm controller must be OSC_POSE in delta mode, got {ctrl}")
        if ctrl.input_ref_frame != "base":
            raise ValueError(f"OSC input_ref_frame must be 'base', got {ctrl.input_ref_frame!r}")
        # robosuite's Controller.scale_action: |a| = 1 (input_max) -> output_max
        out_range = np.abs(np.asarray(ctrl.output_max) - np.asarray(ctrl.output_min))
        scale = out_range / np.abs(np.asarray(ctrl.input_max) - np.asarray(ctrl.input_min))
        split = robot.composite_controller._action_split_indexes
        start, end = split.get(f"{self._arm}_gripper", (0, 0))
        self._gripper_dims = end - start
        self.action_spec = ActionSpec(
            frame="base",
            max_translation=float(scale[:3].min()),
            max_rotation=float(scale[3:].min()),
            active=(True,) * 6 + (self._gripper_dims > 0,),
        )

    def _flat_state(self, raw: dict[str, Any]) -> np.ndarray:
        parts = [np.asarray(raw["robot0_proprio-state"], dtype=np.float32).reshape(-1)]
        if "object-state" in raw:
            parts.append(np.asarray(raw["object-state"], dtype=np.float32).reshape(-1))
        return np.concatenate(parts)

    def _observation(self, raw: dict[str, Any]) -> dict[str, Any]:
        images = {}
        for name in self.cameras:
            img = np.asarray(raw[f"{name}_image"])
            images[name] = img[::-1] if self._opengl_images else img
        return make_observation(self._flat_state(raw), images, stamp=float(self._env.cur_time))

    def _reset(self, seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        if seed is not None:
            # Re-seed in place: robosuite's samplers hold a reference to env.rng.
            self._env.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
        raw = self._env.reset()
        return self._observation(raw), {"success": bool(self._env._check_success())}

    def _step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        controller = self._robot.composite_controller
        parts = {self._arm: action[:6].astype(np.float64)}
        if self._gripper_dims:  # multi-dof grippers get the same open/close command
            parts[f"{self._arm}_gripper"] = np.full(self._gripper_dims, float(action[6]))
        native = controller.create_action_vector(parts)
        raw, reward, _, info = self._env.step(native)
        success = bool(self._env._check_success())
        out = {k: v for k, v in dict(info).items() if np.isscalar(v)}
        out["success"] = success
        return self._observation(raw), float(reward), success, out

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()
