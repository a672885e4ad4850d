"""Where every random stream of a run starts, named (one place, no magic offsets).

Evaluation is held out by construction: its reset seeds start at ``EVAL_EPISODE_SEED``
(10^9), and every stream that trains (workers, their envs, restarts, GRPO groups,
recorded demonstrations) stays below it for any run seed under ``MAX_RUN_SEED``
(``tests/unit/test_seeds.py`` checks the bounds).
"""

from __future__ import annotations

WORKER_STRIDE = 7919  # env worker i (i >= 0) starts at seed + WORKER_STRIDE * (i + 1)
RESTART_STRIDE = 104_729  # a replaced worker (generation g) moves on by this much per g
EVAL_WORKER_OFFSET = 999_983  # the simulator evaluation worker's own envs
EVAL_WORKER_ID = 999  # its worker id (env ids 999_000...)
MAX_RUN_SEED = 10_000_000  # a run's seed is below this (config validation refuses others)
EVAL_EPISODE_SEED = 1_000_000_000  # evaluation episode k resets with this + k (held out)
EVAL_ENV_OFFSET = 12_345  # `rlinf-user eval`'s env construction seed (its episodes: EVAL_EPISODE_SEED + k)
DEMO_EPISODE_OFFSET = 10_000  # synthetic demonstrations record from seed + this + k
ENV_IN_BATCH_STRIDE = 1000  # env j of a worker's batch resets with seed + this * j
GROUP_SEED_OFFSET = 7_777_777  # GRPO reset seeds: a separate stream from training resets


def worker_seed(run_seed: int, index: int, generation: int = 0) -> int:
    return int(run_seed) + WORKER_STRIDE * (index + 1) + RESTART_STRIDE * generation


def eval_worker_seed(run_seed: int) -> int:
    return int(run_seed) + EVAL_WORKER_OFFSET


def group_seed(run_seed: int, worker_id: int, group: int, episode: int) -> int:
    """The reset seed shared by the ``episode``-th episode of every env in ``group`` (GRPO)."""
    return (int(run_seed) + GROUP_SEED_OFFSET + 1_000_003 * worker_id + 10_007 * group + episode) % EVAL_EPISODE_SEED


def group_id(worker_id: int, group: int, episode: int) -> int:
    """A run-unique id of that group of episodes."""
    return (worker_id * 1000 + group) * 10_000_000 + episode
