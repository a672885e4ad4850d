"""ManiSkill 3 backend: single CPU env (:class:`ManiSkillEnv`) and GPU-parallel batch
(:class:`ManiSkillVectorEnv`).

Action mapping. ManiSkill's ``pd_ee_delta_pose`` controller of the Panda takes
``[dx, dy, dz, drx, dry, drz, gripper]`` normalised to [-1, 1]: translation in the robot
root frame, rotation about root-aligned axes at the TCP (controller frame
``root_translation:root_aligned_body_rotation``), scaled to 0.1 m and 0.1 rad per step in
mani_skill 3.0.1 (``mani_skill/agents/robots/panda/panda.py``). That is the contract's
``"base"`` frame, so translation passes through. mani_skill 3.0.1 multiplies the rotation
by ``rot_lower`` (-0.1), which turns +1 into a *negative* rotation, and clips the rotation
part by its norm; :func:`action_mapping` reads limits and signs from the controller and
negates the rotation dims accordingly. (ManiSkill composes the rotation from XYZ Euler
angles, equal to the axis-angle vector to first order for per-step deltas.) ManiSkill's
gripper is a joint-position target with +1 = open (0.04 m) and -1 = closed (-0.01 m); the
contract's is -1 open / +1 closed, so it is negated.

Observation. State-only envs use ManiSkill's ``obs_mode="state"`` (proprioception and the
task's privileged object state, flattened). With cameras the obs mode is ``"rgb"`` and the
state is the flattened ``agent`` (qpos, qvel) and ``extra`` (TCP pose, goal, ...) parts,
without object poses; ``kwargs.privileged_state=True`` adds them (``"rgb+state"``).

Timestamps are simulated time: ``elapsed_steps / control_freq`` seconds into the episode.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_user.env.base import ContractEnv
from rlinf_user.env.contract import (
    ActionSpec,
)
from rlinf_user.env.vector import index_obs
from rlinf_user.sims.vulkan import FIX_MESSAGE, ensure_vulkan

logger = logging.getLogger(__name__)

# Panda tasks that run with pd_ee_delta_pose and need no asset download (mani_skill 3.0.1).
SUPPORTED_TASKS: tuple[str, ...] = (
    "PickCube-v1",
    "PushCube-v1",
    "PegInsertionSide-v1",
    "PullCube-v1",
    "PokeCube-v1",
    "StackCube-v1",
    "LiftPegUpright-v1",
    "PlaceSphere-v1",
    "PullCubeTool-v1",
    "RollBall-v1",
)
CONTROL_MODE = "pd_ee_delta_pose"
# Translation-only end-effector control (ManiSkill's own choice for PickCube baselines):
# the contract's rotation dims are inactive and ignored.
CONTROL_MODES = ("pd_ee_delta_pose", "pd_ee_delta_pos")
REWARD_MODES = {"dense": "normalized_dense", "sparse": "sparse"}
_EXPECTED_FRAME = "root_translation:root_aligned_body_rotation"
_VULKAN_HINTS = ("vk::", "vulkan", "rendering device", "errorincompatibledriver", "svulkan")


def check_task(task: str) -> None:
    """Raise ``ValueError`` naming the supported tasks when ``task`` is not one of them."""
    if task not in SUPPORTED_TASKS:
        raise ValueError(
            f"ManiSkill task {task!r} is not supported; supported: {', '.join(SUPPORTED_TASKS)}"
        )


def resolve_backends(sim_device: str, num_envs: int) -> tuple[str, str]:
    """Map ``EnvConfig.sim_device`` to ManiSkill's ``(sim_backend, render_backend)``.

    ``auto``: PhysX on the GPU when CUDA is available and ``num_envs > 1``, else the CPU.
    Rendering uses the GPU whenever CUDA is available.
    """
    import torch

    cuda = torch.cuda.is_available()
    if sim_device == "auto":
        sim = "physx_cuda" if cuda and num_envs > 1 else "physx_cpu"
    elif sim_device in ("cpu", "cuda"):
        sim = f"physx_{sim_device}"
    else:
        raise ValueError(f"sim_device must be auto, cpu or cuda, got {sim_device!r}")
    if sim == "physx_cuda" and not cuda:
        raise RuntimeError("sim_device='cuda' was asked for but torch sees no CUDA device")
    if sim == "physx_cpu" and num_envs > 1:
        raise ValueError(
            "ManiSkill's CPU simulation runs one env per process; use num_envs=1 "
            "(EnvBatch over several processes) or a CUDA device for num_envs > 1"
        )
    return sim, ("gpu" if cuda else "cpu")


def make_maniskill(
    task: str,
    *,
    num_envs: int,
    obs_mode: str,
    reward: str,
    sim_backend: str,
    render_backend: str,
    image_size: int | None,
    max_episode_steps: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> gym.Env:
    """``gym.make`` a ManiSkill task, turning Vulkan failures into an actionable error."""
    check_task(task)
    if reward not in REWARD_MODES:
        raise ValueError(f"reward must be one of {sorted(REWARD_MODES)}, got {reward!r}")
    ensure_vulkan()
    try:
        import mani_skill.envs  # noqa: F401  (registers the tasks)
    except ImportError as e:
        raise ImportError(
            "the maniskill backend needs mani-skill: pip install 'rlinf-user[maniskill]'"
        ) from e
    kwargs: dict[str, Any] = dict(extra or {})
    kwargs.pop("privileged_state", None)
    control_mode = kwargs.pop("control_mode", CONTROL_MODE)
    if control_mode not in CONTROL_MODES:
        raise ValueError(f"control_mode must be one of {CONTROL_MODES}, got {control_mode!r}")
    if image_size is not None:
        sensor = dict(kwargs.pop("sensor_configs", {}) or {})
        sensor.update(width=int(image_size), height=int(image_size))
        kwargs["sensor_configs"] = sensor
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = int(max_episode_steps)
    logger.info(
        "ManiSkill %s: num_envs=%d obs_mode=%s sim=%s render=%s",
        task, num_envs, obs_mode, sim_backend, render_backend,
    )
    try:
        return gym.make(
            task,
            num_envs=num_envs,
            obs_mode=obs_mode,
            reward_mode=REWARD_MODES[reward],
            control_mode=control_mode,
            sim_backend=sim_backend,
            render_backend=render_backend,
            **kwargs,
        )
    except RuntimeError as e:
        if any(h in str(e).lower() for h in _VULKAN_HINTS):
            raise RuntimeError(f"creating ManiSkill {task} failed ({e}). {FIX_MESSAGE}") from e
        raise


def action_mapping(base_env: Any) -> tuple[ActionSpec, np.ndarray]:
    """The env's :class:`ActionSpec` and per-dim signs with ``native = contract * signs``.

    Limits and signs are read from the arm controller itself: its
    ``_clip_and_scale_action`` is applied to unit actions. (mani_skill 3.0.1 scales the
    rotation by ``rot_lower`` = -0.1, so +1 turns the TCP the *negative* way about the
    axis; the rotation dims are negated here to give the contract's right-handed sense.)
    The gripper's joint target has +1 = open, so it is negated too.
    """
    import torch

    configs = base_env.agent.controller.configs
    arm_cfg, gripper_cfg = configs["arm"], configs["gripper"]
    frame = getattr(arm_cfg, "frame", _EXPECTED_FRAME)
    if not gripper_cfg.upper > gripper_cfg.lower:
        raise RuntimeError(f"unexpected ManiSkill gripper controller {gripper_cfg}")
    arm = base_env.agent.controller.controllers["arm"]
    if frame == "root_translation" and arm_cfg.normalize_action:  # pd_ee_delta_pos
        scaled = arm._clip_and_scale_action(torch.tensor([[1.0, 0, 0]], device=base_env.device))
        trans = float(scaled.cpu().numpy()[0, 0])
        spec = ActionSpec(frame="base", max_translation=abs(trans), max_rotation=0.0,
                          active=(True, True, True, False, False, False, True))
        return spec, np.array([np.sign(trans)] * 3 + [0.0] * 3 + [-1.0], dtype=np.float32)
    if frame != _EXPECTED_FRAME or not arm_cfg.normalize_action:
        raise RuntimeError(f"unexpected ManiSkill arm controller {arm_cfg}; cannot map the action")
    unit = torch.tensor([[1.0, 0, 0, 0, 0, 0], [0, 0, 0, 1.0, 0, 0]], device=base_env.device)
    scaled = arm._clip_and_scale_action(unit).cpu().numpy()
    trans, rot = float(scaled[0, 0]), float(scaled[1, 3])
    spec = ActionSpec(frame="base", max_translation=abs(trans), max_rotation=abs(rot))
    signs = np.array([np.sign(trans)] * 3 + [np.sign(rot)] * 3 + [-1.0], dtype=np.float32)
    return spec, signs


def to_maniskill_action(actions: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Contract action(s) -> ManiSkill action(s); dims with sign 0 (inactive) are dropped."""
    keep = signs != 0
    return (np.asarray(actions, dtype=np.float32) * signs)[..., keep].astype(np.float32)


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _flatten(tree: Any, n: int) -> list[np.ndarray]:
    """Leaves of a (nested) dict of batched arrays as ``(n, k)`` float32, in key order
    (the order ManiSkill's own ``flatten_state_dict`` uses)."""
    if isinstance(tree, Mapping):
        return [part for value in tree.values() for part in _flatten(value, n)]
    return [_np(tree).reshape(n, -1).astype(np.float32)]


def flat_state(raw_obs: Any) -> np.ndarray:
    """Batched flat float32 state ``(N, D)`` from a ManiSkill observation."""
    if not isinstance(raw_obs, Mapping):
        return _np(raw_obs).astype(np.float32)
    if "state" in raw_obs:
        return _np(raw_obs["state"]).astype(np.float32)
    n = len(_np(raw_obs["agent"]["qpos"]))
    return np.concatenate(_flatten({"agent": raw_obs["agent"], "extra": raw_obs["extra"]}, n), 1)


def batch_contract_obs(
    raw_obs: Any, cameras: Sequence[str], stamps: np.ndarray
) -> dict[str, Any]:
    """Contract observation with a leading batch axis from a ManiSkill observation."""
    stamps = np.asarray(stamps, dtype=np.float64)
    images = {}
    for name in cameras:
        images[name] = np.ascontiguousarray(_np(raw_obs["sensor_data"][name]["rgb"])[..., :3])
    return {
        "state": flat_state(raw_obs),
        "images": {k: v.astype(np.uint8, copy=False) for k, v in images.items()},
        "timestamps": {"state": stamps, **{k: stamps.copy() for k in images}},
    }


def _obs_mode(cameras: Sequence[str], privileged: bool) -> str:
    if not cameras:
        return "state"
    return "rgb+state" if privileged else "rgb"


def inspect_base(base_env: Any, cameras: Sequence[str], close) -> tuple[ActionSpec, np.ndarray, float, int]:
    """The action mapping, control period and state size of a built ManiSkill env (single or
    GPU-parallel), after checking its cameras; ``close`` releases it if a check fails."""
    try:
        _check_cameras(base_env, cameras)
        spec, signs = action_mapping(base_env)
    except Exception:
        close()
        raise
    return spec, signs, 1.0 / float(base_env.control_freq), flat_state(base_env._init_raw_obs).shape[-1]


def _check_cameras(base_env: Any, cameras: Sequence[str]) -> None:
    available = sorted(base_env._sensors)
    missing = [c for c in cameras if c not in available]
    if missing:
        raise ValueError(
            f"camera(s) {missing} not in ManiSkill {base_env.spec.id if base_env.spec else ''}; "
            f"available: {available}"
        )


class ManiSkillEnv(ContractEnv):
    """One ManiSkill 3 task on the CPU (or one env on the GPU) under the env contract.

    Success terminates the episode (as does a task's ``fail``); ``max_episode_steps``
    truncates. ``info`` carries ManiSkill's per-step metrics as Python scalars.
    """

    def __init__(
        self,
        task: str = "PickCube-v1",
        *,
        cameras: Sequence[str] = (),
        image_size: int = 128,
        reward: str = "dense",
        max_episode_steps: int = 50,
        sim_device: str = "auto",
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        check_task(task)
        self.task = task
        self.cameras = tuple(cameras)
        self.max_episode_steps = int(max_episode_steps)
        sim, render = resolve_backends(sim_device, num_envs=1)
        privileged = bool(kwargs.get("privileged_state", False))
        kwargs.setdefault("render_mode", "rgb_array")
        self._env = make_maniskill(
            task,
            num_envs=1,
            obs_mode=_obs_mode(self.cameras, privileged),
            reward=reward,
            sim_backend=sim,
            render_backend=render,
            image_size=image_size if self.cameras else None,
            extra=kwargs,
        )
        self._base = self._env.unwrapped
        self.action_spec, self._signs, self._dt, state_dim = inspect_base(self._base, self.cameras, self._env.close)
        self._pending_seed = seed
        self._init_spaces(state_dim, {c: (image_size, image_size) for c in self.cameras})

    @classmethod
    def make_vector(cls, cfg: Any, num_envs: int, seed: int):
        """GPU-parallel envs (one PhysX CUDA scene) when CUDA is present and allowed."""
        import torch

        if cfg.sim_device == "cpu" or not torch.cuda.is_available():
            return None
        if getattr(cfg, "instruction", None):
            raise ValueError("env.instruction is not supported by ManiSkill's GPU-parallel envs yet: set env.sim_device=cpu")
        from rlinf_user.sims.maniskill_vector import ManiSkillVectorEnv

        return ManiSkillVectorEnv.from_config(cfg, num_envs=num_envs, seed=seed)

    @classmethod
    def validate_config(cls, cfg: Any) -> None:
        check_task(cfg.task)
        mode = (cfg.kwargs or {}).get("control_mode", CONTROL_MODE)
        if mode not in CONTROL_MODES:
            raise ValueError(f"env.kwargs.control_mode must be one of {CONTROL_MODES}, got {mode!r}")
        if cfg.reward not in REWARD_MODES:
            raise ValueError(f"env.reward must be one of {sorted(REWARD_MODES)}, got {cfg.reward!r}")

    @classmethod
    def from_config(cls, cfg: Any, seed: int | None = None) -> ManiSkillEnv:
        """Build from an ``EnvConfig``; ``cfg.kwargs`` go to ``gym.make`` (plus
        ``privileged_state``). ``cfg.control_hz`` is not applied: ManiSkill tasks run at
        their native control rate (pass ``sim_config={"control_freq": ...}`` to change it)."""
        return cls(
            cfg.task,
            cameras=list(cfg.cameras or ()),
            image_size=int(cfg.image_size),
            reward=cfg.reward,
            max_episode_steps=int(cfg.max_episode_steps),
            sim_device=cfg.sim_device,
            seed=seed,
            **dict(cfg.kwargs or {}),
        )

    @property
    def base_env(self) -> Any:
        """The underlying ``mani_skill`` ``BaseEnv`` (for inspection and tests)."""
        return self._base

    def _observation(self, raw: Any) -> dict[str, Any]:
        stamps = _np(self._base.elapsed_steps).astype(np.float64) * self._dt
        return index_obs(batch_contract_obs(raw, self.cameras, stamps), 0)

    def _reset(self, seed: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
        self._pending_seed = None
        raw, info = self._base.reset(seed=seed)
        return self._observation(raw), split_info(info, 1)[0]

    def _step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        native = to_maniskill_action(action, self._signs)
        raw, reward, terminated, _, info = self._base.step(native)
        out = split_info(info, 1)[0]
        done = bool(_np(terminated).reshape(-1)[0]) or out["success"]
        return self._observation(raw), float(_np(reward).reshape(-1)[0]), done, out

    def render(self) -> np.ndarray | None:
        frame = self._base.render()
        return None if frame is None else _np(frame)[0]

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()


def split_info(info: Mapping[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Per-env dicts of Python scalars from a batched ManiSkill info dict.

    Keeps the per-env entries (1-D, length ``num_envs``); ``success`` is always a bool.
    """
    columns: dict[str, np.ndarray] = {}
    for key, value in info.items():
        if hasattr(value, "shape"):
            arr = _np(value)
            if arr.ndim == 1 and len(arr) == num_envs:
                columns[key] = arr
    out = [{k: v[i].item() for k, v in columns.items()} for i in range(num_envs)]
    for d in out:
        d["success"] = bool(d.get("success", False))
    return out
