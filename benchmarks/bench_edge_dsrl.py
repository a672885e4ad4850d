"""DSRL over the pi0 architecture on the (simulated) Franka, end to end through the edge
daemon, with chunks run at the edge.

One seed, three stages, all against ``rlinf-user edge --robot franka franky_sim=true`` (the
real franky client driving franky-sim's MuJoCo Franka over the libfranka protocol, in the
daemon's control-loop process, at 10 Hz):

1. **Demonstrations through the edge.** A scripted operator drives the robot's reach task
   (``configs/robot/franka.yaml``: a goal box of 15 x 20 x 12 cm, success within 3 cm)
   through the same remote env a training run uses. It is an imperfect operator, as a
   person is: each episode it moves towards the goal at its own gain (uniform in
   ``--gain``), with per-step noise, so its demonstrations differ in speed and path.
2. **A pretrained base.** ``policy=pi0`` (the pi0 architecture, ``size=tiny``: the same
   PaliGemma-style prefix and flow-matching action expert, scaled down for a CPU) is
   behaviour-cloned on them (chunks of ``--horizon`` actions) and saved.
3. **Noise-space RL on the robot.** ``algo=dsrl`` freezes that base and trains a small
   noise actor and its critics online, on the robot, through the edge daemon: each chunk
   the base produces from the actor's noise is streamed to the daemon, which runs it on its
   own control clock (``env.edge.stream_chunks``); the steps it ran come back and the env
   worker folds them into one transition with their discounted rewards.

Evaluations are on distinct held-out goals (validation during training; the kept policy
on the test goals); the run's first evaluation is the clone itself (zero noise). The
daemon's telemetry gives the robot's duty cycle and the chunk counters.

    python benchmarks/bench_edge_dsrl.py --seed 0
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_vla_learning import add_windows
from machine import describe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

RESULTS = Path(__file__).resolve().parent / "results"
HISTORY_KEYS = ("env_steps", "wall_seconds", "updates", "policy_version", "success_rate", "ci95_low", "ci95_high",
                "distinct_states")  # fmt: skip


def operator_chunks(env, spec, horizon: int, episodes: int, rng: np.random.Generator, gain, noise: float):
    """Demonstrations of an imperfect scripted operator through the remote robot env: per
    step the observation, the next ``horizon`` actions of the episode and which exist.

    The operator sees what the policy sees: the reach task appends goal - tcp (metres) to
    the state, and one action unit moves the TCP by the edge's ``max_translation``."""
    step = float(env.unwrapped.action_spec.max_translation)
    obs_l, chunks, valid, successes = [], [], [], 0
    for _ in range(episodes):
        o, _ = env.reset(seed=int(rng.integers(1 << 30)))
        g = rng.uniform(*gain)
        seen, acts, info = [], [], {"success": False}
        while True:
            delta = np.asarray(o["state"][-3:], dtype=np.float64)
            a = np.clip(g * delta / step + rng.normal(0.0, noise, 3), -1, 1).astype(np.float32)
            seen.append(o)
            acts.append(a)
            o, _, term, trunc, info = env.step(spec.expand_action(a))
            if term or trunc:
                break
        successes += bool(info.get("success"))
        add_windows(seen, acts, horizon, obs_l, chunks, valid)
    return obs_l, np.stack(chunks), np.stack(valid), successes


