"""How well the pixel recipe's BC warm start generalises from its demonstrations, without a
simulator in the loop: each seed's demonstration set (40 spread pick demos through the front
and wrist cameras, as ``bench_pick_random.py --sim gym_hil_pixels --spread --demos 40``
records them) is split by episode, a fifth held out; the warm start (``algo.bc_warmup_updates``
batches, the frozen EfficientNet's feature maps, the pixel recipe's policy) trains on the rest,
and the squared error of its deterministic action is measured on the training rows and on the
held-out episodes. Variants: the recipe; ``algo.bc_feature_noise`` (Gaussian noise on the
feature maps during the warm start); ``algo.bc_warmup_updates``; and the mean action of the
recipe's clones from several training seeds (an ensemble).

    python benchmarks/clone_quality.py --demos-root <dir>   # records demos_s{0,1,2} there if absent

Writes ``benchmarks/results/clone_quality.json``. A clone's success in closed loop is measured by
the CLI itself, which stops after evaluating the starting policy with ``target_success=0``:

    rlinf-user train --sim gym_hil_pixels algo=rlpd demos=<dir>/demos_s1 seed=1 eval_at_start=true \\
        target_success=0 eval_episodes=30 test_episodes=0
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
CAMERAS = {"front": (128, 128), "wrist": (128, 128)}
HELD_OUT_SPLIT_SEED = 1234  # the same held-out episodes for every variant and training seed
VARIANTS = {"recipe": [], "feature_noise_0.3": ["algo.bc_feature_noise=0.3"],
            "feature_noise_1.0": ["algo.bc_feature_noise=1.0"], "updates_500": ["algo.bc_warmup_updates=500"]}  # fmt: skip


def load_rows(demos: Path, cfg) -> dict[str, np.ndarray]:
    from rlinf_user.policies.frame_features import frame_feature_settings
    from rlinf_user.runtime.learning.replay_service import featurize_buffer, load_demo_buffer

    buf = featurize_buffer(load_demo_buffer(str(demos), list(CAMERAS)), frame_feature_settings(cfg))
    return {k: v[: buf.size] for k, v in buf.storage.items()}


def clone(rows: dict[str, np.ndarray], train_idx: np.ndarray, overrides: list[str], seed: int, spec):
    """The warm start as the learner runs it (Algorithm.warm_start), on the training rows."""
    from rlinf_user.algorithms.base import build_algorithm
    from rlinf_user.config.compose import compose_config
    from rlinf_user.runtime.learning.device_batches import replay_batch

    cfg = compose_config(["algo=rlpd", f"seed={seed}", *overrides], sim="gym_hil_pixels")
    torch.manual_seed(seed)
    algo = build_algorithm(cfg.algo, cfg.policy, spec, "cpu")
    rng = np.random.default_rng(seed)
    updates, batch = int(cfg.algo.bc_warmup_updates), int(cfg.algo.batch_size)

    def batches():
        for _ in range(updates):
            pick = rng.choice(train_idx, batch)  # one draw of rows for every column
            yield replay_batch({k: v[pick] for k, v in rows.items()}, spec, "cpu")

    algo.warm_start(batches())
    return algo.policy


@torch.no_grad()
def actions(policy, rows: dict[str, np.ndarray], idx: np.ndarray, spec) -> tuple[np.ndarray, np.ndarray]:
    from rlinf_user.env.spec import Col
    from rlinf_user.runtime.learning.device_batches import replay_batch

    b = replay_batch({k: v[idx] for k, v in rows.items()}, spec, "cpu")
    mean, _ = policy.actor(policy.encoder(b[Col.OBS]))
    return torch.tanh(mean).numpy(), b[Col.ACTION].clamp(-0.999, 0.999).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demos-root", required=True, help="holds demos_s<seed>/ (recorded there if absent)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="demonstration sets (teleop seeds)")
    ap.add_argument("--train-seeds", type=int, default=3, help="training seeds of the recipe per set (the ensemble)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--name", default="clone_quality")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import bench_pick_random as bench

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.spec import EnvSpec

    bench.SIM[0] = "gym_hil_pixels"
    spec = EnvSpec(state_dim=18, cameras=CAMERAS, active_dims=(0, 1, 2, 6), contract_action_dim=7)
    out = []
    for s in args.seeds:
        demos = Path(args.demos_root) / f"demos_s{s}"
        if not (demos / "meta" / "info.json").exists():
            bench.record_demos(demos, s, 40, spread=True)
        rows = load_rows(demos, compose_config(["algo=rlpd"], sim="gym_hil_pixels"))
        episode = np.cumsum(rows["step"].reshape(-1) == 0) - 1
        n = int(episode.max()) + 1
        held = np.random.default_rng(HELD_OUT_SPLIT_SEED).choice(n, size=n // 5, replace=False)
        test_idx, train_idx = np.where(np.isin(episode, held))[0], np.where(~np.isin(episode, held))[0]
        preds: dict[str, list[np.ndarray]] = {}
        for v in args.variants:
            for k in range(args.train_seeds if v == "recipe" else 1):
                t0 = time.perf_counter()
                policy = clone(rows, train_idx, VARIANTS[v], s + 100 * k, spec)
                (pred, target), (pt, tt) = actions(policy, rows, test_idx, spec), actions(policy, rows, train_idx, spec)
                preds.setdefault(v, []).append(pred)
                row = {"demo_set": s, "variant": v, "train_seed": s + 100 * k, "episodes": n, "held_out_episodes": len(held),
                       "held_out_mse": float(((pred - target) ** 2).mean()),
                       "held_out_mse_per_dim": ((pred - target) ** 2).mean(0).round(5).tolist(),
                       "train_mse": float(((pt - tt) ** 2).mean()), "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
                out.append(row)
                print(json.dumps(row), flush=True)
        if len(preds.get("recipe", [])) > 1:
            ens = np.mean(preds["recipe"], 0)
            out.append({"demo_set": s, "variant": f"ensemble_of_{len(preds['recipe'])}_recipe", "episodes": n,
                        "held_out_episodes": len(held), "held_out_mse": float(((ens - target) ** 2).mean())})  # fmt: skip
            print(json.dumps(out[-1]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({
        "what": "pixel pick (gym_hil_pixels), BC warm start on 4/5 of each seed's 40 spread demos, action MSE on the held-out fifth",
        "machine": describe(), "date": time.strftime("%Y-%m-%d"), "rows": out}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
