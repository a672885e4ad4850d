"""A VLA's PPO minibatch step: forward (chain log-prob and value), backward, optimiser step.

For each size, a minibatch of recorded rollout rows (``act`` on contract observations:
two 224x224 cameras, a 20-D state, an instruction) is scored as PPO scores it, with the
trained parameters of ``policy.finetune``; side by side in the same process:

* **one prefix pass** (``log_prob_and_value``, what PPO calls): the vision tower and the
  VLM run once for both the log-prob and the value;
* **two passes** (``log_prob`` then ``value``), as before.

Warm-up, then ``--repeats`` timed steps per mode, alternating; median and p99.

    python benchmarks/bench_ppo_update.py --sizes tiny lite --batch 16
    python benchmarks/bench_ppo_update.py --sizes pi0 --batch 32 --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from bench_vla import observations
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def build(size: str, device, dtype):
    import torch

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.policies.base import build_policy

    spec = EnvSpec(state_dim=20, cameras={"front": (224, 224), "wrist": (224, 224)}, instruction=True)
    over = ["policy=lite_vla"] if size == "lite" else ["policy=pi0", f"policy.size={size}"]
    policy = build_policy(compose_config(over).policy, spec).to(device)
    if dtype == "bfloat16":
        policy = policy.to(torch.bfloat16)
    return policy


def measure(policy, b: int, repeats: int, device) -> dict:
    import torch

    rng = np.random.default_rng(0)
    obs = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in observations(b, rng).items()}
    if "images" in obs:
        obs["images"] = {k: v.to(device) for k, v in obs["images"].items()}
    with torch.no_grad():
        sample = policy.act(obs).extras["sample"]
    ret = torch.randn(b, device=device)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-6)

    def step(one_pass: bool) -> float:
        t0 = time.perf_counter()
        if one_pass:
            logp, ent, v = policy.log_prob_and_value(obs, sample)
        else:
            logp, ent = policy.log_prob(obs, sample)
            v = policy.value(obs)
        loss = -logp.float().mean() - 0.01 * ent.float().mean() + 0.5 * ((v.float() - ret) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    policy.train()
    for _ in range(2):
        step(True), step(False)
    times = {True: [], False: []}
    for _ in range(repeats):
        for mode in (True, False):
            times[mode].append(step(mode))
    out = {}
    for mode, name in ((True, "one_pass"), (False, "two_passes")):
        t = np.asarray(times[mode]) * 1e3
        out[name] = {"p50_ms": round(float(np.median(t)), 1), "p99_ms": round(float(np.percentile(t, 99)), 1)}
    out["speedup_p50"] = round(out["two_passes"]["p50_ms"] / out["one_pass"]["p50_ms"], 2)
    return out


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "lite"], help="pi0 sizes (tiny, small, pi0) or lite")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", default=str(RESULTS / "vla_ppo_update.json"))
    args = ap.parse_args()
    device = torch.device(args.device)
    rows = []
    for size in args.sizes:
        torch.manual_seed(0)
        policy = build(size, device, args.dtype)
        trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        row = {"size": size, "batch": args.batch, "trained_parameters": trained,
               "parameters": sum(p.numel() for p in policy.parameters()),
               "horizon": policy.horizon, **measure(policy, args.batch, args.repeats, device)}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
        del policy
    result = {"benchmark": "VLA PPO minibatch step (log-prob + value forward, backward, AdamW step)",
              "device": args.device, "dtype": args.dtype, "machine": describe(), "rows": rows}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