def clone_pi0(cfg, env, args, rng) -> tuple[object, dict]:
    import torch

    from rlinf_user.env.spec import EnvSpec, obs_to_torch, stack_obs
    from rlinf_user.policies.base import build_policy

    spec = EnvSpec.of_env(env)
    torch.manual_seed(args.seed)
    policy = build_policy(cfg.policy, spec)
    t0 = time.time()
    obs_l, chunks, valid, wins = operator_chunks(env, spec, policy.horizon, args.demos, rng, args.gain, args.noise)
    demo_s = time.time() - t0
    state = obs_to_torch(stack_obs(obs_l))["state"]
    target, mask = torch.from_numpy(chunks), torch.from_numpy(valid)
    policy.fit_normalizer(state)
    opt = torch.optim.AdamW([q for q in policy.parameters() if q.requires_grad], lr=args.lr)
    t0 = time.time()
    for _ in range(args.updates):
        idx = torch.randint(0, len(target), (args.batch,))
        policy.train()
        loss = policy.bc_loss({"state": state[idx]}, target[idx], mask[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    policy.eval()
    # the clone itself (zero noise) on the test goals the kept DSRL policy is scored on
    from rlinf_user.evaluation import evaluate_policy
    from rlinf_user.seeds import episode_seed

    train_s = time.time() - t0
    test = evaluate_policy(env, policy, args.test_states, seed=episode_seed("test"), split="test")
    info = {"test_eval": {k: test[k] for k in ("split", "episodes", "distinct_initial_states", "successes",
                                               "success_rate", "success_ci95")},
            "episodes": args.demos, "operator_successes": wins, "samples": len(target), "demo_s": round(demo_s, 1),
            "updates": args.updates, "final_loss": round(float(loss.detach()), 4), "train_s": round(train_s, 1)}  # fmt: skip
    return {"policy": policy.state_dict(), "spec": spec.to_dict()}, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--horizon", type=int, default=8)
    ap.add_argument("--demos", type=int, default=20, help="operator episodes")
    ap.add_argument("--gain", type=float, nargs=2, default=[0.3, 1.0], help="the operator's per-episode gain range")
    ap.add_argument("--noise", type=float, default=0.3, help="the operator's per-step action noise (std)")
    ap.add_argument("--updates", type=int, default=400)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--steps", type=int, default=3000, help="DSRL env steps")
    ap.add_argument("--eval-every", type=int, default=600)
    ap.add_argument("--eval-states", type=int, default=20, help="validation goals per evaluation during training")
    ap.add_argument("--test-states", type=int, default=30, help="test goals for the kept policy, after training")
    ap.add_argument("--target", type=float, default=1.01, help="stop at this validation success (1.01: run on)")
    ap.add_argument("--work", help="where the clone and the run go (a clone there is reused)")
    ap.add_argument("--out", default=str(RESULTS / "edge_dsrl_pi0_franky_sim.json"))
    ap.add_argument("overrides", nargs="*", help="more key=value for the DSRL run")
    args = ap.parse_args()

    import torch
    from bench_robot_training import train_through_edge
    from edge_helpers import EdgeProcess, free_ports

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_env

    work = Path(args.work or tempfile.mkdtemp(prefix="edge-dsrl-"))
    work.mkdir(parents=True, exist_ok=True)
    port = free_ports(3)
    edge = EdgeProcess(["--robot", "franka", "franky_sim=true", f"robot.ip=127.0.0.{70 + args.seed}",
                        f"control_hz={args.hz}", "robot.relative_dynamics_factor=0.5", "robot.home_timeout_s=120"], port, work / "edge.log")  # fmt: skip
    common = ["env.edge.host=127.0.0.1", f"env.edge.port={port}", f"seed={args.seed}", "policy=pi0",
              f"policy.horizon={args.horizon}"]  # fmt: skip
    base = work / f"clone_s{args.seed}.pt"
    info_path = work / f"clone_s{args.seed}.json"
    try:
        if not base.exists():
            cfg = compose_config(common, robot="franka")
            env = make_env(cfg.env, seed=10_000 + args.seed)  # the operator's goals: not the evaluation's
            try:
                state, info = clone_pi0(cfg, env, args, np.random.default_rng(10_000 + args.seed))
            finally:
                env.close()
            torch.save(state, base)
            info_path.write_text(json.dumps(info))
        clone = json.loads(info_path.read_text())
        print("clone:", json.dumps(clone), flush=True)
        cfg = compose_config(
            [*common, "algo=dsrl", f"algo.base_checkpoint={base}", f"total_env_steps={args.steps}",
             f"eval_every_steps={args.eval_every}", f"eval_episodes={args.eval_states}", "eval_at_start=true",
             f"target_success={args.target}", f"run_root={work}", f"run_name=dsrl_s{args.seed}", "progress=false",
             *args.overrides],
            robot="franka",
        )  # fmt: skip
        t0 = time.time()
        run_dir, summary, start, end = train_through_edge(cfg, port)
        wall = time.time() - t0
        # the kept policy on the test goals (no evaluation during training used them); a run
        # on a robot does not do this itself: it costs the robot's time
        from rlinf_user.cli.main import main as cli

        if cli(["eval", str(run_dir), "--episodes", str(args.test_states), "--out", str(work / "test")]) != 0:
            raise SystemExit("the test evaluation failed")
        test = json.loads((work / "test" / "eval-best.json").read_text())
    finally:
        edge.close()
    with open(run_dir / "eval" / "history.csv") as f:
        history = [{k: float(v) for k, v in row.items() if k in HISTORY_KEYS and v != ""} for row in csv.DictReader(f)]
    window = (end["uptime_s"] - start["uptime_s"]) - (end["reset_seconds"] - start["reset_seconds"])
    out = {
        "what": "DSRL over a frozen pi0-architecture policy (size tiny) behaviour-cloned on an imperfect scripted "
                "operator's reach demonstrations recorded through the edge daemon; franky-sim Franka at "
                f"{args.hz:g} Hz, chunks of {args.horizon} streamed to and run by the daemon; success within 3 cm over "
                "distinct held-out goals (validation during training, test for the kept policy)",
        "seed": args.seed,
        "operator": {"gain": args.gain, "noise": args.noise},
        "clone": clone,
        "overrides": [*common, "algo=dsrl", *args.overrides],
        "wall_s": round(wall, 1),
        "history": history,
        "clone_eval": history[0] if history else None,
        "best_eval_success": summary.get("best_eval_success"),
        "test_eval": {k: test.get(k) for k in ("split", "episodes", "distinct_initial_states", "successes",
                                               "success_rate", "success_ci95", "policy_version", "checkpoint")},
        "env_steps": summary.get("env_steps"),
        "updates": summary.get("updates"),
        "edge": {
            "duty_cycle": round((end["acted_ticks"] - start["acted_ticks"]) / (window * args.hz), 4) if window > 0 else None,
            "resets": end["resets"] - start["resets"],
            **{k: end.get(k) for k in ("chunks", "watchdog_holds", "safety", "period_error_ms_p99")},
        },
        "machine": describe(),
        "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("clone", "clone_eval", "best_eval_success", "test_eval", "edge")}, indent=2))


if __name__ == "__main__":
    main()
