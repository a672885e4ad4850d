"""Learner updates/s for the SAC family on state (MLP) observations, CPU.

Each variant: warm-up, then ``--repeats`` timed blocks of ``--updates`` updates; reports the
median and p99 update latency and the median updates/s.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from rlinf_user.algorithms.sac import SAC
from rlinf_user.config.compose import compose_config
from rlinf_user.data.replay import ReplayBuffer
from rlinf_user.runtime.learning.learner import unflatten_batch

STATE_DIM = 42  # PickCube-v1 state


def bench(overrides: list[str], threads: int, updates: int, repeats: int) -> dict:
    torch.set_num_threads(threads)
    cfg = compose_config(overrides)
    agent = SAC(cfg.algo, cfg.policy, STATE_DIM, {}, 7)
    rb = ReplayBuffer(20_000)
    n = 20_000
    rng = np.random.default_rng(0)
    rb.add({
        "obs/state": rng.standard_normal((n, STATE_DIM), dtype=np.float32),
        "next_obs/state": rng.standard_normal((n, STATE_DIM), dtype=np.float32),
        "action": rng.uniform(-1, 1, (n, 7)).astype(np.float32),
        "reward": rng.random(n, dtype=np.float32),
        "terminated": np.zeros(n, np.float32),
    })
    for _ in range(20):
        agent.update(unflatten_batch(rb.sample(cfg.algo.batch_size, rng), "cpu"))
    lat, rates = [], []
    for _ in range(repeats):
        t_block = time.perf_counter()
        for _ in range(updates):
            t = time.perf_counter()
            agent.update(unflatten_batch(rb.sample(cfg.algo.batch_size, rng), "cpu"))
            lat.append(time.perf_counter() - t)
        rates.append(updates / (time.perf_counter() - t_block))
    lat_ms = np.array(lat) * 1e3
    return {
        "config": " ".join(overrides) or "defaults",
        "torch_threads": threads,
        "updates_per_s_median": round(float(np.median(rates)), 1),
        "update_ms_median": round(float(np.median(lat_ms)), 2),
        "update_ms_p99": round(float(np.percentile(lat_ms, 99)), 2),
        "repeats": repeats,
    }


CASES = [
    ["algo=sac"],
    ["algo=sac", "algo.batch_size=128"],
    ["algo=crossq"],
    ["algo=rlpd", "algo.demo_ratio=0"],
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for overrides in CASES:
        for threads in (1, 2):
            rows.append(bench(overrides, threads, args.updates, args.repeats))
            print(json.dumps(rows[-1]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
