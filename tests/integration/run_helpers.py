"""Short training runs shared by the runtime tests: a small config on the kinematic reach
sim (the runtime is what these tests exercise; the simulator backends have their own
tests) and the transitions a run left in its buffer."""

import numpy as np

from rlinf_user.config.compose import compose_config, validate
from rlinf_user.data.record_log import RecordLog


def short_cfg(tmp_path, *extra, sim: str = "reach"):
    """1200 env steps of reach (or another sim: ManiSkill's PushCube with ``sim="maniskill"``) with a
    small MLP, evaluated and checkpointed twice; ``extra`` overrides come last, so they win."""
    task = ["env.task=PushCube-v1"] if sim == "maniskill" else []
    cfg = compose_config(
        [
            *task,
            "total_env_steps=1200",
            "algo.learning_starts=300",
            "algo.batch_size=64",
            "policy.hidden=[64,64]",
            "eval_every_steps=600",
            "eval_episodes=2",
            "checkpoint_every_steps=600",
            "publish_every_updates=10",
            "buffer.chunk_steps=25",
            f"run_root={tmp_path}",
            "run_name=r",
            "progress=false",
            *extra,
        ],
        sim=sim,
    )
    validate(cfg)
    return cfg


def transitions(run_dir):
    """Every transition in the run's on-disk buffer, concatenated per field."""
    chunks = list(RecordLog(run_dir / "buffer").read_all())
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
