"""DSRL's update over lite_vla with the base's embedding (``algo.noise_encoder.encoder=base``),
with DrQ shifting only the frames its encoders read (none) against shifting every frame (what
updates did before), side by side in one run, alternated.

    python benchmarks/bench_dsrl_update.py --repeats 3 --updates 40
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    import torch

    from rlinf_user.algorithms.base import build_algorithm
    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import Col, EnvSpec, columns_to_torch, flat_obs, stack_obs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--updates", type=int, default=40)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "dsrl_update.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = compose_config(["algo=dsrl", "policy=lite_vla", "policy.vlm_layers=4", "algo.noise_encoder.encoder=base",
                          f"algo.batch_size={args.batch}"], sim="reach_color")  # fmt: skip
    env = make_env(cfg.env, seed=0)
    spec = EnvSpec.of_env(env)
    algo = build_algorithm(cfg.algo, cfg.policy, spec)  # an untrained base: the update's cost is the same
    p, b = algo.policy, args.batch
    obs = [env.reset(seed=s)[0] for s in range(b)]
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(b, p.base.embedding_dim)).astype(np.float32)
    cols = {**flat_obs(Col.OBS, stack_obs(obs)), **flat_obs(Col.NEXT_OBS, stack_obs(obs[1:] + obs[:1])),
            Col.REWARD: np.ones(b, np.float32), Col.TERMINATED: np.zeros(b, np.float32),
            Col.NOISE: rng.uniform(-1, 1, (b, p.noise_dim)).astype(np.float32),
            f"{Col.OBS}/{Col.EMBEDDING}": emb, f"{Col.NEXT_OBS}/{Col.EMBEDDING}": emb}  # fmt: skip
    batch = columns_to_torch(cols)
    algo.num_updates = 1  # past the first update's one-off noise-authority probe
    variants = {"shift_read_frames": algo.augmented, "shift_every_frame": None}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, cams in variants.items():
            algo.augmented = cams
            for _ in range(3):
                algo.update(batch)
            for _ in range(args.updates):
                t = time.perf_counter()
                algo.update(batch)
                times[name].append(time.perf_counter() - t)
    out = {"what": f"one DSRL update (lite_vla base embedding, batch {b}, {args.threads} thread): DrQ on the frames "
                   "the encoders read (none) vs on every frame, alternated",
           "repeats": args.repeats, "updates_per_repeat": args.updates,
           "ms": {k: {"median": round(1000 * float(np.median(v)), 2), "p99": round(1000 * float(np.percentile(v, 99)), 2)}
                  for k, v in times.items()},
           "machine": describe()}  # fmt: skip
    print(json.dumps(out["ms"]))
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
