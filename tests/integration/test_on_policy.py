"""On-policy learning through the real runtime: PPO's synchronous rounds use exactly the
newest policy, asynchronous PPO stays within max_policy_lag, GRPO's groups share reset
seeds, and PPO and GRPO learn an easy task to a success threshold.

The runs use the kinematic reach sim (microseconds a step), so what is timed is the
runtime and the learner; PPO on ManiSkill PushCube is a benchmark
(``benchmarks/bench_on_policy.py``)."""

import json

import numpy as np
import pytest

from rlinf_user.config.compose import compose_config, validate  # noqa: E402
from rlinf_user.env.spec import Col
from rlinf_user.rundir import create_run_dir  # noqa: E402
from rlinf_user.runtime.orchestration.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def ray_runtime():
    import ray

    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def on_policy_cfg(tmp_path, algo="ppo", *extra):
    """800 env steps of reach: 2 workers x 2 envs, 20 steps per env a round."""
    cfg = compose_config(
        [f"algo={algo}", "policy=gaussian_ac", "policy.hidden=[64,64]", "algo.num_steps=20",
         "placement.num_env_workers=2", "placement.envs_per_worker=2", "total_env_steps=800", "eval_every_steps=400",
         "eval_episodes=2", "checkpoint_every_steps=400", "buffer.chunk_steps=40", f"run_root={tmp_path}", "run_name=r",
         "progress=false", *extra],
        sim="reach",
    )  # fmt: skip
    validate(cfg)
    return cfg


def vla_ppo_cfg(tmp_path, sim, workers, steps, *extra):
    """PPO of a VLA for ``steps`` env steps: ``workers`` x 2 envs, 16 steps per env a round,
    a critic warm-up update first, an evaluation and a checkpoint every half."""
    cfg = compose_config(
        ["algo=ppo", "algo.num_steps=16", "algo.num_minibatches=2", "algo.critic_warmup_updates=1",
         f"placement.num_env_workers={workers}", "placement.envs_per_worker=2", f"total_env_steps={steps}",
         f"eval_every_steps={steps // 2}", f"checkpoint_every_steps={steps // 2}", "buffer.chunk_steps=16",
         f"run_root={tmp_path}", "run_name=vla", "progress=false", *extra],
        sim=sim,
    )  # fmt: skip
    validate(cfg)
    return cfg


def run(cfg):
    run_dir = create_run_dir(cfg)
    with Trainer(cfg, run_dir) as trainer:
        progress = trainer.run()
    return run_dir, progress, json.loads((run_dir / "eval" / "summary.json").read_text())


@pytest.mark.parametrize("served", [False, True], ids=["policy-in-worker", "rollout-server"])
def test_sync_ppo_rounds_use_exactly_the_newest_policy(tmp_path, ray_runtime, served):
    run_dir, p, summary = run(on_policy_cfg(tmp_path, "ppo", f"placement.rollout.enabled={str(served).lower()}",
                                            "eval_at_start=true"))  # fmt: skip
    # eval_at_start: the starting policy is evaluated, booked at 0 steps; later evaluations
    # are booked at the steps they began at, with the version they evaluated
    assert p.history[0]["env_steps"] == 0 and p.history[0]["policy_version"] == 0, p.history
    steps = [h["env_steps"] for h in p.history]
    assert steps == sorted(steps) and steps[1] >= 400 and steps[-1] == 800, p.history
    if served:  # the server answered every training step, with the log-probs and values PPO needs
        assert summary["rollout_server"]["rows"] >= 800 and summary["rollout_restarts"] == 0
    rounds = 800 // (2 * 2 * 20)
    stats = summary["replay"]
    assert summary["algo"] == "ppo" and p.env_steps == 800
    # one update per round on every row the round collected, each from the newest policy
    assert stats["updates"] == rounds == p.updates and stats["rows_trained"] == 800
    assert stats["max_policy_lag"] == 0 and stats["dropped_stale"] == 0
    assert p.version == rounds  # v0 published at start, one version per update
    assert (run_dir / "checkpoints" / "latest").exists() and (run_dir / "eval" / "history.csv").exists()
    assert summary["final_eval_success"] is not None


def test_async_ppo_trains_on_rows_at_most_max_policy_lag_old(tmp_path, ray_runtime):
    _, p, summary = run(on_policy_cfg(tmp_path, "ppo", "algo.mode=async", "placement.max_policy_lag=1"))
    stats = summary["replay"]
    assert stats["updates"] >= 3 and stats["max_policy_lag"] <= 1
    assert stats["rows_trained"] + stats["dropped_stale"] + stats["on_policy_rows_waiting"] <= p.env_steps


