"""How far can a frozen flow policy's noise take it? The ceiling of DSRL over a base.

DSRL only chooses the base's input noise, so it can succeed on a state only where some
noise makes the base succeed. For each of ``--states`` held-out reach_color states this runs
the frozen base from ``--draws`` noise sequences (each chunk's noise drawn uniformly from
DSRL's box, ``noise_max`` times the unit box, in the dims DSRL steers), all draws of a state
side by side as one batch, and counts:

* ``zero``: the deterministic clone (zero noise), what the base does unsteered;
* ``any``: states where at least one draw succeeded: a lower bound on what a noise actor that
  knew each state's best noise could reach (its ceiling is at least this);
* ``mean``: the draws' success rate (a noise actor that learned nothing but the box).

``--noise per_episode`` holds one draw for a whole episode (a steady push the same way),
``per_chunk`` (the default) draws afresh for every chunk.

    python benchmarks/vla_noise_reach.py <dsrl run dir> --states 30 --draws 16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from bench_vla_learning import wilson
from chunk_episodes import report, run_side_by_side


def main() -> None:
    import torch
    from omegaconf import OmegaConf

    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import EnvSpec, obs_to_torch, stack_obs
    from rlinf_user.policies.base import build_policy
    from rlinf_user.seeds import episode_seed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a DSRL run directory (its config names the base checkpoint)")
    ap.add_argument("--states", type=int, default=30)
    ap.add_argument("--draws", type=int, default=16)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--noise", choices=["per_chunk", "per_episode"], default="per_chunk",
                    help="a fresh draw for every chunk, or one draw held for the whole episode")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--box", type=float, default=None, help="the noise box (default: the run's algo.noise_max)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    cfg = OmegaConf.load(Path(args.run) / "config.yaml")
    envs = [make_env(cfg.env, seed=i) for i in range(args.draws + 1)]
    spec = EnvSpec.of_env(envs[0])
    steered = build_policy(cfg.policy, spec).eval()
    base, box = steered.base, float(args.box if args.box is not None else steered.noise_max)
    h, a = steered.noise_shape
    rng = np.random.default_rng(0)
    s0 = episode_seed(args.split)
    per_state = []
    for i in range(args.states):
        obs = [e.reset(seed=s0 + i)[0] for e in envs]
        held = rng.uniform(-box, box, (len(envs), h, a)).astype(np.float32)

        def chunks(idx, live_obs, k, held=held):
            fresh = rng.uniform(-box, box, (len(envs), h, a)).astype(np.float32)
            noise = (held if args.noise == "per_episode" else fresh)[idx].copy()
            noise[idx == 0] = 0.0  # env 0: the clone, zero noise
            with torch.no_grad():
                return base.act_from_noise(obs_to_torch(stack_obs(live_obs)), torch.from_numpy(noise)).numpy()

        won = run_side_by_side(envs, spec, obs, chunks)
        per_state.append({"zero": bool(won[0]), "draws_won": int(won[1:].sum())})
        print(json.dumps({"state": i, **per_state[-1]}), flush=True)
    n = len(per_state)
    zero = sum(s["zero"] for s in per_state)
    anyw = sum(s["draws_won"] > 0 for s in per_state)
    draws = sum(s["draws_won"] for s in per_state)
    out = {"what": "success of the frozen base from random noises in DSRL's box, per held-out state",
           "run": Path(args.run).name, "base_checkpoint": Path(str(cfg.policy.get("base_checkpoint"))).name,
           "split": args.split, "states": n, "draws_per_state": args.draws, "noise_box": box, "noise": args.noise,
           "zero_noise": {"successes": zero, "rate": round(zero / n, 3), "ci95": wilson(zero, n)},
           "any_draw": {"states": anyw, "rate": round(anyw / n, 3), "ci95": wilson(anyw, n)},
           "mean_draw": round(draws / (n * args.draws), 3), "per_state": per_state,
           "wall_s": round(time.time() - t0, 1)}  # fmt: skip
    report(out, args.out)


if __name__ == "__main__":
    main()
