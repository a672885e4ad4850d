"""Teleop demonstrations feed training: a LeRobot dataset recorded through the device path
becomes the RLPD demo buffer, and ``algo.bc_warmup_updates`` clones it into the actor
before RL starts."""

from pathlib import Path

import numpy as np
import pytest
import torch

from rlinf_user.config.compose import compose_config
from rlinf_user.data import lerobot_format as fmt
from rlinf_user.data.lerobot_reader import LeRobotReader
from rlinf_user.data.lerobot_writer import LeRobotWriter
from rlinf_user.env.spec import EnvSpec
from rlinf_user.robots.teleop.device import QueueSource
from rlinf_user.robots.teleop.spacemouse import SpaceMouse
from rlinf_user.runtime.learning.learner import Learner
from rlinf_user.sims.gym_hil import GymHilEnv
from rlinf_user.teleop.record import Recorder
from rlinf_user.teleop.synthetic import PickCubeExpert, SpaceMouseHand, SyntheticHuman


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("demos") / "pick"
    env = GymHilEnv("PandaPickCube", max_episode_steps=60, random_block_position=True)
    dev = SpaceMouse(QueueSource())
    w = LeRobotWriter(root, 10, fmt.contract_features(env.observation_space["state"].shape[0], {}, 10))
    Recorder(env, dev, w, "pick", rate_hz=0, before_step=SyntheticHuman(SpaceMouseHand(dev), PickCubeExpert())).run(4, seed=0)
    spec = EnvSpec.of_env(env)
    env.close()
    return root, spec


def demo_error(learner: Learner, root) -> float:
    s, a = LeRobotReader(root).state_action_arrays()
    with torch.no_grad():
        out = learner.algo.policy.act({"state": torch.as_tensor(s), "images": {}}, deterministic=True).actions[:, 0].numpy()
    return float(np.mean((out - learner.spec.policy_action(a)) ** 2))


def test_bc_warm_start_clones_the_demonstrations_into_the_actor(demos, tmp_path):
    root, spec = demos
    common = ["algo=rlpd", f"demos={root}", f"run_root={tmp_path}", "buffer.persist=false", "seed=0"]
    cold = Learner(compose_config(common, sim="gym_hil"), spec, str(tmp_path / "cold"))
    warm = Learner(compose_config([*common, "algo.bc_warmup_updates=400"], sim="gym_hil"), spec, str(tmp_path / "warm"))
    assert cold.warm_start_if_due() == 0 and warm.warm_start_if_due() == 400  # the trainer asks, once placed
    assert warm.warm_start_if_due() == 0  # once
    assert cold.local_replay.demos.size > 40 and warm.warm_start_loss is not None
    # a run's learner loads them once it is placed (load_demos, no start timeout), not in its
    # constructor: a large camera set outlasted the start timeout on a busy machine
    deferred = Learner(compose_config(common, sim="gym_hil"), spec, str(tmp_path / "deferred"), defer_demos=True)
    assert deferred.local_replay.demos is None and deferred.local_replay.sample_demos(8) is None
    assert deferred.load_demos() == cold.local_replay.demos.size and deferred.load_demos() == 0  # once
    assert deferred.local_replay.sample_demos(8)["intervention"].all()
    before, after = demo_error(cold, root), demo_error(warm, root)
    assert after < 0.1 < before, (before, after)
    batch = warm.local_replay.sample_demos(64)
    assert batch["obs/state"].shape == (64, spec.state_dim) and batch["intervention"].all()


def test_data_parallel_replicas_join_with_the_warmed_weights(demos, tmp_path):
    """With learner replicas the warm start runs on the lead alone, before the replicas join
    (they join with its state): every replica then holds the cloned weights, not fresh ones."""
    import ray

    from rlinf_user.runtime.learning.data_parallel import weights_digest

    root, spec = demos
    cfg = compose_config(["algo=rlpd", f"demos={root}", f"run_root={tmp_path}", "buffer.persist=false", "seed=0",
                          "algo.bc_warmup_updates=50", "placement.learner_replicas=2"], sim="gym_hil")  # fmt: skip
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        lead = Learner(cfg, spec, str(tmp_path / "dp"))
        assert lead.dp is None  # not before the warm start
        assert lead.warm_start_if_due() == 50
        assert lead.dp is not None and lead.dp.digests() == [weights_digest(lead.algo.policy)]
    finally:
        ray.shutdown()
        if torch.distributed.is_initialized():  # the lead's group lives in this process
            torch.distributed.destroy_process_group()


def test_iql_trains_end_to_end_from_demonstrations_with_the_tasks_tuning(demos, tmp_path):
    """`algo=iql demos=...` through the whole runtime: the learner runs IQL's offline phase
    on the demonstrations before the first env step, then learns online from the mixed
    batches (paced), and the run takes the pick's IQL tuning (configs/sim/gym_hil_random.yaml)
    by the algorithm's own name. Learning the pick itself is benchmarked (docs/results.md)."""
    import csv
    import json

    from rlinf_user.cli.main import main

    root, _ = demos
    rc = main([
        "train", "--sim", "gym_hil_random", "algo=iql", f"demos={root}", "seed=0", "algo.offline_updates=150",
        "total_env_steps=800", "eval_episodes=2", "eval_every_steps=800", "eval_at_start=true",
        f"run_root={tmp_path}", "run_name=iql", "progress=false", "buffer.persist=false",
    ])  # fmt: skip
    assert rc == 0
    run = tmp_path / "iql"
    resolved = (run / "config.yaml").read_text()
    assert "expectile: 0.9" in resolved and "extraction: ddpg_bc" in resolved and "bc_rows: demos" in resolved
    with open(run / "eval" / "history.csv") as f:
        history = list(csv.DictReader(f))
    assert int(history[0]["env_steps"]) == 0 and int(history[-1]["env_steps"]) >= 800, history
    # paced at one update per env step: the online updates kept up with the env steps (the
    # offline phase's are not counted in them)
    assert float(history[-1]["updates"]) >= 0.5 * float(history[-1]["env_steps"]), history
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert summary["replay"]["demos"] > 40 and summary["updates"] >= 0.5 * summary["env_steps"], summary
    assert summary["test_eval"]["split"] == "test" and summary["test_eval"]["policy_version"] > 0
    assert Path(summary["checkpoint"]).exists()
