"""Automatic placement against fixed placements: predicted and measured throughput, side by side.

Per workload: ``rlinf-user plan``'s profile and ranking (the cost model's prediction for
every candidate), then real training runs of the fixed placements a user would pick by hand
and of the model's choice, one after the other on this machine, each for ``--seconds``.
Measured past ``--warmup`` seconds after the run's first update: env steps/s over that window (the run's
``runtime/*`` scalars are logged at their env step) and the mean of its
``runtime/updates_per_s``, and the rate that learning gets at
the algorithm's update-to-data ratio (the smaller of env steps/s and updates/s over that ratio).
Each placement runs ``--repeats`` times, interleaved with the others; the verdict compares
medians (auto against the best fixed placement, and auto's prediction against its median).

    python benchmarks/bench_placement.py --workloads reach_sac pick_rlpd --seconds 45 --repeats 3
    python benchmarks/bench_placement.py --workloads vla_dsrl --seconds 120 --warmup 20 --repeats 2 --keep
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"

# name -> (--sim, overrides); {demos}: the workload's recorded demonstrations; {base}: a
# lite_vla checkpoint for DSRL to steer (its pretrained vision and language weights, an
# untrained expert: the throughput does not depend on what it learned)
WORKLOADS = {
    "reach_sac": ("reach", ["algo=sac"]),
    "pick_rlpd": ("gym_hil_random", ["algo=rlpd", "demos={demos}"]),
    "pushcube_ppo": ("maniskill", ["env.task=PushCube-v1", "algo=ppo", "policy=gaussian_ac"]),
    # the recipe's opening phases skipped (3,000 BC updates before the run, then 2,000 of the
    # critics alone: 3-4 minutes of every pixel run), its steady updates measured
    "pick_pixels_rlpd": ("gym_hil_pixels", ["algo=rlpd", "demos={demos}", "algo.bc_warmup_updates=0",
                                            "algo.critic_warmup_updates=0"]),
    "vla_dsrl": ("reach_color", ["algo=dsrl", "policy=lite_vla", "policy.vlm_layers=4", "algo.base_checkpoint={base}",
                                 "algo.noise_encoder.encoder=base", "algo.paced=true", "algo.batch_size=32",
                                 "algo.utd_ratio=0.5"]),
}
# the placements a user would pick by hand: (mode, workers, envs per worker, rollout server[,
# learner replicas]); --fixed mode:workers:envs:rollout:replicas replaces them
FIXED = [("collocated", 1, 1, False), ("disaggregated", 1, 1, False), ("collocated", 2, 1, False),
         ("collocated", 1, 4, False), ("collocated", 2, 2, True)]  # fmt: skip
FIXED_BY_WORKLOAD = {
    "pushcube_ppo": [("collocated", 1, 16, False), ("disaggregated", 1, 16, False), ("collocated", 2, 8, False),
                     ("collocated", 1, 32, False), ("collocated", 2, 8, True)],
    # one VLA pass serves a chunk of 4 steps for every env of a worker: a user would try more envs
    "vla_dsrl": [("collocated", 1, 1, False), ("collocated", 1, 4, False), ("collocated", 1, 16, False),
                 ("collocated", 2, 8, True), ("disaggregated", 1, 16, False)],
}  # fmt: skip


def untrained_base(root: Path) -> Path:
    """lite_vla for reach_color as a DSRL base: pretrained vision and language, untrained expert."""
    import torch

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.policies.base import build_policy

    path = root / "lite_vla_base.pt"
    if not path.exists():
        cfg = compose_config(["policy=lite_vla", "policy.vlm_layers=4"], sim="reach_color")
        env = make_env(cfg.env, seed=0)
        spec = EnvSpec.of_env(env)
        env.close()
        torch.manual_seed(0)
        torch.save({"policy": build_policy(cfg.policy, spec).state_dict(), "spec": spec.to_dict()}, path)
    return path


def record_demos(sim: str, root: Path) -> Path:
    from rlinf_user.cli.main import main

    if not (root / "meta" / "info.json").exists():
        rc = main(["teleop", "--sim", sim, "teleop=synthetic", f"dataset.root={root}", "dataset.episodes=5", "seed=0"])
        if rc != 0:
            raise SystemExit(f"recording demonstrations exited {rc}")
    return root


def measure(sim: str, overrides: list[str], placement: list[str], seconds: float, warmup: float, work: Path) -> dict:
    """A real training run of this placement: its steady env steps/s and updates/s."""
    from rlinf_user.cli.main import main

    name = f"run_{int(time.time() * 1000)}"
    argv = ["train", "--sim", sim, *overrides, *placement, f"run_root={work}", f"run_name={name}", "progress=false",
            "total_env_steps=100000000", f"max_wall_minutes={seconds / 60:.3f}", "eval_every_steps=100000000",
            "eval_at_start=false", "eval_episodes=1", "test_episodes=0", "checkpoint_every_steps=100000000"]  # fmt: skip
    t0 = time.time()
    rc = main(argv)
    wall = time.time() - t0
    if rc != 0:
        return {"placement": placement, "error": f"exit {rc}"}
    return {"placement": placement, "run": name, "run_wall_s": round(wall, 1), **steady_rates(work / name, warmup)}


def _rate(points: list[tuple[float, float]]) -> float | None:
    """Per second between the first and the last change of a cumulative count: a count that
    moves in steps (100 env steps a rollout call, 50 updates a train call: one every 12 s in
    a pixel run) measured from one step to another, not from the window's arbitrary edges."""
    moves = [(t, c) for (t, c), (_, before) in zip(points[1:], points) if c != before]
    if len(moves) < 2 or moves[-1][0] <= moves[0][0]:
        return None
    return round((moves[-1][1] - moves[0][1]) / (moves[-1][0] - moves[0][0]), 2)


