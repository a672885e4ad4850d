"""Where every random stream of a run starts, named (one place, no magic offsets).

Evaluation is held out by construction, in two ranges that nothing trains on: every
stream that trains (workers, their envs, restarts, GRPO groups, recorded demonstrations)
stays below ``VALIDATION_EPISODE_SEED`` (10^9) for any run seed under ``MAX_RUN_SEED``
(``tests/unit/test_evaluation.py`` checks the bounds).

* **validation** (episode k: 10^9 + k): the evaluations during training and the choice of
  ``best.pt`` among them;
* **test** (episode k: 1.5 x 10^9 + k): the end-of-run report of the kept policy and
  ``rlinf-user eval`` by default. Nothing ever selects on it, so its figure is not the
  maximum over many evaluations of one set.
"""

from __future__ import annotations

WORKER_STRIDE = 7919  # env worker i (i >= 0) starts at seed + WORKER_STRIDE * (i + 1)
RESTART_STRIDE = 104_729  # a replaced worker (generation g) moves on by this much per g
EVAL_WORKER_OFFSET = 999_983  # the simulator evaluation worker's own envs
EVAL_WORKER_ID = 999  # its worker id (env ids 999_000...)
MAX_RUN_SEED = 10_000_000  # a run's seed is below this (config validation refuses others)
VALIDATION_EPISODE_SEED = 1_000_000_000  # training's evaluation episode k resets with this + k
TEST_EPISODE_SEED = 1_500_000_000  # the kept policy's report and `rlinf-user eval`: this + k
EPISODE_SEEDS = {"validation": VALIDATION_EPISODE_SEED, "test": TEST_EPISODE_SEED}
EVAL_ENV_OFFSET = 12_345  # `rlinf-user eval`'s env construction seed (its episodes: a split's seed + k)
DEMO_EPISODE_OFFSET = 10_000  # HG-DAgger's synthetic demonstrations record from seed + this + k
# `rlinf-user teleop seed=s`: episode k resets with (s x this + k) mod 10^9, so each run seed
# records its own scenes (seed + k gave seeds 0, 1 and 2 19 of 20 block positions in common)
TELEOP_SEED_STRIDE = 1000
ENV_IN_BATCH_STRIDE = 1000  # env j of a worker's batch resets with seed + this * j
GROUP_SEED_OFFSET = 7_777_777  # GRPO reset seeds: a separate stream from training resets


def worker_seed(run_seed: int, index: int, generation: int = 0) -> int:
    return int(run_seed) + WORKER_STRIDE * (index + 1) + RESTART_STRIDE * generation


def teleop_episode_seed(run_seed: int, episode: int) -> int:
    """The reset seed of a teleop session's ``episode``-th episode (a simulator's scene; a
    robot ignores it): seed 0 records from 0, seed s from s x 1000, below the held-out ranges."""
    return (int(run_seed) * TELEOP_SEED_STRIDE + int(episode)) % VALIDATION_EPISODE_SEED


def eval_worker_seed(run_seed: int) -> int:
    return int(run_seed) + EVAL_WORKER_OFFSET


def group_seed(run_seed: int, worker_id: int, group: int, episode: int) -> int:
    """The reset seed shared by the ``episode``-th episode of every env in ``group`` (GRPO)."""
    return (int(run_seed) + GROUP_SEED_OFFSET + 1_000_003 * worker_id + 10_007 * group + episode) % VALIDATION_EPISODE_SEED


def group_id(worker_id: int, group: int, episode: int) -> int:
    """A run-unique id of that group of episodes."""
    return (worker_id * 1000 + group) * 10_000_000 + episode


def episode_seed(split: str) -> int:
    """The first reset seed of a held-out ``split`` (validation or test)."""
    if split not in EPISODE_SEEDS:
        raise ValueError(f"split={split!r}: validation (training's evaluations, best.pt) or test (reports)")
    return EPISODE_SEEDS[split]
