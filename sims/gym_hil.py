"""gym_hil backend: the MuJoCo Franka tasks LeRobot's HIL-SERL trains on.

Wraps gym_hil's *base* envs (``gym_hil/PandaPickCubeBase-v0``,
``gym_hil/PandaArrangeBoxesBase-v0``), not its teleoperation wrappers.

Action mapping. The base env's 7-D action is ``[x, y, z, rx, ry, rz, grasp]`` where
``x, y, z`` are *metres* added to the mocap target of an operational-space controller
(world frame = robot base frame: ``link0`` sits at the origin, unrotated), clipped to the
task's Cartesian bounds; ``rx, ry, rz`` are ignored (orientation is held); ``grasp`` is a
*change* of the normalised Robotiq 2F-85 command (0 open .. 1 closed). The contract
translation is scaled by ``ee_step_size`` (default 0.025 m, gym_hil's
``DEFAULT_EE_STEP_SIZE``); rotation dims are inactive; the contract's absolute gripper
(-1 open, +1 closed) becomes the delta that reaches the command ``(g + 1) / 2``. With
``gripper_threshold`` (``env.kwargs.gripper_threshold=0.5``) the gripper is driven as the
edge daemon drives a real one (``safety.gripper_threshold``): fully closed once ``g`` is
above the threshold, fully open below minus it, held in between. A continuous command
lets a policy drift to a half-closed gripper that cannot pass around the block.

Observation. ``state`` = gym_hil's ``agent_pos`` (joint qpos 7, qvel 7, gripper command
scaled to [0, 1], TCP position 3) followed, for state-only envs, by ``environment_state``
(block position). Cameras ("front", "wrist") come from gym_hil's ``image_obs``; an env
with cameras observes no block position (:attr:`GymHilEnv.block_position` gives it to a
scripted supervisor, as a person sees the scene). ``render_shadows=false`` and
``render_samples=0`` make its cameras render about 8 times faster on a CPU.
Timestamps are MuJoCo's simulated time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_user.env.base import ContractEnv
from rlinf_user.env.contract import ActionSpec, make_observation
from rlinf_user.sims.gym_hil_control import use_fast_control

logger = logging.getLogger(__name__)

TASKS: dict[str, str] = {
    "PandaPickCube": "gym_hil/PandaPickCubeBase-v0",
    "PandaArrangeBoxes": "gym_hil/PandaArrangeBoxesBase-v0",
}
CAMERAS = ("front", "wrist")
DEFAULT_EE_STEP = 0.025  # gym_hil.wrappers.hil_wrappers.DEFAULT_EE_STEP_SIZE
_GRIPPER_INDEX = 14  # agent_pos = qpos(7), qvel(7), gripper command(1), tcp_pos(3)
_MAX_GRIPPER_COMMAND = 255.0


def resolve_task(task: str) -> str:
    """Our task name (or a gym_hil base env id) -> gym_hil env id."""
    if task in TASKS:
        return TASKS[task]
    if task in TASKS.values():
        return task
    raise ValueError(
        f"gym_hil task {task!r} is not supported; supported: {', '.join(TASKS)} "
        f"(or their ids {', '.join(TASKS.values())})"
    )


def ensure_mujoco_gl() -> None:
    """Select headless EGL rendering for MuJoCo when no display is set.

    gym_hil creates a ``mujoco.Renderer`` even for state observations, and MuJoCo picks
    its GL backend from ``MUJOCO_GL`` when it is first imported.
    """
    if os.environ.get("MUJOCO_GL") or os.environ.get("DISPLAY"):
        return
    if "mujoco" in sys.modules:
        logger.warning(
            "mujoco was imported before MUJOCO_GL was set; headless rendering may fail. "
            "Set MUJOCO_GL=egl before starting Python."
        )
    os.environ["MUJOCO_GL"] = "egl"


@contextlib.contextmanager
def _global_numpy_seed(seed: int) -> Iterator[None]:
    """Seed numpy's global RNG for a block, then restore it (gym_hil samples from it)."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(saved)


