"""Short training runs shared by the runtime tests: a small PushCube config and the
transitions a run left in its buffer."""

import numpy as np

from rlinf_user.config.compose import compose_config, validate
from rlinf_user.data.record_log import RecordLog


def pushcube_cfg(tmp_path, *extra):
    """1200 env steps of PushCube with a small MLP, evaluated and checkpointed twice;
    ``extra`` overrides come last, so they win."""
    cfg = compose_config(
        [
            "env.task=PushCube-v1",
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
        sim="maniskill",
    )
    validate(cfg)
    return cfg


def transitions(run_dir):
    """Every transition in the run's on-disk buffer, concatenated per field."""
    chunks = list(RecordLog(run_dir / "buffer").read_all())
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
