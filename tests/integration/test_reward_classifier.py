"""The reward role: a success classifier trained from recorded gym_hil pick episodes
(`rlinf-user train-reward`), then scoring a training run's steps through its own Ray
actor, including after that actor is killed with kill -9."""

import json
import time

import numpy as np
import pytest

pytest.importorskip("gym_hil")

from rlinf_user.config.compose import ConfigError, compose_config, validate  # noqa: E402
from rlinf_user.data import lerobot_format as fmt  # noqa: E402
from rlinf_user.data.lerobot_writer import LeRobotWriter  # noqa: E402
from rlinf_user.reward.classifier import SuccessClassifier, load_frames, train_classifier  # noqa: E402


def record(root, episodes: int, seed: int, expert: bool = True):
    """Episodes of gym_hil's pick task driven through the simulated SpaceMouse by the
    scripted expert (successes) or left idle (failures)."""
    from rlinf_user.robots.teleop.device import QueueSource
    from rlinf_user.robots.teleop.spacemouse import SpaceMouse
    from rlinf_user.sims.gym_hil import GymHilEnv
    from rlinf_user.teleop.record import Recorder
    from rlinf_user.teleop.synthetic import PickCubeExpert, SpaceMouseHand, SyntheticHuman

    env = GymHilEnv("PandaPickCube", max_episode_steps=40, random_block_position=True)
    dev = SpaceMouse(QueueSource())
    w = LeRobotWriter(root, 10, fmt.contract_features(env.observation_space["state"].shape[0], {}, 10))
    hand = SyntheticHuman(SpaceMouseHand(dev), PickCubeExpert()) if expert else None
    Recorder(env, dev, w, "pick", rate_hz=0, before_step=hand).run(episodes, seed=seed)
    env.close()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward")
    record(root / "expert", 12, seed=0)
    frames = load_frames([root / "expert"])
    assert 0 < frames.label.sum() < len(frames.label)
    model, metrics = train_classifier(frames, {"name": "mlp"}, steps=600, val_fraction=0.25)
    path = root / "pick_success.pt"
    model.save(path, 0.5, metrics)
    return path, metrics, root


def test_classifier_separates_success_on_held_out_episodes(classifier):
    path, metrics, root = classifier
    assert metrics["validation_episodes"] == 3
    val = metrics["validation"]
    assert val["positives"] > 0 and val["true_positive_rate"] >= 0.8 and val["true_negative_rate"] >= 0.9, metrics
    model, state = SuccessClassifier.load(path)
    assert state["threshold"] == 0.5
    record(root / "fresh", 3, seed=100)  # episodes recorded after training, new block positions
    fresh = load_frames([root / "fresh"])
    prob = model.probability({"state": fresh.state, "images": {}})
    assert (prob[fresh.label] >= 0.5).mean() >= 0.8 and (prob[~fresh.label] < 0.5).mean() >= 0.9


def test_one_class_data_and_bad_settings_are_refused(classifier, tmp_path):
    _, _, root = classifier
    record(tmp_path / "idle", 2, seed=5, expert=False)  # nobody acts: no success anywhere
    with pytest.raises(ValueError, match="both successful and unsuccessful"):
        train_classifier(load_frames([tmp_path / "idle"]), {"name": "mlp"}, steps=5)
    with pytest.raises(ConfigError, match="no such file"):
        validate(compose_config([f"reward.classifier={tmp_path / 'none.pt'}"], sim="gym_hil"))
    with pytest.raises(ValueError, match="not a success classifier"):
        import torch

        torch.save({"policy": {}}, tmp_path / "policy.pt")
        SuccessClassifier.load(tmp_path / "policy.pt")


def test_cli_trains_a_classifier(classifier, tmp_path):
    from rlinf_user.cli.main import main

    _, _, root = classifier
    out = tmp_path / "cli.pt"
    assert main(["train-reward", str(root / "expert"), "--out", str(out), "--steps", "200"]) == 0
    _, state = SuccessClassifier.load(out)
    assert state["metrics"]["train"]["positives"] > 0 and state["metrics"]["datasets"] == [str(root / "expert")]


