"""What the policy's sampling costs its episodes: each checkpoint of a run, acting on its mean
(what evaluations run) and sampled (what training episodes run), on the same held-out
positions, and sampled on some dimensions only (the arm's motion, or the gripper alone).

Trains the run first when it is not there yet (the pick from pixels by default, the
recipe's overrides and any more given), keeping a checkpoint every ``--every`` env steps:

    python benchmarks/sampled_actions.py --name sampled_pixels_scheduled --seed 2 --steps 4000 \\
        algo.autotune_temperature=false algo.init_temperature=0.03 algo.final_temperature=0.005 \\
        algo.temperature_decay_updates=20000

Writes ``results/<name>.json``: per checkpoint and way of acting, the success over
``--episodes`` positions (with the count of distinct positions and the 95% interval), the mean
absolute gap between the sampled and the mean action per dimension, and how often the sampled
gripper command has the other sign than the mean's (the gripper opens or closes on that sign).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
WAYS = {"mean": [], "sampled": slice(None), "sampled_arm": slice(0, -1), "sampled_gripper": [-1]}


class Mixed:
    """The policy acting on its mean, its samples taken on ``dims`` (the gaps recorded)."""

    def __init__(self, policy, dims):
        self.policy, self.dims, self.horizon = policy, dims, policy.horizon
        self.means: list[np.ndarray] = []
        self.samples: list[np.ndarray] = []

    def act(self, obs, deterministic: bool = True):
        with torch.no_grad():
            mean = self.policy.act(obs, deterministic=True)
            sample = self.policy.act(obs, deterministic=False)
        actions = mean.actions.clone()
        actions[..., self.dims] = sample.actions[..., self.dims]
        width = actions.shape[-1]
        self.means.append(mean.actions.numpy().reshape(-1, width))
        self.samples.append(sample.actions.numpy().reshape(-1, width))
        mean.actions = actions
        return mean


def train(run: Path, sim: str, seed: int, steps: int, every: int, overrides: list[str]) -> None:
    from rlinf_user.cli.main import main

    demos = run.parent / f"demos_s{seed}"
    if not (demos / "meta" / "info.json").exists():
        rc = main(["teleop", "--sim", sim, "teleop=synthetic", f"dataset.root={demos}", "dataset.episodes=20", f"seed={seed}"])
        if rc != 0:
            raise SystemExit(f"recording demonstrations exited {rc}")
    rc = main(["train", "--sim", sim, f"seed={seed}", "algo=rlpd", f"demos={demos}", f"total_env_steps={steps}",
               "eval_every_steps=1000000", "eval_at_start=false", f"checkpoint_every_steps={every}", "keep_checkpoints=0",
               f"run_root={run.parent}", f"run_name={run.name}", "progress=false", *overrides])  # fmt: skip
    if rc != 0:
        raise SystemExit(f"train exited {rc}")


def measure(run: Path, episodes: int, offset: int) -> dict:
    from omegaconf import OmegaConf

    from rlinf_user.cli.evaluate import _envs
    from rlinf_user.config.schema import RunConfig
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.evaluation import checkpoint_spec, evaluate_policy, load_policy_from_checkpoint
    from rlinf_user.seeds import episode_seed

    cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(run / "config.yaml"))
    out = {}
    for ckpt in sorted((run / "checkpoints").glob("ckpt-*.pt")):
        envs = _envs(cfg.env, cfg, episodes)
        try:
            spec = checkpoint_spec(ckpt) or EnvSpec.of_env(envs[0])
            policy, version = load_policy_from_checkpoint(ckpt, cfg, spec)
            rows = {}
            for way, dims in WAYS.items():
                mixed = Mixed(policy, dims)
                r = evaluate_policy(envs, mixed, episodes, 0, seed=episode_seed("test") + offset)
                means, samples = np.concatenate(mixed.means), np.concatenate(mixed.samples)
                rows[way] = {
                    "success_rate": r["success_rate"], "success_ci95": r["success_ci95"], "episodes": r["episodes"],
                    "distinct_initial_states": r["distinct_initial_states"], "mean_length": round(r["mean_length"], 1),
                    "sample_gap_per_dim": np.abs(samples - means).mean(0).round(4).tolist(),
                    "gripper_sign_flips": round(float((np.sign(samples[:, -1]) != np.sign(means[:, -1])).mean()), 4),
                }  # fmt: skip
                print(f"{ckpt.name} (v{version}) {way}: {r['success_rate']:.0%} {rows[way]['sample_gap_per_dim']}", flush=True)
            out[ckpt.stem] = {"policy_version": version, **rows}
        finally:
            for env in envs:
                env.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--sim", default="gym_hil_pixels")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--every", type=int, default=2000, help="env steps between the checkpoints measured")
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--offset", type=int, default=5000, help="test seeds from this offset: positions no run used")
    ap.add_argument("--run", type=Path, help="measure this run's checkpoints instead of training one")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    work = None
    if args.run is None:
        work = Path(tempfile.mkdtemp(prefix="sampled-actions-"))
        args.run = work / f"run_s{args.seed}"
        train(args.run, args.sim, args.seed, args.steps, args.every, args.overrides)
    try:
        result = {"machine": describe(), "sim": args.sim, "seed": args.seed, "steps": args.steps,
                  "overrides": args.overrides, "episodes": args.episodes, "checkpoints": measure(args.run, args.episodes, args.offset)}  # fmt: skip
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS / (args.name + '.json')}")


if __name__ == "__main__":
    main()
