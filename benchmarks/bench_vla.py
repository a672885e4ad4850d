"""VLA chunk latency: ``policy=pi0`` at a size, per batch size, with the prefix KV cache
(the VLM runs once per chunk, the K denoising steps run only the action expert over its
cache) and, side by side in the same process, without it (the whole VLM+expert pass
repeated at every denoising step, as a naive implementation does).

Each measurement: contract observations (two uint8 cameras of 224x224, a 20-D state, an
instruction) in, a chunk of H actions out, through ``Pi0Policy.act`` (resize, tokenise,
normalise, sample, un-normalise). ``token`` is ``policy=token_vla`` (OpenVLA-style: the chunk
decoded token by token over the language model's KV cache; a 7-D action, so 28 tokens
for 4 steps). Warm-up, then ``--repeats`` timed chunks; median and
p99 latency, and actions/s = batch x H / latency.

    python benchmarks/bench_vla.py --sizes tiny small lite --batches 1 8 32
    python benchmarks/bench_vla.py --sizes token --out benchmarks/results/vla_token_chunk_latency.json
    python benchmarks/bench_vla.py --sizes pi0 --batches 1 8 32 64 --device cuda --dtype bfloat16 \
        --compile reduce-overhead max-autotune

``--compile MODE``: the same policy again with its denoising step compiled
(``policy.compile``), side by side with the eager rows; ``warmup_s`` holds the compile time.

``--graph``: the same policy again with the whole chunk replayed from a CUDA graph
(``policy.cuda_graph=on``; :mod:`rlinf_user.policies.chunk_graph`), side by side with the
eager rows (``policy.cuda_graph=off``) in the same process. Each graph row carries the
largest difference of its deterministic chunk from the eager one on the same inputs
(``max_abs_diff_vs_eager``) and whether a chunk ran with no host synchronisation
(``sync_free``: CUDA's sync debug mode set to error around one ``act``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def observations(b: int, rng: np.random.Generator):
    from rlinf_user.env.spec import obs_to_torch

    return obs_to_torch({
        "state": rng.normal(size=(b, 20)).astype(np.float32),
        "images": {c: rng.integers(0, 255, (b, 224, 224, 3), dtype=np.uint8) for c in ("front", "wrist")},
        "instruction": np.array(["pick up the red cube"] * b),
    })  # fmt: skip


def uncached_sample(model, images, masks, tokens, token_mask, state, noise):
    """The same Euler integration, the prefix re-encoded at every step (no KV cache)."""
    import torch

    k, dt, x = model.cfg.num_steps, -1.0 / model.cfg.num_steps, noise
    for i in range(k):
        emb, pad = model.embed_prefix(images, masks, tokens, token_mask)
        t = torch.full((state.shape[0],), 1.0 + i * dt, device=state.device)
        x = x + dt * model.velocity(model.encode_prefix(emb, pad), pad, state, x, t)
    return x


def device_obs(b: int, device) -> dict:
    obs = observations(b, np.random.default_rng(0))
    return {**obs, "state": obs["state"].to(device), "images": {k: v.to(device) for k, v in obs["images"].items()}}


def graph_checks(policy, b: int, device) -> dict:
    """The graph's deterministic chunk against the eager one on the same inputs, and whether
    a replayed chunk synchronises with the host."""
    import torch

    obs = device_obs(b, device)
    policy.cuda_graph = "off"
    eager = policy.act(obs, deterministic=True).actions.float()
    policy.cuda_graph = "on"
    fast = policy.act(obs, deterministic=True).actions.float()
    out = {"max_abs_diff_vs_eager": round(float((fast - eager).abs().max()), 5),
           "graph_backend": "cuda" if str(device).startswith("cuda") else "rerun (CPU: the machinery, not a graph)"}
    if str(device).startswith("cuda"):
        policy.act(obs)  # the stochastic chunk captured outside the check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            policy.act(obs, deterministic=True)
            policy.act(obs)
            out["sync_free"] = True
        except RuntimeError as err:
            out["sync_free"] = f"{err}"[:200]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    graphs = policy._graphs
    out["graphs_captured"] = graphs.captures if graphs is not None else 0
    out["graph_fallbacks"] = graphs.fallbacks if graphs is not None else 0
    return out


def measure(policy, b: int, repeats: int, cached: bool, device, stochastic: bool = False) -> dict:
    import torch

    obs = device_obs(b, device)

    def chunk():
        if cached:  # serving: the ODE from zero noise; stochastic: the Flow-Noise chain with its log-prob and value
            return policy.act(obs, deterministic=not stochastic).actions.cpu()  # the actions where the caller reads them
        with torch.no_grad():
            inputs = policy.model_inputs(obs)
            noise = torch.randn(b, policy.model.cfg.horizon, policy.model.cfg.action_dim, device=device)
            return uncached_sample(policy.model, *inputs, noise)

    def sync():
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    for _ in range(2):  # warm-up (a compiled step compiles here)
        chunk()
    sync()
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        chunk()
        sync()
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1e3
    h = policy.horizon
    return {"batch": b, "kv_cache": cached, "rl_extras": stochastic, "latency_ms_p50": round(float(np.median(ms)), 2),
            "latency_ms_p99": round(float(np.percentile(ms, 99)), 2),
            "actions_per_s": round(b * h / float(np.median(ms)) * 1e3, 1), "repeats": repeats,
            "warmup_s": round(warmup_s, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small", "lite"],
                    help="pi0 sizes, lite (policy=lite_vla) or token (policy=token_vla)")  # fmt: skip
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--uncached-batches", type=int, nargs="*", default=[1, 8], help="batches also run without the cache")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--compile", nargs="*", default=[],
                    help="also measure with policy.compile=MODE (flow VLAs; an inductor mode or a backend), same weights")
    ap.add_argument("--graph", action="store_true",
                    help="also measure with policy.cuda_graph=on (flow VLAs on CUDA), same weights, eager rows beside")
    ap.add_argument("--out", default=str(RESULTS / "vla_chunk_latency.json"))
    args = ap.parse_args()
    import torch

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.policies.base import build_policy

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    spec = EnvSpec(state_dim=20, cameras={"front": (224, 224), "wrist": (224, 224)}, instruction=True)
    rows = []
    for size in args.sizes:
        named = {"lite": ["policy=lite_vla"], "token": ["policy=token_vla"]}
        over = named.get(size, ["policy=pi0", f"policy.size={size}"])
        with torch.device(args.device):  # the parameters drawn where they live: a 3.3B model in seconds
            policy = build_policy(compose_config(over).policy, spec).eval()
        if hasattr(policy, "cuda_graph"):
            policy.cuda_graph = "off"  # the eager rows: today's path
        policy = policy.to(device=args.device, dtype=getattr(torch, args.dtype))
        params = sum(p.numel() for p in policy.parameters())
        cfg = policy.model.cfg if hasattr(policy, "model") else policy.cfg
        steps = getattr(cfg, "num_steps", None) or f"{cfg.horizon * spec.action_dim} tokens"
        for b in args.batches:
            uncached = b in args.uncached_batches and hasattr(policy, "model")  # (a token VLA always decodes over its cache)
            for cached in (True, False) if uncached else (True,):
                r = {"size": size, "params_m": round(params / 1e6, 2), "horizon": cfg.horizon, "denoise_steps": steps,
                     "dtype": args.dtype, **measure(policy, b, args.repeats, cached, args.device)}  # fmt: skip
                print(json.dumps(r), flush=True)
                rows.append(r)
        for mode in args.compile if hasattr(policy, "model") else []:  # the same weights, the step compiled
            policy.model.compile_denoising(mode)
            for b in args.batches:
                r = {"size": size, "params_m": round(params / 1e6, 2), "horizon": cfg.horizon, "denoise_steps": steps,
                     "dtype": args.dtype, "compile": mode, **measure(policy, b, args.repeats, True, args.device)}  # fmt: skip
                print(json.dumps(r), flush=True)
                rows.append(r)
            policy.model.compile_denoising(None)
        if args.graph and hasattr(policy, "cuda_graph"):  # the same weights, the chunk replayed from a graph
            if not str(args.device).startswith("cuda"):  # the machinery on a CPU: the rerun backend
                from rlinf_user.policies.chunk_graph import ChunkGraphs

                graphs = ChunkGraphs(backend="rerun")
                policy.chunk_graphs = lambda device, g=graphs, p=policy: None if p.cuda_graph == "off" else g
                policy._graphs = graphs
            for b in args.batches:
                checks = graph_checks(policy, b, args.device)
                policy.cuda_graph = "on"
                for stochastic in (False, True) if b == 1 else (False,):
                    r = {"size": size, "params_m": round(params / 1e6, 2), "horizon": cfg.horizon, "denoise_steps": steps,
                         "dtype": args.dtype, "cuda_graph": True, **checks,
                         **measure(policy, b, args.repeats, True, args.device, stochastic=stochastic)}  # fmt: skip
                    print(json.dumps(r), flush=True)
                    rows.append(r)
            policy.cuda_graph = "off"
        if 1 in args.batches:  # an RL rollout's chunk: the stochastic chain, its log-prob and the value
            r = {"size": size, "params_m": round(params / 1e6, 2), "horizon": cfg.horizon, "denoise_steps": steps,
                 "dtype": args.dtype, **measure(policy, 1, args.repeats, True, args.device, stochastic=True)}  # fmt: skip
            print(json.dumps(r), flush=True)
            rows.append(r)
    result = {"what": "VLA chunk latency through the policy's act (2 cameras 224x224, 20-D state, instruction)",
              "device": args.device, "threads": torch.get_num_threads(), "rows": rows, "machine": describe()}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
