"""ManiSkill-specific behaviour: task/camera errors, the Vulkan error message, and
:class:`ManiSkillVectorEnv` (CPU with one env here; many envs on a CUDA GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mani_skill")

from rlinf_user.config.schema import EnvConfig  # noqa: E402
from rlinf_user.env.contract import ContractError, validate_observation  # noqa: E402
from rlinf_user.env.vector import index_obs  # noqa: E402
from rlinf_user.sims.maniskill import SUPPORTED_TASKS, ManiSkillEnv  # noqa: E402
from rlinf_user.sims.maniskill_vector import ManiSkillVectorEnv  # noqa: E402


def test_unknown_task_lists_supported_ones() -> None:
    with pytest.raises(ValueError, match="PickCube-v1") as err:
        ManiSkillEnv.from_config(EnvConfig(backend="maniskill", task="NoSuchTask-v9"))
    assert all(t in str(err.value) for t in SUPPORTED_TASKS)


def test_unknown_camera_lists_available_ones() -> None:
    with pytest.raises(ValueError, match="base_camera"):
        ManiSkillEnv("PickCube-v1", cameras=["no_such_camera"], image_size=32)


def test_cpu_refuses_many_envs() -> None:
    with pytest.raises(ValueError, match="one env per process"):
        ManiSkillVectorEnv("PickCube-v1", num_envs=2, sim_device="cpu")


def test_vulkan_failure_says_how_to_fix_it() -> None:
    """A broken Vulkan driver gives a RuntimeError naming the installer (fresh process:
    SAPIEN creates its Vulkan instance once per process)."""
    code = textwrap.dedent(
        """
        from rlinf_user.sims.maniskill import ManiSkillEnv
        try:
            ManiSkillEnv("PickCube-v1")
        except RuntimeError as e:
            print("ERROR:", e)
        else:
            print("NO ERROR")
        """
    )
    env = dict(os.environ, VK_ICD_FILENAMES="/nonexistent/rlinf_user_test_icd.json")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "ERROR:" in out.stdout, out.stdout + out.stderr
    assert "scripts/install_system_deps.sh" in out.stdout
    assert "rlinf-user doctor" in out.stdout


@pytest.fixture(scope="module")
def cpu_vector_env() -> Any:
    venv = ManiSkillVectorEnv("PickCube-v1", num_envs=1, max_episode_steps=4, seed=0)
    yield venv
    venv.close()


def _check_batch(venv: Any, obs: dict[str, Any]) -> None:
    assert obs["state"].shape == (venv.num_envs, *venv.observation_space["state"].shape)
    for i in range(venv.num_envs):
        validate_observation(index_obs(obs, i), venv.observation_space)


def _run_to_time_limit(venv: Any) -> None:
    """Step a still batch to its time limit: same-step auto-reset with ``final_obs``."""
    obs = venv.reset(seed=7)
    _check_batch(venv, obs)
    assert np.all(obs["timestamps"]["state"] == 0.0)
    still = np.zeros((venv.num_envs, 7), dtype=np.float32)
    still[:, 6] = -1.0
    for t in range(1, venv.max_episode_steps + 1):
        obs, rew, term, trunc, infos = venv.step(still)
        _check_batch(venv, obs)
        assert rew.shape == term.shape == trunc.shape == (venv.num_envs,)
        assert rew.dtype == np.float32 and term.dtype == bool and trunc.dtype == bool
        assert not np.any(term & trunc)
        assert all(type(info["success"]) is bool for info in infos)
        if t < venv.max_episode_steps:
            assert not trunc.any() and all("final_obs" not in i for i in infos)
    assert trunc.all()
    for i, info in enumerate(infos):
        final = info["final_obs"]
        validate_observation(final, venv.observation_space)
        assert final["timestamps"]["state"] == pytest.approx(venv.max_episode_steps * venv._dt)
        assert obs["timestamps"]["state"][i] == 0.0  # the batch already holds the new episode


def test_vector_env_on_cpu_auto_resets(cpu_vector_env: Any) -> None:
    _run_to_time_limit(cpu_vector_env)


def test_vector_env_refuses_nan(cpu_vector_env: Any) -> None:
    cpu_vector_env.reset()
    bad = np.zeros((1, 7), dtype=np.float32)
    bad[0, 2] = np.nan
    with pytest.raises(ContractError):
        cpu_vector_env.step(bad)
    with pytest.raises(ContractError):
        cpu_vector_env.step(np.zeros((2, 7), dtype=np.float32))


@pytest.mark.gpu
def test_vector_env_on_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    venv = ManiSkillVectorEnv("PickCube-v1", num_envs=8, max_episode_steps=5, seed=0)
    try:
        assert venv._base.backend.sim_backend == "physx_cuda"
        _run_to_time_limit(venv)
        rng = np.random.default_rng(0)
        for _ in range(12):  # random actions: envs may finish at different steps
            obs, rew, term, trunc, infos = venv.step(rng.uniform(-1, 1, (8, 7)))
            _check_batch(venv, obs)
            for i in np.flatnonzero(term | trunc):
                validate_observation(infos[i]["final_obs"], venv.observation_space)
    finally:
        venv.close()


def test_the_gpu_parallel_path_gets_the_runs_reward_shaping_and_can_end_an_episode(monkeypatch) -> None:
    """make_vector_env wraps ManiSkill's batched env like any other (the success bonus was
    once dropped on CUDA), and that env ends one episode on request. On this CPU the
    batched class runs one env; the backend hands it out as if CUDA were present."""
    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_vector_env
    from rlinf_user.env.shaping import ShapedVectorEnv
    from rlinf_user.sims.maniskill import ManiSkillEnv

    built = []

    def cuda_like(cls, cfg, num_envs, seed):
        built.append(ManiSkillVectorEnv.from_config(cfg, num_envs=1, seed=seed))
        return built[-1]

    monkeypatch.setattr(ManiSkillEnv, "make_vector", classmethod(cuda_like))
    cfg = compose_config(["env.success_bonus=5.0", "env.max_episode_steps=6"], sim="maniskill").env
    venv = make_vector_env(cfg, 2, seed=0)
    try:
        assert isinstance(venv, ShapedVectorEnv) and venv.venv is built[0] and venv.bonus == 5.0
        venv.reset(seed=3)
        for _ in range(3):
            obs, *_ = venv.step(np.zeros((1, 7), np.float32))
        assert obs["timestamps"]["state"][0] == pytest.approx(3 * built[0]._dt)
        first = venv.end_episode(0)  # e.g. a learned reward said success
        validate_observation(first, venv.observation_space)
        assert first["timestamps"]["state"] == 0.0
        obs, *_ = venv.step(np.zeros((1, 7), np.float32))
        assert obs["timestamps"]["state"][0] == pytest.approx(built[0]._dt)  # the new episode's first step
    finally:
        venv.close()
