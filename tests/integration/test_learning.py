"""Learning is real: a shortened SAC run on ManiSkill PushCube-v1 (state, translation-only
end-effector control) with fixed seeds must reach a stated evaluation success rate.

This goes through the whole runtime (Ray env worker, learner, weight store, persistent
replay, evaluation worker). It asserts success, never a loss value.
"""

import json

import pytest

pytest.importorskip("mani_skill")

from rlinf_user.config.compose import compose_config, validate  # noqa: E402
from rlinf_user.rundir import create_run_dir  # noqa: E402
from rlinf_user.runtime.trainer import Trainer  # noqa: E402

SUCCESS_THRESHOLD = 0.75


@pytest.mark.slow
def test_sac_learns_pushcube(tmp_path):
    import ray

    cfg = compose_config(
        [
            "env.task=PushCube-v1",
            "seed=1",
            "total_env_steps=90000",
            f"target_success={SUCCESS_THRESHOLD}",  # stop as soon as the stated rate is met
            "eval_every_steps=5000",
            "eval_episodes=20",
            "algo.learning_starts=2000",
            f"run_root={tmp_path}",
            "run_name=pushcube",
            "progress=false",
        ],
        sim="maniskill",
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
    print("PushCube learning:", json.dumps(progress.history))
    assert summary["best_eval_success"] >= SUCCESS_THRESHOLD, progress.history
    # the run kept the policy of its best evaluation, exactly: evaluated again on the same
    # episode seeds it scores what it scored then (the latest policy may have moved on)
    from rlinf_user.env.registry import make_env
    from rlinf_user.evaluation import checkpoint_spec, evaluate_policy, load_policy_from_checkpoint

    best = run_dir / "checkpoints" / "best.pt"
    assert summary["best"]["checkpoint"] == str(best) and summary["best"]["eval_success"] == summary["best_eval_success"]
    policy, version = load_policy_from_checkpoint(best, cfg, checkpoint_spec(best))
    assert version == summary["best"]["policy_version"]
    env = make_env(cfg.env, seed=cfg.seed)
    again = evaluate_policy(env, policy, cfg.eval_episodes)
    env.close()
    assert abs(again["success_rate"] - summary["best_eval_success"]) <= 0.1, (again, summary["best"])

