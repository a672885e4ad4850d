"""The real runtime end to end: Ray actors, env workers, persistent replay (gym_hil's
MuJoCo pick where a run must last long enough to be interrupted or read in order, else the
reach sim)."""

import json

import numpy as np
import pytest
from run_helpers import short_cfg, transitions  # noqa: E402

from rlinf_user.rundir import create_run_dir  # noqa: E402
from rlinf_user.runtime.orchestration.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def ray_runtime():
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_async_training_run_writes_a_complete_run_dir(tmp_path, ray_runtime):
    # gym_hil's MuJoCo pick: a run slow enough that each worker's chunks reach the log in
    # order (the next_obs check below reads the log in its order), and built in a second
    # where ManiSkill's PushCube took 96 s in all on a slow machine. Disaggregated (the replay
    # buffer in its own actor); the collocated placement, the default, runs in the other tests here
    cfg = short_cfg(tmp_path, "placement=disaggregated", sim="gym_hil")
    run_dir = create_run_dir(cfg)
    trainer = Trainer(cfg, run_dir)
    try:
        progress = trainer.run()
    finally:
        trainer.close()
    assert progress.env_steps >= 1200 and progress.updates > 0 and progress.version > 0
    # run directory: resolved config, events, checkpoint, evaluation summary + curve
    assert (run_dir / "config.yaml").exists()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "latest").exists()
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["env_steps"] == progress.env_steps and 0.0 <= summary["final_eval_success"] <= 1.0
    assert (run_dir / "eval" / "history.csv").read_text().count("\n") >= 3
    # every stored transition says which policy version acted and that no human did
    t = transitions(run_dir)
    assert len(t["reward"]) == progress.env_steps
    assert t["intervention"].dtype == bool and not t["intervention"].any()
    versions = t["policy_version"]
    assert versions.min() >= 0 and versions.max() > 0
    # within one env stream versions never go backwards
    assert (np.diff(versions) >= 0).all()
    # next_obs of a non-final step is the following step's obs (same-step auto reset kept apart)
    done = (t["terminated"] + t["truncated"]) > 0
    cont = ~done[:-1]
    np.testing.assert_allclose(t["next_obs/state"][:-1][cont], t["obs/state"][1:][cont])


def test_resume_continues_learner_and_buffer(tmp_path, ray_runtime):
    cfg = short_cfg(tmp_path)
    run_dir = create_run_dir(cfg)
    first = Trainer(cfg, run_dir)
    try:
        p1 = first.run()
    finally:
        first.close()
    stored = len(transitions(run_dir)["reward"])
    resumed = short_cfg(tmp_path, f"resume={run_dir}", "total_env_steps=2000")
    create_run_dir(resumed)
    second = Trainer(resumed, run_dir)
    try:
        p2 = second.run()
    finally:
        second.close()
    assert p2.env_steps >= 2000
    assert p2.updates > p1.updates  # optimiser/update counters continued, not restarted
    assert p2.version > p1.version  # the version sequence is unbroken
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["replay"]["restored"] == stored
    versions = transitions(run_dir)["policy_version"]
    assert versions[stored:].min() >= p1.version


def test_killed_env_worker_is_restarted(tmp_path, ray_runtime):
    import os
    import signal

    import ray

    cfg = short_cfg(tmp_path, "total_env_steps=1500", sim="gym_hil")
    run_dir = create_run_dir(cfg)
    trainer = Trainer(cfg, run_dir)
    killed = []

    def kill_once(p):
        if not killed and p.env_steps >= 400:
            os.kill(ray.get(trainer.pool.slots[0].actor.pid.remote()), signal.SIGKILL)  # kill -9
            killed.append(p.env_steps)

    trainer.on_progress = kill_once
    try:
        progress = trainer.run()
    finally:
        trainer.close()
    assert killed and progress.worker_restarts == 1
    assert trainer.pool.slots[0].restarts == 1 and trainer.pool.slots[0].status == "running"
    assert progress.env_steps >= 1500
    t = transitions(run_dir)
    assert np.isfinite(t["obs/state"]).all()


@pytest.mark.parametrize("placement", ["collocated", "disaggregated"])
def test_learner_killed_with_sigkill_comes_back_and_loses_no_data(tmp_path, ray_runtime, placement):
    """kill -9 of the learner process mid-run: it restarts from its latest checkpoint (the
    buffer restored from its log when it lived in the learner), versions continue above
    the last published one, and every chunk the workers produced reaches the buffer.
    ``algo.paced`` holds the workers to the learner's update budget, so the run cannot end
    before the restarted learner has published (unpaced, a slow restart could outlast the
    remaining env steps: the run is then correct but proves nothing about the restart)."""
    import os
    import signal

    import ray

    cfg = short_cfg(tmp_path, f"placement={placement}", "total_env_steps=1800", "checkpoint_every_steps=300", "algo.paced=true")
    run_dir = create_run_dir(cfg)
    trainer = Trainer(cfg, run_dir)
    killed: dict = {}

    def kill_once(p):
        if not killed and p.env_steps >= 700 and p.version > 0:
            killed["version"] = p.version
            os.kill(ray.get(trainer.learner.pid.remote()), signal.SIGKILL)

    trainer.on_progress = kill_once
    try:
        progress = trainer.run()
    finally:
        trainer.close()
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert killed and summary["learner_restarts"] == 1, summary
    assert summary["policy_version"] > killed["version"]  # the sequence went on, never back
    assert progress.env_steps >= 1800 and summary["updates"] > 0
    t = transitions(run_dir)
    assert len(t["reward"]) >= progress.env_steps  # nothing lost (a resent chunk may appear twice)
    assert t["policy_version"].max() > killed["version"]  # workers got the restarted learner's weights


def test_sac_flow_trains_a_flow_policy_through_the_same_runtime(tmp_path, ray_runtime):
    """algo=sac_flow policy=flow: the runtime is unchanged; the learner's checkpoint loads
    back into a flow policy that evaluation runs."""
    from rlinf_user.env.registry import make_env
    from rlinf_user.evaluation import checkpoint_spec, evaluate_policy, load_policy_from_checkpoint
    from rlinf_user.runtime.learning.learner import latest_checkpoint

    cfg = short_cfg(tmp_path, "algo=sac_flow", "policy=flow", "policy.flow_steps=3", sim="gym_hil")
    run_dir = create_run_dir(cfg)
    with Trainer(cfg, run_dir) as trainer:
        progress = trainer.run()
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["algo"] == "sac_flow" and progress.updates > 0 and progress.version > 0
    ckpt = latest_checkpoint(run_dir)
    policy, version = load_policy_from_checkpoint(ckpt, cfg, checkpoint_spec(ckpt))
    assert type(policy).__name__ == "FlowPolicy" and policy.steps == 3 and version == progress.version
    env = make_env(cfg.env, seed=0)
    try:
        result = evaluate_policy(env, policy, 1)
    finally:
        env.close()
    assert result["episodes"] == 1 and np.isfinite(result["mean_return"])
    with pytest.raises(ValueError, match="does not fit policy=mlp"):
        load_policy_from_checkpoint(ckpt, short_cfg(tmp_path, sim="gym_hil"), checkpoint_spec(ckpt))
