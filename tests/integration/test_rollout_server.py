"""The rollout (policy-inference) role through a real Ray runtime: batched answers with
the published weights' version, bad requests refused, and training runs whose env workers
hold no policy, including one where the server is killed with kill -9 mid-run."""

import json

import numpy as np
import pytest
import torch

from rlinf_user.config.compose import compose_config, validate
from rlinf_user.env.spec import EnvSpec
from rlinf_user.policies.base import build_policy
from rlinf_user.runtime.weights.store import WeightPublisher, WeightStore

SPEC = EnvSpec(state_dim=6, active_dims=(0, 1, 2))


@pytest.fixture(scope="module")
def ray_runtime():
    import ray

    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def server_cfg(*extra):
    return compose_config(["policy.hidden=[32,32]", "placement.rollout.enabled=true", *extra], sim="gym_hil")


def test_server_answers_batched_requests_with_the_published_weights(ray_runtime):
    import ray

    from rlinf_user.runtime.serving.rollout_server import RolloutServer

    cfg = server_cfg()
    store = ray.remote(WeightStore).remote()
    learner = build_policy(cfg.policy, SPEC)
    pub = WeightPublisher(store)
    pub.publish(learner, 0)
    server = ray.remote(RolloutServer).remote(cfg, SPEC, store)
    rng = np.random.default_rng(0)
    obs = [{"state": rng.normal(size=(2, 6)).astype(np.float32), "images": {}} for _ in range(16)]

    def local(o):
        with torch.no_grad():
            return learner.act({"state": torch.as_tensor(o["state"]), "images": {}}, deterministic=True).actions.numpy()

    answers = ray.get([server.act.remote(o, True) for o in obs])  # 16 callers at once
    for o, (a, extras, version) in zip(obs, answers, strict=True):
        assert version == 0 and a.shape == (2, 1, 3) and a.dtype == np.float32  # chunks of one step
        assert extras == {}  # a deterministic Gaussian policy has no sampling extras
        np.testing.assert_allclose(a, local(o), atol=1e-6)  # each caller gets its own rows back
    stats = ray.get(server.stats.remote())
    assert stats["requests"] == 16 and stats["rows"] == 32
    assert stats["batches"] < 16 and stats["max_batch_rows"] > 2  # requests shared forward passes

    with torch.no_grad():  # a training step, published as v1: the server switches between batches
        for p in learner.parameters():
            p.add_(0.05)
    pub.publish(learner, 1)
    for _ in range(200):
        a, _, version = ray.get(server.act.remote(obs[0], True))
        if version == 1:
            break
    assert version == 1
    np.testing.assert_allclose(a, local(obs[0]), atol=1e-6)

    with pytest.raises(ray.exceptions.RayTaskError, match="state_dim"):
        ray.get(server.act.remote({"state": np.zeros((1, 5), np.float32), "images": {}}))
    with pytest.raises(ray.exceptions.RayTaskError, match="non-finite"):
        ray.get(server.act.remote({"state": np.full((1, 6), np.nan, np.float32), "images": {}}))
    a, extras, version = ray.get(server.act.remote(obs[1]))  # and it serves on
    assert a.shape == (2, 1, 3) and np.isfinite(a).all() and np.abs(a).max() <= 1.0
    assert extras["log_prob"].shape == (2,)  # a sampled action comes with its log-prob
    ray.get(server.close.remote())


def test_max_batch_splits_a_queue_into_forward_passes(ray_runtime):
    import ray

    from rlinf_user.runtime.serving.rollout_server import RolloutServer

    cfg = server_cfg("placement.rollout.max_batch=4", "placement.rollout.max_wait_ms=50")
    server = ray.remote(RolloutServer).remote(cfg, SPEC, None)  # no weights: its initial policy
    obs = {"state": np.zeros((2, 6), np.float32), "images": {}}
    got = ray.get([server.act.remote(obs) for _ in range(8)])
    assert all(v == -1 and a.shape == (2, 1, 3) for a, _, v in got)
    stats = ray.get(server.stats.remote())
    assert stats["max_batch_rows"] == 4 and stats["batches"] >= 4  # 16 rows, at most 4 a pass


def test_out_of_device_memory_is_reported_with_the_batch_size_and_smaller_batches_go_on(caplog):
    """GPU memory cannot run out on a CPU: the policy raises torch's OutOfMemoryError above
    4 rows, as a CUDA allocation would. The server splits the batch, answers every row
    (the same actions as one pass), serves later batches at the size that fits, and names
    the batch size in its log; a model that does not fit one row is the callers' error."""
    from rlinf_user.runtime.serving.rollout_server import RolloutServer

    server = RolloutServer(server_cfg("placement.rollout.max_batch=64"), SPEC, None)
    real_act = server.policy.act
    seen = []

    def act(obs, deterministic=False):
        seen.append(int(obs["state"].shape[0]))
        if seen[-1] > server_limit[0]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_act(obs, deterministic)

    server_limit = [4]
    server.policy.act = act
    obs = {"state": np.random.default_rng(0).normal(size=(10, 6)).astype(np.float32), "images": {}}
    with caplog.at_level("ERROR"):
        actions, _, _ = server._forward(obs, True)
    assert "batch of 10 rows" in caplog.text and "at most 5" in caplog.text
    server_limit[0] = 1000
    whole, _, _ = server._forward(obs, True)
    np.testing.assert_allclose(actions, whole, atol=1e-6)  # every row answered, as by one pass
    stats = server.stats()
    assert stats["oom_splits"] == 2 and stats["max_batch"] == 2 and seen[:5] == [10, 5, 2, 2, 1]
    server_limit[0] = 0
    with pytest.raises(RuntimeError, match="batch of 1 row"):
        server._forward({"state": obs["state"][:1], "images": {}}, True)
    server.close()