class GymHilEnv(ContractEnv):
    """A gym_hil MuJoCo Franka task under the env contract.

    ``terminated`` follows gym_hil (success, or the block pushed out of bounds).
    """

    def __init__(
        self,
        task: str = "PandaPickCube",
        *,
        cameras: Sequence[str] = (),
        image_size: int = 128,
        reward: str = "dense",
        max_episode_steps: int = 100,
        control_hz: float = 10.0,
        seed: int | None = None,
        ee_step_size: float = DEFAULT_EE_STEP,
        gripper_threshold: float | None = None,
        render_shadows: bool = True,
        render_samples: int | None = None,
        **kwargs: Any,
    ) -> None:
        env_id = resolve_task(task)
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"gym_hil camera(s) {unknown} unknown; available: {list(CAMERAS)}")
        if reward not in ("dense", "sparse"):
            raise ValueError(f"reward must be dense or sparse, got {reward!r}")
        ensure_mujoco_gl()
        try:
            import gym_hil  # noqa: F401  (registers the envs)
            from gym_hil import GymRenderingSpec
        except ImportError as e:
            raise ImportError(
                "the gym_hil backend needs gym-hil: pip install 'rlinf-user[gym-hil]'"
            ) from e
        self.task = task
        self.cameras = tuple(cameras)
        self.max_episode_steps = int(max_episode_steps)
        self._step_size = float(ee_step_size)
        if gripper_threshold is not None and not 0.0 <= float(gripper_threshold) < 1.0:
            raise ValueError(f"gripper_threshold must be in [0, 1), got {gripper_threshold}")
        self._gripper_threshold = None if gripper_threshold is None else float(gripper_threshold)
        self._gripper_closed = False
        self.action_spec = ActionSpec(
            frame="base",
            max_translation=self._step_size,
            max_rotation=0.0,
            active=(True, True, True, False, False, False, True),
        )
        size = int(image_size)
        self._env = gym.make(
            env_id,
            disable_env_checker=True,
            image_obs=bool(self.cameras),
            render_spec=GymRenderingSpec(height=size, width=size),
            reward_type=reward,
            control_dt=1.0 / float(control_hz),
            **kwargs,
        ).unwrapped
        use_fast_control(self._env)  # the same torques, 1.6x the steps/s (benchmarks/bench_env.py)
        if self.cameras and (not render_shadows or render_samples is not None):
            self._set_render_quality(bool(render_shadows), render_samples, size)
        self._pending_seed = seed
        native_space = self._env.observation_space.spaces
        parts = [k for k in ("agent_pos", "environment_state") if k in native_space]
        state_dim = sum(native_space[k].shape[0] for k in parts)
        self._init_spaces(state_dim, {c: (size, size) for c in self.cameras})

    def _set_render_quality(self, shadows: bool, samples: int | None, size: int) -> None:
        """Shadows and multisampling off or down: on a CPU's software OpenGL a 128 x 128
        camera then renders in about 30 ms rather than 230 ms (the shadow map is 4096^2)."""
        import mujoco

        model = self._env.model
        if samples is not None:
            if int(samples) < 0:
                raise ValueError(f"render_samples must be >= 0, got {samples}")
            model.vis.quality.offsamples = int(samples)
            self._env._viewer.close()
            self._env._viewer = mujoco.Renderer(model, height=size, width=size)
        if not shadows:
            self._env._viewer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            self._env._viewer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0

    @classmethod
    def validate_config(cls, cfg: Any) -> None:
        resolve_task(cfg.task)

    @classmethod
    def from_config(cls, cfg: Any, seed: int | None = None) -> GymHilEnv:
        """Build from an ``EnvConfig``; ``cfg.kwargs`` go to the gym_hil env (e.g.
        ``random_block_position``) apart from ``ee_step_size``. ``random_block_position``
        belongs to the pick task; other tasks refuse a true value and ignore the default."""
        kwargs = dict(cfg.kwargs or {})
        if "random_block_position" in kwargs and resolve_task(cfg.task) != TASKS["PandaPickCube"]:
            if kwargs.pop("random_block_position"):
                raise ValueError(f"env.kwargs.random_block_position=true applies to PandaPickCube only, not {cfg.task}")
        return cls(
            cfg.task,
            cameras=list(cfg.cameras or ()),
            image_size=int(cfg.image_size),
            reward=cfg.reward,
            max_episode_steps=int(cfg.max_episode_steps),
            control_hz=float(cfg.control_hz),
            seed=seed,
            **kwargs,
        )

    @property
    def block_position(self) -> np.ndarray:
        """The block's position in the base frame, read from the simulator."""
        return np.asarray(self._env.data.sensor("block_pos").data, np.float64).copy()

    @property
    def base_env(self) -> Any:
        """The underlying gym_hil env (``FrankaGymEnv``), for inspection and tests."""
        return self._env

    def _flat_state(self, raw: dict[str, Any]) -> np.ndarray:
        agent = np.array(raw["agent_pos"], dtype=np.float32)
        agent[_GRIPPER_INDEX] /= _MAX_GRIPPER_COMMAND
        parts = [agent]
        if "environment_state" in raw:
            parts.append(np.asarray(raw["environment_state"], dtype=np.float32))
        return np.concatenate(parts)

    def _observation(self, raw: dict[str, Any]) -> dict[str, Any]:
        pixels = raw.get("pixels", {})
        images = {name: np.array(pixels[name]) for name in self.cameras}
        return make_observation(self._flat_state(raw), images, stamp=float(self._env.data.time))

    def _reset(self, seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
            gym.Env.reset(self, seed=seed)  # seed np_random as reset(seed=...) would
        self._pending_seed = None
        sub_seed = int(self.np_random.integers(2**31 - 1))
        with _global_numpy_seed(sub_seed):
            raw, info = self._env.reset(seed=sub_seed)
        self._gripper_closed = False  # gym_hil resets the gripper open
        return self._observation(raw), {"success": False, **info}

    def _step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        gripper_now = float(self._env.get_gripper_pose()[0]) / _MAX_GRIPPER_COMMAND
        g = float(action[6])
        if self._gripper_threshold is None:
            target = (g + 1.0) / 2.0
        else:  # as the edge drives a real gripper: close above +t, open below -t, else hold
            if g > self._gripper_threshold:
                self._gripper_closed = True
            elif g < -self._gripper_threshold:
                self._gripper_closed = False
            target = 1.0 if self._gripper_closed else 0.0
        native = np.zeros(7, dtype=np.float64)
        native[:3] = action[:3].astype(np.float64) * self._step_size
        native[6] = target - gripper_now
        raw, reward, terminated, _, info = self._env.step(native)
        out = {k: v for k, v in info.items() if k != "succeed"}
        out["success"] = bool(info.get("succeed", False))
        return self._observation(raw), float(reward), bool(terminated), out

    def render(self) -> np.ndarray:
        return np.asarray(self._env.render()[0])

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()