def test_grpo_groups_start_from_one_seed_and_train_on_complete_groups(tmp_path, ray_runtime):
    from rlinf_user.runtime.rollout.env_worker import EnvWorker

    # no goal can be reached (radius 0): every episode lasts exactly the 10-step limit
    cfg = on_policy_cfg(tmp_path, "grpo", "algo.group_size=2", "placement.envs_per_worker=4", "env.max_episode_steps=10",
                        "env.kwargs.success_radius=0.0")  # fmt: skip
    worker = EnvWorker(cfg, worker_id=0, seed=5)
    try:
        s = worker.obs["state"]
        assert np.array_equal(s[0], s[1]) and np.array_equal(s[2], s[3]) and not np.array_equal(s[0], s[2])
        worker.rollout(10)  # every episode ends at the time limit: the next ones start together again
        s = worker.obs["state"]
        assert np.array_equal(s[0], s[1]) and not np.array_equal(s[0], s[2])
    finally:
        worker.close()
    # episodes of different lengths (a 30 cm goal radius: some end at once): a group's
    # envs still run their episodes in lock-step, an early finisher held until the rest end
    cfg = on_policy_cfg(tmp_path, "grpo", "algo.group_size=2", "placement.envs_per_worker=4", "env.max_episode_steps=10",
                        "env.kwargs.success_radius=0.3", "buffer.chunk_steps=100000")  # fmt: skip
    worker = EnvWorker(cfg, worker_id=0, seed=5)
    try:
        held_seen = 0
        for _ in range(60):
            worker.rollout(1, random=True)
            k = worker.groups.episode
            assert k[0] - k[1] in (-1, 0, 1) and k[2] - k[3] in (-1, 0, 1)  # never a whole episode apart
            held_seen += int(worker.groups.held.sum())
            assert all(worker.groups.held[i] == (k[i] > k[i ^ 1]) for i in range(4))  # ahead means held
        rows = sum(len(c[Col.REWARD]) for c in [*worker.writer.pending, *(c for _, c in worker.writer.out.backlog)])
        assert held_seen > 0 and rows == worker.env_steps == 4 * 60 - held_seen  # a held env makes no step
    finally:
        worker.close()
    _, p, summary = run(on_policy_cfg(tmp_path, "grpo", "algo.group_size=2", "env.max_episode_steps=10",
                                      "env.kwargs.success_radius=0.0"))  # fmt: skip
    stats = summary["replay"]
    assert stats["updates"] > 0 and stats["rows_trained"] % 10 == 0  # whole episodes only
    assert summary["final_eval_success"] is not None  # the evaluation worker has no groups


# the pi0 architecture (tiny, random init) acting one action a chunk, Flow-Noise PPO over its
# whole model: benchmark bench_on_policy.py --policy pi0 (seeds 0-2)
# one worker with all 16 envs: a tiny pi0 costs about as much per call at 16 as at 8 (Python
# overhead), so the same rounds take half the inference CPU of two workers
PI0_FROM_SCRATCH = ["policy=pi0", "policy.horizon=1", "policy.noise_std=[0.2,0.5]", "policy.finetune=full",
                    "algo.lr=1e-3", "algo.value_lr=1e-3", "placement.num_env_workers=1",
                    "placement.envs_per_worker=16"]  # fmt: skip


@pytest.mark.parametrize(
    ("algo", "threshold", "budget", "extra"),
    # GRPO's per-step baseline (gamma 0.9) scores ~10 steps of hovering: reach's bonus of 10 beats it
    [("ppo", 0.9, 60_000, ["policy=gaussian_ac"]), ("grpo", 0.9, 100_000, ["policy=gaussian_ac"]),
     ("ppo", 0.8, 56_000, PI0_FROM_SCRATCH)],
    ids=["ppo", "grpo", "ppo-pi0"],
)  # fmt: skip
def test_on_policy_learning_reaches_a_success_threshold_on_distinct_goals(
    tmp_path, ray_runtime, algo, threshold, budget, extra
):
    """Learning, not loss: PPO and GRPO (2 workers x 8 envs, seed 0) must reach the stated
    evaluation success over 50 goals drawn from seeds training never uses, from a starting
    policy (evaluated first) that reaches at most 10% of them; PPO with the Gaussian
    actor-critic, and Flow-Noise PPO of a flow VLA (the pi0 architecture)."""
    cfg = compose_config(
        [f"algo={algo}", "placement.num_env_workers=2", "placement.envs_per_worker=8", *extra, "eval_at_start=true",
         f"total_env_steps={budget}", "eval_every_steps=8000", "eval_episodes=50", f"target_success={threshold}",
         "seed=0", f"run_root={tmp_path}", "run_name=learn", "progress=false"],
        sim="reach",
    )  # fmt: skip
    validate(cfg)
    _, p, summary = run(cfg)
    print(f"{algo} reach learning:", json.dumps(p.history))
    assert p.history[0]["policy_version"] == 0 and p.history[0]["success_rate"] <= 0.1, p.history
    assert summary["best_eval_success"] >= threshold, p.history