def test_training_run_takes_its_rewards_from_the_classifier_across_a_kill_9(classifier, tmp_path):
    import os
    import signal

    import ray

    from rlinf_user.data.record_log import RecordLog
    from rlinf_user.rundir import create_run_dir
    from rlinf_user.runtime.orchestration.trainer import Trainer

    path, _, _ = classifier
    cfg = compose_config(
        [
            f"reward.classifier={path}", "reward.success_reward=2.0", "reward.ends_episode=true",
            "env.kwargs.random_block_position=true",
            "env.max_episode_steps=40", "total_env_steps=1200", "algo.learning_starts=200", "algo.batch_size=64",
            "policy.hidden=[64,64]", "eval_every_steps=100000", "eval_episodes=1", "checkpoint_every_steps=100000",
            "buffer.chunk_steps=25", "placement.num_env_workers=2", f"run_root={tmp_path}", "run_name=r", "progress=false",
        ],
        sim="gym_hil",
    )  # fmt: skip
    validate(cfg)
    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    run_dir = create_run_dir(cfg)
    killed: dict = {}

    def kill_once(p):
        if not killed and p.env_steps >= 500:
            killed["pid"] = ray.get(trainer.reward_server.pid.remote())
            os.kill(killed["pid"], signal.SIGKILL)  # kill -9

    try:
        with Trainer(cfg, run_dir, on_progress=kill_once) as trainer:
            progress = trainer.run()
    finally:
        ray.shutdown()
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert killed and summary["reward_restarts"] == 1 and summary["worker_restarts"] == 0, summary
    assert summary["reward_server"]["calls"] > 0  # the replacement scored the rest of the run
    chunks = list(RecordLog(run_dir / "buffer").read_all())
    t = {k: np.concatenate([c[k] for c in chunks]) for k in ("reward", "next_obs/state", "obs/state", "terminated", "env_id")}
    assert len(t["reward"]) >= progress.env_steps  # no step lost to the crash
    model, _ = SuccessClassifier.load(path)
    expected = 2.0 * (model.probability({"state": t["next_obs/state"], "images": {}}) >= 0.5)
    np.testing.assert_allclose(t["reward"], expected)  # every stored reward is the classifier's verdict
    assert set(np.unique(t["reward"])) <= {0.0, 2.0}
    success = t["reward"] > 0
    assert success.any() and (t["terminated"][success] == 1).all()  # a classified success ends its episode
    for env in np.unique(t["env_id"]):  # ... and the env starts a new one on the next step
        rows = np.flatnonzero(t["env_id"] == env)
        for j, nxt in zip(rows[:-1], rows[1:]):
            if success[j]:
                assert not np.allclose(t["obs/state"][nxt], t["next_obs/state"][j])


def test_demonstrations_get_the_classifier_reward(classifier):
    from rlinf_user.runtime.learning.replay_service import ReplayService

    path, _, root = classifier
    plain = ReplayService(100, None, str(root / "expert"))
    svc = ReplayService(100, None, str(root / "expert"), reward={
        "classifier": str(path), "threshold": None, "success_reward": 3.0, "ends_episode": True})  # fmt: skip
    st, n = svc.demos.storage, svc.demos.size
    assert n == plain.demos.size > 0
    assert not np.array_equal(st["reward"][:n], plain.demos.storage["reward"][:n])  # the env's dense reward is gone
    model, _ = SuccessClassifier.load(path)
    expected = 3.0 * (model.probability({"state": st["next_obs/state"][:n], "images": {}}) >= 0.5)
    np.testing.assert_allclose(st["reward"][:n], expected)
    assert expected.max() == 3.0  # the demonstrations reach success
    success = expected > 0
    assert (st["terminated"][:n][success] == 1).all()  # a classified success is terminal, as online
    kept = ReplayService(  # ends_episode off (the default): the recorded flags stay
        100, None, str(root / "expert"), reward={"classifier": str(path), "threshold": None, "success_reward": 3.0}
    )
    np.testing.assert_array_equal(kept.demos.storage["terminated"][:n], plain.demos.storage["terminated"][:n])
    assert (plain.demos.storage["terminated"][:n][success] == 0).any()  # so ends_episode changed something


def test_a_client_waits_for_a_server_still_starting_and_passes_its_refusals_on(classifier):
    """The worker side of a server replacement: a name not registered yet is waited for
    (the trainer is starting the new server), while a request the server refuses fails
    at once with the server's reason."""
    import threading

    import ray

    from rlinf_user.runtime.serving.reward_server import RewardClient, RewardServer, server_name

    path, _, root = classifier
    name = server_name(str(root / "run"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        started = []

        def start_later():
            time.sleep(2.0)
            started.append(ray.remote(RewardServer).options(name=name, num_cpus=0).remote(str(path), None, 2.0))

        threading.Thread(target=start_later, daemon=True).start()
        client = RewardClient(name)
        state = np.zeros((3, SuccessClassifier.load(path)[0].state_dim), np.float32)
        t0 = time.monotonic()
        reward, success = client.score({"state": state, "images": {}})  # before the server exists
        assert started and time.monotonic() - t0 >= 1.5
        assert reward.shape == (3,) and set(np.unique(reward)) <= {0.0, 2.0}
        np.testing.assert_array_equal(reward, 2.0 * success)
        with pytest.raises(ValueError, match="state of shape"):
            client.score({"state": state[:, :5], "images": {}})
        assert client.score({"state": state, "images": {}})[0].shape == (3,)  # still serving
    finally:
        ray.shutdown()
