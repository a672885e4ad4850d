"""Learning is real: shortened SAC runs with fixed seeds must reach a stated evaluation
success rate on goals they never trained from, through the whole runtime (Ray env
worker, learner, weight store, persistent replay, evaluation worker). They assert
success, never a loss value.

CI uses the kinematic reach sim (a goal drawn per episode), so the minutes go to learning
rather than to physics; SAC on ManiSkill PushCube, SAC-Flow and gym_hil's pick are
benchmarks (``benchmarks/time_to_success.py``, ``benchmarks/bench_hil_serl.py``); the
on-policy learners have theirs in ``test_on_policy.py``.
"""

import json

import pytest

from rlinf_user.config.compose import compose_config, validate  # noqa: E402
from rlinf_user.rundir import create_run_dir  # noqa: E402
from rlinf_user.runtime.orchestration.trainer import Trainer  # noqa: E402

SUCCESS_THRESHOLD = 0.9
EVAL_EPISODES = 20  # distinct goals per evaluation, from seeds training never uses


@pytest.mark.slow
def test_sac_learns_reach_on_distinct_goals(tmp_path):
    """3-step returns and a starting temperature of 0.1 (the default is 1.0): seeds 0, 1 and 2
    reached 95-100% at 8k env steps (3.4k updates; the temperature alone took seed 1 to 10k),
    where the defaults took seed 1 to 18k (8.4k updates); the budget leaves room."""
    import ray

    cfg = compose_config(
        [
            "seed=1",
            "total_env_steps=20000",
            "algo.n_step=3",
            "algo.init_temperature=0.1",
            "algo.paced=true",  # the reach sim outruns the learner: hold it to utd_ratio
            "algo.utd_ratio=0.5",
            "algo.batch_size=128",
            "policy.hidden=[128,128]",
            f"target_success={SUCCESS_THRESHOLD}",  # stop as soon as the stated rate is met
            "eval_every_steps=2000",
            f"eval_episodes={EVAL_EPISODES}",
            f"run_root={tmp_path}",
            "run_name=reach",
            "progress=false",
        ],
        sim="reach",
    )
    validate(cfg)
    run_dir = create_run_dir(cfg)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    trainer = Trainer(cfg, run_dir)
    try:
        progress = trainer.run()
    finally:
        trainer.close()
        ray.shutdown()
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    print("SAC reach learning:", json.dumps(progress.history))
    assert summary["best_eval_success"] >= SUCCESS_THRESHOLD, progress.history
    # paced: the sim waited for the learner (unpaced, 20k steps met 700 updates)
    assert progress.updates >= 0.5 * (progress.env_steps - 1000) - 1000, (progress.updates, progress.env_steps)
    # the run kept the policy of its best evaluation, exactly: evaluated again on the same
    # (validation) episode seeds it scores what it scored then (the latest policy may have
    # moved on); the end of the run reported it on the test seeds, which nothing selected on
    from rlinf_user.env.registry import make_env
    from rlinf_user.evaluation import checkpoint_spec, evaluate_policy, load_policy_from_checkpoint

    best = run_dir / "checkpoints" / "best.pt"
    assert summary["best"]["checkpoint"] == str(best) and summary["best"]["eval_success"] == summary["best_eval_success"]
    policy, version = load_policy_from_checkpoint(best, cfg, checkpoint_spec(best))
    assert version == summary["best"]["policy_version"]
    env = make_env(cfg.env, seed=cfg.seed)
    again = evaluate_policy(env, policy, cfg.eval_episodes, split="validation")
    test = evaluate_policy(env, policy, cfg.eval_episodes)
    env.close()
    assert abs(again["success_rate"] - summary["best_eval_success"]) <= 0.1, (again, summary["best"])
    reported = summary["test_eval"]
    assert reported["split"] == "test" and reported["policy"] == "best" and reported["policy_version"] == version
    assert abs(reported["success_rate"] - test["success_rate"]) <= 0.1 and reported["episodes"] == EVAL_EPISODES


@pytest.mark.slow
def test_the_default_job_learns_the_randomised_pick_from_20_demonstrations(tmp_path):
    """`make train` shortened: 20 scripted demonstrations recorded through the teleop path,
    then RLPD with the randomised pick's recipe until 90% of 20 held-out block positions,
    evaluated every 1,500 env steps (seed 0 reaches it at 2,800-3,400 in the benchmark's runs:
    evaluations every 2,500 left the test to run on to 5,000 when the one at 2,500 fell short)."""
    import csv

    from rlinf_user.cli.main import main

    demos = tmp_path / "demos"
    assert main(["teleop", "--sim", "gym_hil_random", "teleop=synthetic", f"dataset.root={demos}",
                 "dataset.episodes=20", "seed=0"]) == 0  # fmt: skip
    rc = main([
        "train", "--sim", "gym_hil_random", "algo=rlpd", f"demos={demos}", "seed=0", "target_success=0.9",
        f"eval_episodes={EVAL_EPISODES}", "eval_every_steps=1500", "total_env_steps=10000", "max_wall_minutes=8",
        f"run_root={tmp_path}", "run_name=pick", "progress=false",
    ])  # fmt: skip
    assert rc == 0
    with open(tmp_path / "pick" / "eval" / "history.csv") as f:
        history = list(csv.DictReader(f))
    print("RLPD randomised pick:", history)
    start, reached = history[0], [h for h in history if float(h["success_rate"]) >= SUCCESS_THRESHOLD]
    assert int(start["env_steps"]) == 0 and float(start["success_rate"]) < SUCCESS_THRESHOLD  # the clone alone falls short
    assert reached, history
    assert int(reached[0]["distinct_states"]) == EVAL_EPISODES and reached[0]["deterministic_reset"] == "0"