def steady_rates(run_dir: Path, warmup: float) -> dict:
    """A finished run's steady env steps/s and updates/s from its TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    env = ea.Scalars("runtime/env_steps_per_s")
    # each train call that updated: its wall time, seconds and ms per update (so its updates)
    calls = list(zip(ea.Scalars("learner/seconds"), ea.Scalars("learner/update_ms"))) \
        if "learner/update_ms" in tags else []  # fmt: skip
    # the steady state starts at the learner's first update (before it the learner waits for
    # a batch of rows and paced workers wait for it: 20 s of a 60 s pixel run), or at its
    # first actor update where the critics learn alone first
    t_first = calls[0][0].wall_time if calls else (env[0].wall_time if env else 0.0)
    if "learner/actor_loss" in tags:  # after a critic warm-up (the actor idle): the updates' steady cost
        t_first = max(t_first, ea.Scalars("learner/actor_loss")[0].wall_time)
    start = t_first + warmup
    steps = [(e.wall_time, float(e.step)) for e in env if e.wall_time >= start]
    done, updates = 0, []
    for sec, ms in calls:
        done += round(1000.0 * sec.value / ms.value)
        if sec.wall_time >= start:
            updates.append((sec.wall_time, float(done)))
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    return {
        "env_steps_per_s": _rate(steps), "updates_per_s": _rate(updates), "train_calls": len(updates),
        "env_steps": summary.get("env_steps"), "updates": summary.get("updates"),
        # the learner's train calls inside the run: median ms per update (profiled alone: costs.update)
        "update_ms_in_run": round(statistics.median(ms.value for sec, ms in calls if sec.wall_time >= start), 2)
        if updates else None,
    }  # fmt: skip


def learning_rate(got: dict, pipe) -> float | None:
    """Env steps/s that learning gets: on-policy, every step collected is trained on once;
    paced replay, updates/s over the update-to-data ratio (the workers are held to it: their
    count moves 100 env steps a rollout call, a handful of times in a slow run's window);
    free-running replay, the smaller of env steps/s and that."""
    if pipe.on_policy:
        return got["env_steps_per_s"]
    if got.get("updates_per_s") is None:
        return None
    per_update = got["updates_per_s"] / max(pipe.utd_ratio, 1e-9)
    if pipe.paced or got.get("env_steps_per_s") is None:
        return round(per_update, 2)
    return round(min(got["env_steps_per_s"], per_update), 2)


def bench(name: str, args, work: Path) -> dict:
    from rlinf_user.cli.plan import overrides_of
    from rlinf_user.config.compose import compose_config
    from rlinf_user.runtime.planning.model import Candidate, predict, rank
    from rlinf_user.runtime.planning.profile import Profiler

    sim, overrides = WORKLOADS[name]
    if any("{demos}" in o for o in overrides):
        demos = record_demos(sim, work / f"demos_{sim}")
        overrides = [o.format(demos=demos) for o in overrides]
    if any("{base}" in o for o in overrides):
        base = untrained_base(work)
        overrides = [o.format(base=base) for o in overrides]
    cfg = compose_config(overrides, sim=sim)
    t0 = time.time()
    costs, pipe = Profiler(cfg, args.budget).run()
    profile_s = time.time() - t0
    ranking = rank(costs, pipe)
    chosen = ranking[0].candidate
    u = max(pipe.utd_ratio, 1e-9)
    fixed = [Candidate(m, w, e, r, learner_replicas=int(n[0]) if n else 1)
             for m, w, e, r, *n in (args.fixed or FIXED_BY_WORKLOAD.get(name, FIXED))]  # fmt: skip
    cands = [*fixed, *([] if chosen in fixed else [chosen])]
    runs: dict[str, list[dict]] = {c.label(): [] for c in cands}
    for rep in range(args.repeats):  # interleaved: a slow spell of the machine hits every placement
        for cand in cands:
            got = measure(sim, overrides, overrides_of(cand), args.seconds, args.warmup, work)
            if "error" not in got:
                got["learning_rate"] = learning_rate(got, pipe)
            print(json.dumps({"candidate": cand.label(), "repeat": rep, **got}), flush=True)
            runs[cand.label()].append(got)
    rows = []
    for cand in cands:
        pred = predict(costs, pipe, cand)
        got = runs[cand.label()]
        rates = [g["learning_rate"] for g in got if g.get("learning_rate") is not None]
        med = statistics.median(rates) if rates else None
        predicted = pred.env_steps_per_s if pipe.on_policy else min(pred.env_steps_per_s, pred.updates_per_s / u)
        rows.append({"candidate": cand.label(), "auto": cand == chosen, "predicted": pred.row(),
                     "predicted_learning_rate": round(predicted, 2), "measured_learning_rate_median": med,
                     "measured_learning_rates": rates,
                     "prediction_error": round(predicted / med - 1, 3) if med else None, "measured": got})  # fmt: skip
    best = max((r for r in rows if r["measured_learning_rate_median"]), key=lambda r: r["measured_learning_rate_median"])
    auto = next(r for r in rows if r["auto"])
    verdict = {"best_fixed": best["candidate"], "auto": auto["candidate"],
               "auto_vs_best": round(auto["measured_learning_rate_median"] / best["measured_learning_rate_median"], 3)
               if auto["measured_learning_rate_median"] else None,
               "auto_prediction_error": auto["prediction_error"]}  # fmt: skip
    print(json.dumps({"workload": name, **verdict}), flush=True)
    kept = [o for o in overrides if not o.startswith(("demos=", "algo.base_checkpoint="))]  # paths of this machine
    return {"verdict": verdict, "workload": name, "sim": sim, "overrides": kept,
            "pipeline": pipe.__dict__, "profile_s": round(profile_s, 1), "costs": costs.to_dict(),
            "top_predicted": [p.row() for p in ranking[:8]], "runs": rows}  # fmt: skip


def fixed_placement(text: str) -> tuple:
    mode, workers, envs, rollout, replicas = text.split(":")
    return mode, int(workers), int(envs), rollout == "1", int(replicas)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--seconds", type=float, default=45.0, help="each measured run's length")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of each run left out of its medians")
    ap.add_argument("--budget", type=float, default=30.0, help="the profile's budget")
    ap.add_argument("--repeats", type=int, default=3, help="runs per placement, interleaved (medians reported)")
    ap.add_argument("--out", default=str(RESULTS / "placement_auto.json"))
    ap.add_argument("--keep", action="store_true", help="keep the other workloads already in --out")
    ap.add_argument("--fixed", nargs="+", type=fixed_placement, default=None,
                    help="the fixed placements to run, each mode:workers:envs:rollout(0|1):replicas")  # fmt: skip
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-placement-"))
    out = {"what": "placement=auto's prediction against measured runs of fixed placements",
           "seconds_per_run": args.seconds, "warmup_s": args.warmup, "workloads": [], "machine": describe()}  # fmt: skip
    kept = []  # --keep: the file's other workloads stay, each with the settings it was measured at
    if args.keep and Path(args.out).exists():
        old = json.loads(Path(args.out).read_text())
        kept = [{**w, "seconds_per_run": w.get("seconds_per_run", old.get("seconds_per_run")),
                 "warmup_s": w.get("warmup_s", old.get("warmup_s")), "machine": w.get("machine", old.get("machine"))}
                for w in old.get("workloads", []) if w["workload"] not in args.workloads]  # fmt: skip
    fresh = []
    for name in args.workloads:
        fresh.append({**bench(name, args, work), "seconds_per_run": args.seconds, "warmup_s": args.warmup,
                      "machine": describe()})  # fmt: skip
        out["workloads"] = [*kept, *fresh]
        Path(args.out).write_text(json.dumps(out, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