def test_a_frame_features_policy_is_served_on_the_maps_in_place_of_frames():
    """policy.frame_features: workers send a camera's frozen-encoder maps, not its frames; the
    server answers them as the policy in a worker would, and still refuses a missing camera."""
    import asyncio

    from rlinf_user.policies.frame_features import FrameFeaturizer, frame_feature_settings
    from rlinf_user.runtime.serving.rollout_server import RolloutServer

    cfg = compose_config(["policy=cnn", "policy.encoder=efficientnet", "policy.frame_features=true",
                          "placement.rollout.enabled=true"], sim="gym_hil_pixels")  # fmt: skip
    spec = EnvSpec(state_dim=6, cameras={"front": (128, 128)}, active_dims=(0, 1, 2))
    server = RolloutServer(cfg, spec, None)
    frames = np.random.default_rng(0).integers(0, 255, (3, 128, 128, 3), dtype=np.uint8)
    raw = {"state": np.zeros((3, 6), np.float32), "images": {"front": frames}}
    obs = FrameFeaturizer(frame_feature_settings(cfg)).observation(raw)
    assert obs["images"] == {} and obs["features"]["front"].shape[0] == 3
    actions, _, _ = asyncio.run(server.act(obs, True))
    from rlinf_user.env.spec import obs_to_torch

    local = server.policy.act(obs_to_torch(obs), deterministic=True).actions.numpy().reshape(actions.shape)
    np.testing.assert_allclose(actions, local, atol=1e-5)  # what the policy in a worker does
    with pytest.raises(ValueError, match="camera 'front' is missing"):
        asyncio.run(server.act({"state": raw["state"], "images": {}}, True))
    server.close()


def test_bad_rollout_settings_are_named():
    from rlinf_user.config.compose import ConfigError

    for override, word in (("placement.rollout.device=tpu", "device"), ("placement.rollout.max_batch=0", "max_batch")):
        cfg = compose_config(["placement.rollout.enabled=true", override], sim="gym_hil")
        with pytest.raises(ConfigError, match=word):
            validate(cfg)


# -- training with a rollout server -----------------------------------------------------------
from run_helpers import short_cfg, transitions  # noqa: E402


def train_cfg(tmp_path, *extra):
    """2 workers x 2 envs whose training steps all go through the rollout server (PushCube:
    its states never repeat, so the check below can chain episodes by observation)."""
    pytest.importorskip("mani_skill")
    return short_cfg(
        tmp_path, "total_env_steps=1600", "algo.learning_starts=200", "eval_every_steps=800",
        "checkpoint_every_steps=800", "placement.num_env_workers=2", "placement.envs_per_worker=2",
        "placement.rollout.enabled=true", *extra, sim="maniskill",
    )  # fmt: skip


def _check_versions_and_episodes(t, max_len):
    """Per env: versions never go back along an episode, and every episode ends by
    termination or its time limit (none cut short: a server loss must not break an
    episode). Episodes are rebuilt by chaining each step's next observation to the step
    that starts from it, so the check does not depend on the order chunks were logged in
    (a worker has several sends in flight)."""
    for env in np.unique(t["env_id"]):
        rows = np.flatnonzero(t["env_id"] == env)
        done = (t["terminated"][rows] + t["truncated"][rows]) > 0
        starts_from = {t["obs/state"][r].tobytes(): j for j, r in enumerate(rows)}
        successor = {}
        for j, r in enumerate(rows):
            if not done[j]:
                successor[j] = starts_from.get(t["next_obs/state"][r].tobytes())
        has_pred = {k for k in successor.values() if k is not None}
        seen = 0
        for first in (j for j in range(len(rows)) if j not in has_pred):
            chain = [first]
            while not done[chain[-1]] and successor.get(chain[-1]) is not None:
                chain.append(successor[chain[-1]])
            seen += len(chain)
            v = t["policy_version"][rows[chain]]
            assert (np.diff(v) >= 0).all(), f"env {env}: policy versions went back within an episode"
            assert len(chain) <= max_len
            if done[chain[-1]]:
                assert t["terminated"][rows[chain[-1]]] or len(chain) == max_len, f"env {env}: episode cut at {len(chain)}"
        assert seen == len(rows)  # every step is in exactly one episode


def test_training_through_the_rollout_server_and_kill_9_of_it(tmp_path, ray_runtime):
    import os
    import signal

    import ray

    from rlinf_user.rundir import create_run_dir
    from rlinf_user.runtime.orchestration.trainer import Trainer

    cfg = train_cfg(tmp_path)
    run_dir = create_run_dir(cfg)
    trainer = Trainer(cfg, run_dir)
    killed: dict = {}

    def kill_once(p):
        if not killed and p.env_steps >= 700 and p.version > 0:
            killed["version"] = p.version
            killed["pid"] = ray.get(trainer.rollout_server.pid.remote())
            os.kill(killed["pid"], signal.SIGKILL)  # kill -9

    trainer.on_progress = kill_once
    with trainer:
        progress = trainer.run()
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert killed and summary["rollout_restarts"] == 1 and summary["worker_restarts"] == 0, summary
    assert progress.env_steps >= 1600
    server = summary["rollout_server"]  # the new server's own numbers
    assert server["requests"] > 0 and server["policy_version"] > killed["version"]
    assert summary["placement"]["rollout"]
    t = transitions(run_dir)
    assert len(t["reward"]) >= progress.env_steps  # nothing the workers stepped was lost
    served = t["policy_version"][t["policy_version"] >= 0]
    assert served.size > 0 and served.max() > killed["version"]  # actions from the new server's weights
    _check_versions_and_episodes(t, max_len=int(cfg.env.max_episode_steps))
