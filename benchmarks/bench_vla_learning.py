"""What VLA training reaches on a CPU, measured on initial states training never saw.

* ``bc``: ``policy=lite_vla`` (real EfficientNet-Lite0 and SmolLM2 weights; 4 VLM layers,
  chunks of 4, the expert and projections trained) behaviour-cloned with the flow-matching
  loss on scripted demonstrations of ``reach_color`` (the instruction names the goal's
  colour; the state is the TCP alone). Success from the demonstrations' own initial states
  and from distinct held-out ones (reset seeds 50000+), with a Wilson 95% interval.
* ``ppo``: a tiny pi0 behaviour-cloned on 5 scripted ``reach`` episodes, saved in openpi's
  layout, then fine-tuned by ``rlinf-user train algo=ppo policy.checkpoint=<it>`` (Flow-Noise
  log-probs, chunk-level credit or, with `--credit action`, action-level); evaluation success per version over distinct goals.

* ``dsrl``: per seed, ``lite_vla`` cloned as in ``bc`` on that seed's own 30 demonstrations,
  frozen, and steered through its input noise by ``rlinf-user train algo=dsrl`` (a small
  CNN noise actor that reads the instruction); success per evaluation on distinct
  validation states, the kept policy on test states.

    python benchmarks/bench_vla_learning.py bc --demos 30 100
    python benchmarks/bench_vla_learning.py dsrl --seed 0 --steps 10000 --eval-every 1000
    python benchmarks/bench_vla_learning.py ppo --lr 3e-4 --steps 150000 --eval-states 50 --eval-every 15000 \
        --seed 0 --out benchmarks/results/vla_ppo_reach_s0_150k.json
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
HISTORY_KEYS = ("env_steps", "wall_seconds", "updates", "policy_version", "success_rate", "ci95_low", "ci95_high",
                "episodes", "distinct_states")


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, c - h), 3), round(min(1.0, c + h), 3)]


def add_windows(seen: list, acts: list, horizon: int, obs_l: list, chunks: list, valid: list) -> None:
    """One episode's behaviour-cloning samples: per step its observation, the next
    ``horizon`` actions (the last repeated past the end) and which of them exist."""
    acts = np.stack(acts)
    n = len(acts)
    for t in range(n):
        idx = np.arange(t, t + horizon)
        obs_l.append(seen[t])
        chunks.append(acts[np.minimum(idx, n - 1)])
        valid.append(idx < n)


def scripted_chunks(env, spec, horizon: int, episodes: int, seed0: int):
    """Demonstrations of the straight-to-goal expert: per step the observation, the next
    ``horizon`` actions of the episode and which of them exist."""
    obs_l, chunks, valid = [], [], []
    u = env.unwrapped  # the expert reads the goal from the simulator (privileged)
    step = float(u.action_spec.max_translation)
    for ep in range(episodes):
        o, _ = env.reset(seed=seed0 + ep)
        seen, acts = [], []
        for _ in range(u.max_episode_steps):
            a = np.clip((u.goal - u.tcp) / step, -1, 1).astype(np.float32)
            seen.append(o)
            acts.append(a)
            o, _, term, trunc, _ = env.step(spec.expand_action(a))
            if term or trunc:
                break
        add_windows(seen, acts, horizon, obs_l, chunks, valid)
    return obs_l, np.stack(chunks), np.stack(valid)


def evaluate(policy, env, spec, seeds) -> dict:
    import torch

    from rlinf_user.env.spec import obs_to_torch, stack_obs

    wins = 0
    for s in seeds:
        o, _ = env.reset(seed=int(s))
        done, info = False, {"success": False}
        while not done:
            with torch.no_grad():
                out = policy.act(obs_to_torch(stack_obs([o])), deterministic=True)
            for a in out.actions[0].numpy():
                o, _, term, trunc, info = env.step(spec.expand_action(a))
                done = term or trunc
                if done:
                    break
        wins += bool(info["success"])
    return {"states": len(seeds), "successes": wins, "success": round(wins / len(seeds), 3), "wilson95": wilson(wins, len(seeds))}


def clone_lite_vla(n_demo: int, seed: int, demo_seed0: int, args):
    """``policy=lite_vla`` behaviour-cloned on ``n_demo`` scripted demonstrations of
    reach_color (reset seeds ``demo_seed0``...); returns (policy, env, spec, {samples,
    final_loss, train_s})."""
    import torch

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import EnvSpec, obs_to_torch, stack_obs
    from rlinf_user.policies.base import build_policy

    torch.manual_seed(seed)
    cfg = compose_config(["policy=lite_vla", f"policy.vlm_layers={args.vlm_layers}"], sim="reach_color")
    env = make_env(cfg.env, seed=0)
    spec = EnvSpec.of_env(env)
    policy = build_policy(cfg.policy, spec)
    obs_l, chunks, valid = scripted_chunks(env, spec, policy.horizon, n_demo, demo_seed0)
    obs = obs_to_torch(stack_obs(obs_l))
    target, mask = torch.from_numpy(chunks), torch.from_numpy(valid)
    policy.fit_normalizer(obs["state"])
    opt = torch.optim.AdamW([q for q in policy.parameters() if q.requires_grad], lr=args.lr)
    t0 = time.time()
    for _ in range(args.updates):
        idx = torch.randint(0, len(target), (args.batch,))
        sub = {"state": obs["state"][idx], "images": {"top": obs["images"]["top"][idx]},
               "instruction": [obs["instruction"][i] for i in idx.tolist()]}  # fmt: skip
        policy.train()
        loss = policy.bc_loss(sub, target[idx], mask[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    policy.eval()
    return policy, env, spec, {"samples": len(target), "final_loss": round(float(loss), 4),
                               "train_s": round(time.time() - t0, 1)}


def bc(args) -> None:
    import torch

    torch.set_num_threads(2)
    rows = []
    for n_demo in args.demos:
        policy, env, spec, info = clone_lite_vla(n_demo, args.seed, 1000, args)
        row = {"demos": n_demo, "samples": info["samples"], "updates": args.updates, "train_s": info["train_s"],
               "final_loss": info["final_loss"],
               "demo_states": evaluate(policy, env, spec, range(1000, 1000 + min(n_demo, args.eval_states))),
               "held_out_states": evaluate(policy, env, spec, range(50000, 50000 + args.eval_states))}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = {"what": "lite_vla behaviour cloning on reach_color (layout=slots), deterministic chunks of 4",
           "settings": {"vlm_layers": args.vlm_layers, "batch": args.batch, "lr": args.lr, "seed": args.seed},
           "rows": rows, "machine": describe()}  # fmt: skip
    (RESULTS / "vla_bc_reach_color.json").write_text(json.dumps(out, indent=2) + "\n")


def dsrl(args) -> None:
    """One seed: lite_vla cloned on that seed's own demonstrations, frozen, then steered
    through its noise by ``algo=dsrl`` (the run's first evaluation is the clone's zero-noise
    policy, on the validation states every later evaluation uses; the kept policy is
    reported on the test states)."""
    import torch

    from rlinf_user.cli.main import main as cli

    torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="vla-dsrl-"))
    work.mkdir(parents=True, exist_ok=True)
    base = work / f"clone_s{args.seed}.pt"
    clone_info = work / f"clone_s{args.seed}.json"
    if not base.exists():
        # demonstrations from the seed's own reset seeds (training range, not held out)
        policy, _env, spec, info = clone_lite_vla(args.demo_count, args.seed, 1000 * (args.seed + 1), args)
        torch.save({"policy": policy.state_dict(), "spec": spec.to_dict()}, base)
        clone_info.write_text(json.dumps({"demos": args.demo_count, "updates": args.updates, **info}))
        del policy
    argv = ["train", "--sim", "reach_color", "algo=dsrl", "policy=lite_vla", f"policy.vlm_layers={args.vlm_layers}",
            f"algo.base_checkpoint={base}", "algo.paced=true", f"seed={args.seed}", f"total_env_steps={args.steps}",
            f"eval_every_steps={args.eval_every}", f"eval_episodes={args.eval_states}", "eval_at_start=true",
            f"run_root={work}", f"run_name=dsrl_s{args.seed}", "progress=false", *args.overrides]  # fmt: skip
    t0 = time.time()
    run = work / f"dsrl_s{args.seed}"
    call = argv
    if (run / "config.yaml").exists():  # a run stopped earlier (by hand, or the machine): continued to --steps
        call = ["train", f"resume={run}", f"total_env_steps={args.steps}", "progress=false"]
    if args.collect:  # a run stopped by hand: its evaluations so far, and its kept policy on the test states
        summary = stopped_run(run, args.eval_states, cli)
    elif cli(call) != 0:
        raise SystemExit("the DSRL run failed")
    else:
        summary = json.loads((run / "eval" / "summary.json").read_text())
    with open(run / "eval" / "history.csv") as f:
        history = [{k: float(v) for k, v in row.items() if k in HISTORY_KEYS} for row in csv.DictReader(f)]
    out = {"what": "DSRL over a frozen lite_vla behaviour-cloned on reach_color (layout=slots); success over distinct "
                   "held-out states (validation during training, test for the kept policy)",
           "seed": args.seed, "clone": json.loads(clone_info.read_text()), "overrides": [a.replace(str(work), "<work>") for a in argv[1:]],
           "wall_s": history[-1]["wall_seconds"] if args.collect else round(time.time() - t0, 1), "history": history,
           "resumed": call is not argv,  # wall_s then counts only this call's part of the run
           "best_eval_success": summary.get("best_eval_success"), "final_eval": summary.get("final_eval"),
           "test_eval": summary.get("test_eval"), "machine": describe()}  # fmt: skip
    print(json.dumps({k: out[k] for k in ("seed", "clone", "best_eval_success", "test_eval")}, indent=2))
    Path(args.out or RESULTS / f"vla_dsrl_reach_color_s{args.seed}.json").write_text(json.dumps(out, indent=2) + "\n")


def stopped_run(run: Path, states: int, cli) -> dict:
    """What a finished run's summary holds, for a run stopped before its last step: the best
    evaluation so far, and the kept policy (best.pt) on ``states`` test states."""
    out = run / "eval" / "test_kept"
    if cli(["eval", str(run), "--checkpoint", "best", "--episodes", str(states), "--split", "test", "--video-episodes", "0",
            "--out", str(out)]):
        raise SystemExit("the test evaluation failed")
    test = json.loads(next(out.glob("*.json")).read_text())
    with open(run / "eval" / "history.csv") as f:
        rows = list(csv.DictReader(f))
    best = max(rows, key=lambda r: float(r["success_rate"]))
    return {"best_eval_success": float(best["success_rate"]), "final_eval": None,
            "test_eval": {k: test.get(k) for k in ("success_rate", "successes", "episodes", "distinct_initial_states")}
            | {"ci95": wilson(int(test["successes"]), int(test["episodes"])), "policy": "best",
               "policy_version": int(best["policy_version"]),
               "stopped_at_env_steps": int(rows[-1]["env_steps"])}}  # fmt: skip


def ppo(args) -> None:
    import torch

    from rlinf_user.cli.main import main
    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import EnvSpec, obs_to_torch, stack_obs
    from rlinf_user.policies.base import build_policy
    from rlinf_user.policies.pi0_checkpoint import save_openpi

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    cfg = compose_config(["policy=pi0"], sim="reach")
    env = make_env(cfg.env, seed=0)
    spec = EnvSpec.of_env(env)
    policy = build_policy(cfg.policy, spec)
    obs_l, chunks, _ = scripted_chunks(env, spec, policy.horizon, args.bc_episodes, 1000)
    obs = obs_to_torch(stack_obs(obs_l))
    target = torch.from_numpy(chunks)
    opt = torch.optim.AdamW([q for q in policy.parameters() if q.requires_grad], lr=1e-3)
    for _ in range(args.bc_updates):
        idx = torch.randint(0, len(target), (64,))
        loss = policy.bc_loss({"state": obs["state"][idx], "images": {}}, target[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    work = Path(tempfile.mkdtemp(prefix="vla-ppo-"))
    ckpt = save_openpi(policy.model, work / "bc", {"state": policy.norm["state"], "actions": policy.norm["actions"]})
    # the starting point, on the goals every evaluation of the run uses (reset seeds 10000+)
    if main(["eval", "--sim", "reach", "policy=pi0", f"policy.checkpoint={ckpt}", "--episodes", str(args.eval_states),
             "--out", str(work / "bc_eval")]) != 0:  # fmt: skip
        raise SystemExit("evaluating the BC checkpoint failed")
    bc_success = json.loads((work / "bc_eval" / "eval.json").read_text())["success_rate"]
    argv = ["train", "--sim", "reach", "algo=ppo", "policy=pi0", f"policy.checkpoint={ckpt}",
            "placement.num_env_workers=2", "placement.envs_per_worker=8", f"total_env_steps={args.steps}",
            f"eval_every_steps={args.eval_every}", f"eval_episodes={args.eval_states}", f"seed={args.seed}", f"algo.lr={args.lr}",
            "algo.value_lr=1e-3", "algo.critic_warmup_updates=10", "algo.num_steps=20", "algo.target_kl=null",
            f"algo.credit={args.credit}",
            f"run_root={work}", "run_name=ppo", "progress=false"]  # fmt: skip
    t0 = time.time()
    if main(argv) != 0:
        raise SystemExit("the PPO run failed")
    summary = json.loads((work / "ppo" / "eval" / "summary.json").read_text())
    history = (work / "ppo" / "eval" / "history.csv").read_text().splitlines()
    out = {"what": f"PPO (Flow-Noise, {args.credit}-level credit) of a BC-initialised tiny pi0 on reach; eval over distinct goals",
           "settings": {"credit": args.credit, "bc_episodes": args.bc_episodes, "bc_updates": args.bc_updates, "lr": args.lr, "steps": args.steps,
                        "eval_goals_per_eval": args.eval_states, "seed": args.seed},
           "wall_s": round(time.time() - t0, 1), "bc_eval_success": bc_success, "history_csv": history,
           "best_eval_success": summary["best_eval_success"], "final_eval_success": summary["final_eval_success"],
           "machine": describe()}  # fmt: skip
    print(json.dumps(out, indent=2))
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bc")
    b.add_argument("--demos", type=int, nargs="+", default=[30, 100])
    b.add_argument("--updates", type=int, default=900)
    b.add_argument("--batch", type=int, default=32)
    b.add_argument("--lr", type=float, default=3e-4)
    b.add_argument("--vlm-layers", type=int, default=4)
    b.add_argument("--eval-states", type=int, default=20)
    b.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("dsrl")
    d.add_argument("--demo-count", type=int, default=30)
    d.add_argument("--updates", type=int, default=900)
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--lr", type=float, default=3e-4)
    d.add_argument("--vlm-layers", type=int, default=4)
    d.add_argument("--steps", type=int, default=10000)
    d.add_argument("--eval-every", type=int, default=1000)
    d.add_argument("--eval-states", type=int, default=50)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--work", default=None, help="where the clone and the run go (reused: a clone there is kept, a run there is "
                   "resumed from its last checkpoint and replay)")
    d.add_argument("--out", default=None)
    d.add_argument("--collect", action="store_true",
                   help="do not train: report the run in --work as it stands (stopped by hand), its kept policy on "
                        "the test states")  # fmt: skip
    d.add_argument("overrides", nargs="*", help="more key=value for the DSRL run")
    p = sub.add_parser("ppo")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--steps", type=int, default=30000)
    p.add_argument("--bc-episodes", type=int, default=5)
    p.add_argument("--bc-updates", type=int, default=600)
    p.add_argument("--eval-states", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=6000)
    p.add_argument("--credit", default="chunk", choices=["chunk", "action"], help="algo.credit")
    p.add_argument("--out", default=str(RESULTS / "vla_ppo_reach.json"))
    args = ap.parse_args()
    {"bc": bc, "dsrl": dsrl, "ppo": ppo}[args.what](args)


if __name__ == "__main__":
    main()
