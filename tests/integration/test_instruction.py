"""The contract's optional language instruction: drawn per episode, carried by every
observation, through the env worker's columns into replay and a policy batch, and
recorded by datasets as LeRobot's task."""

import numpy as np
import pytest

from rlinf_user.config.compose import compose_config
from rlinf_user.data.replay import ReplayBuffer
from rlinf_user.env.contract import ContractError, validate_observation
from rlinf_user.env.registry import make_env
from rlinf_user.env.spec import Col, EnvSpec, columns_to_torch

TEXTS = ["pick up the cube", "lift the cube above the table"]


def gym_hil_cfg(*extra):
    return compose_config([f"env.instruction=[{','.join(repr(t) for t in TEXTS)}]", "env.max_episode_steps=5", *extra],
                          sim="gym_hil")  # fmt: skip


def test_each_episode_draws_an_instruction_every_observation_carries():
    env = make_env(gym_hil_cfg().env, seed=0)
    try:
        assert EnvSpec.of_env(env).instruction
        seen = set()
        for seed in range(8):
            obs, _ = env.reset(seed=seed)
            validate_observation(obs, env.observation_space)
            text = obs["instruction"]
            for _ in range(3):
                obs, *_ = env.step(np.zeros(7, np.float32))
                assert obs["instruction"] == text  # fixed for the episode
            seen.add(text)
        assert seen == set(TEXTS)
        bad = dict(obs, instruction="\x00not printable")
        with pytest.raises(ContractError, match="instruction"):
            validate_observation(bad, env.observation_space)
        with pytest.raises(ValueError, match="env.instruction"):
            env.set_instructions(["x" * 300])
    finally:
        env.close()


def test_instructions_travel_through_the_worker_replay_and_into_a_policy_batch():
    from rlinf_user.runtime.rollout.env_worker import EnvWorker

    worker = EnvWorker(gym_hil_cfg("buffer.chunk_steps=1000"), worker_id=0, seed=0, num_envs=2)
    try:
        worker.rollout(12, random=True)
        _, chunk = worker.writer.out.backlog[0]  # no sink: the chunk waits here
    finally:
        worker.close()
    assert chunk["obs/instruction"].shape == (24,) and set(chunk["obs/instruction"]) <= set(TEXTS)
    done = (chunk[Col.TERMINATED] + chunk[Col.TRUNCATED]) > 0
    assert done.sum() >= 2  # episodes of 5 steps ended (and the next ones drew again)
    buf = ReplayBuffer(100)
    buf.add(chunk)
    sample = buf.sample(16, np.random.default_rng(0))
    batch = columns_to_torch(sample)
    assert batch["obs"]["state"].shape[0] == 16 and all(t in TEXTS for t in batch["obs"]["instruction"])
    assert all(t in TEXTS for t in batch["next_obs"]["instruction"])


def test_a_recorded_episode_is_stored_under_its_instruction(tmp_path):
    from rlinf_user.data import lerobot_format as fmt
    from rlinf_user.data.lerobot_reader import LeRobotReader
    from rlinf_user.data.lerobot_writer import LeRobotWriter
    from rlinf_user.robots.teleop.device import QueueSource
    from rlinf_user.robots.teleop.spacemouse import SpaceMouse
    from rlinf_user.teleop.record import Recorder
    from rlinf_user.teleop.synthetic import PickCubeExpert, SpaceMouseHand, SyntheticHuman

    env = make_env(gym_hil_cfg("env.max_episode_steps=20").env, seed=0)
    dev = SpaceMouse(QueueSource())
    w = LeRobotWriter(tmp_path / "ds", 10, fmt.contract_features(env.observation_space["state"].shape[0], {}, 10))
    try:
        Recorder(
            env, dev, w, "default task", rate_hz=0, before_step=SyntheticHuman(SpaceMouseHand(dev), PickCubeExpert())
        ).run(4, seed=0)
    finally:
        env.close()
    reader = LeRobotReader(tmp_path / "ds")
    tasks = {reader.episode(i, images=False).task for i in range(reader.num_episodes)}
    assert tasks and tasks <= set(TEXTS) and "default task" not in tasks
    # as demonstrations for an env that observes instructions, each episode's task is the
    # instruction of every transition drawn from it
    from rlinf_user.runtime.learning.replay_service import load_demo_buffer

    demos = load_demo_buffer(str(tmp_path / "ds"), instruction=True)
    batch = columns_to_torch(demos.sample(32, np.random.default_rng(0)))
    assert set(batch["obs"]["instruction"]) <= tasks and set(batch["next_obs"]["instruction"]) <= tasks
    assert "obs/instruction" not in load_demo_buffer(str(tmp_path / "ds")).sample(4, np.random.default_rng(0))