def test_a_nan_loss_stops_the_run_before_anything_is_saved_and_resume_goes_on(tmp_path, ray_runtime):
    import torch

    from rlinf_user.runtime.orchestration.run_record import RunError

    cfg = on_policy_cfg(tmp_path, "ppo", "algo.reward_scale=1e39")  # rewards overflow to inf
    run_dir = create_run_dir(cfg)
    with pytest.raises(RunError, match=r"the learner stopped: .*non-finite PPO loss at update 0.*resume="):
        with Trainer(cfg, run_dir) as trainer:
            trainer.run()
    for ckpt in (run_dir / "checkpoints").glob("ckpt-*.pt"):  # whatever was saved holds finite weights
        state = torch.load(ckpt, weights_only=True)["agent"]["policy"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    resumed = on_policy_cfg(tmp_path, "ppo", f"resume={run_dir}", "total_env_steps=160")
    with Trainer(resumed, run_dir) as trainer:
        p = trainer.run()
    assert p.updates >= 2 and p.env_steps >= 160


@pytest.mark.parametrize(
    "policy",
    [["policy=pi0"], ["policy=token_vla", "policy.vlm_layers=1"], ["policy=pi0", "algo.credit=action"]],
    ids=["flow", "token", "flow-action-credit"],
)
def test_a_chunk_policy_trains_on_one_row_per_chunk(tmp_path, ray_runtime, policy):
    """PPO with a VLA (chunks of 4; pi0's Flow-Noise log-probs, or the token VLA's per-token
    log-probs) through the runtime: every synchronous round updates once, on rows that are
    whole chunks, from exactly the newest policy; with action-level credit each row carries
    its actions' rewards and the learner's GAE runs over single actions."""
    _, p, summary = run(vla_ppo_cfg(tmp_path, "reach", 2, 256, *policy, "policy.horizon=4", "eval_episodes=2"))
    stats = summary["replay"]
    rounds = 256 // (2 * 2 * 16)
    assert p.env_steps == 256 and stats["updates"] == rounds == p.updates
    # a row per chunk of 4 steps (more where an episode ended inside a chunk)
    assert 256 / 4 <= stats["rows_trained"] < 256 / 2, stats
    assert stats["max_policy_lag"] == 0 and summary["final_eval_success"] is not None


def test_a_data_parallel_learner_trains_on_shards_and_its_replicas_stay_identical(tmp_path, ray_runtime):
    """placement.learner_replicas=2: a second learner actor joins a gloo group; every PPO
    round each trains on half the rows with averaged gradients, and at the end both hold
    the same weights (the summary compares them)."""
    cfg = on_policy_cfg(tmp_path, "ppo", "placement.learner_replicas=2", "total_env_steps=240", "eval_every_steps=240")
    _, p, summary = run(cfg)
    stats = summary["replay"]
    assert p.env_steps == 240 and stats["updates"] == 3 == p.updates and stats["rows_trained"] == 240
    assert summary["learner_replicas"] == {"count": 2, "weights_identical": True}


def test_ppo_fine_tunes_a_pi0_checkpoint_folder_in_maniskill(tmp_path, ray_runtime):
    """``train --sim maniskill algo=ppo policy=pi0 policy.checkpoint=<folder>``: a pi0 folder in
    openpi's layout (a tiny one, written here) is where PPO on ManiSkill PushCube (its camera,
    and the robot's own state: 32 wide at most, like a real pi0's) starts. The
    run's checkpoint holds the folder's frozen VLM weights bit for bit, and its action expert
    has moved from the folder's."""
    pytest.importorskip("mani_skill")
    import torch

    from rlinf_user.policies.pi0_checkpoint import NormStats, load_pi0, save_openpi
    from rlinf_user.policies.pi0_model import Pi0Config, Pi0Model

    torch.manual_seed(0)
    stats = {k: NormStats(np.zeros(32, np.float32), np.ones(32, np.float32)) for k in ("state", "actions")}
    folder = save_openpi(Pi0Model(Pi0Config.tiny(horizon=4)), tmp_path / "pi0_folder", stats)
    run_dir, p, summary = run(vla_ppo_cfg(tmp_path, "maniskill", 1, 64, "env.task=PushCube-v1", "env.cameras=[base_camera]",
                                          "policy=pi0", f"policy.checkpoint={folder}", "eval_episodes=1"))  # fmt: skip
    assert p.env_steps == 64 and p.updates == 2 and summary["final_eval_success"] is not None
    ckpt = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))[-1]
    trained = torch.load(ckpt, weights_only=True)["agent"]["policy"]
    start, _ = load_pi0(folder)
    same, moved = [], []
    for key, value in start.state_dict().items():
        match = [k for k in trained if k.endswith("model." + key)]
        if len(match) != 1:
            continue
        (same if torch.equal(trained[match[0]], value) else moved).append(key)
    assert len(same) > 10, f"the run's weights do not match the folder's keys: {list(trained)[:5]}"
    assert not [k for k in moved if "paligemma_with_expert.paligemma." in k], moved[:5]  # the VLM is frozen
    assert [k for k in moved if "gemma_expert" in k], "PPO left the action expert at the folder's weights"
