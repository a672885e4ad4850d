"""Policy inference for N env workers: each worker runs its own policy copy ("local"), or
every worker's steps go through one rollout server that batches them ("server").

N Ray actors stand in for env workers: each holds ``--envs`` observations of the CNN
policy's shape (one 112x112 camera and a 7-dim state, the 5M-parameter CNN) and asks
for actions in a closed loop for ``--seconds``, as a worker does between env steps
(the env step itself is left out, so this is the inference path alone). Measured per
configuration and repeat: actions per second over all workers, and each call's latency
(median and p99 over every call of every repeat); for the server also the mean rows
per forward pass.

    python benchmarks/bench_rollout.py --workers 1 2 4 --seconds 20 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
SPEC = {
    "state_dim": 7,
    "cameras": {"front": (112, 112)},
    "action_dim": 4,
    "active_dims": [0, 1, 2, 6],
    "contract_action_dim": 7,
}


def make_cfg(device: str, max_wait_ms: float):
    from rlinf_user.config.compose import compose_config

    return compose_config(
        [
            "policy=cnn",
            "placement.rollout.enabled=true",
            f"placement.rollout.device={device}",
            f"placement.rollout.max_wait_ms={max_wait_ms}",
        ],
        sim="gym_hil",
    )


class Client:
    """A stand-in env worker: asks for actions for its envs in a closed loop."""

    def __init__(self, cfg, envs: int, seed: int, server=None, device: str = "cpu"):
        import torch

        from rlinf_user.algorithms.sac import build_policy

        torch.set_num_threads(1)
        rng = np.random.default_rng(seed)
        self.obs = {
            "state": rng.normal(size=(envs, SPEC["state_dim"])).astype(np.float32),
            "images": {"front": rng.integers(0, 255, size=(envs, 112, 112, 3), dtype=np.uint8)},
        }
        self.server = server
        self.device = torch.device("cuda" if device == "cuda" else "cpu")
        self.policy = None
        if server is None:
            self.policy = build_policy(cfg.policy, SPEC["state_dim"], SPEC["cameras"], SPEC["action_dim"]).to(
                self.device
            )
            self.policy.eval()

    def loop(self, seconds: float, start_at: float) -> dict:
        import ray
        import torch

        while time.time() < start_at:
            time.sleep(0.001)
        lat, rows = [], 0
        end = start_at + seconds
        while time.time() < end:
            t0 = time.perf_counter()
            if self.server is not None:
                a, _ = ray.get(self.server.act.remote(self.obs))
            else:
                with torch.no_grad():
                    batch = {"state": torch.as_tensor(self.obs["state"], device=self.device),
                             "images": {k: torch.as_tensor(v, device=self.device) for k, v in self.obs["images"].items()}}  # fmt: skip
                    a = self.policy.act(batch).cpu().numpy()
            lat.append(time.perf_counter() - t0)
            rows += a.shape[0]
        return {"latencies": lat, "rows": rows}


def run(mode: str, n: int, envs: int, seconds: float, device: str, max_wait_ms: float) -> dict:
    import ray

    from rlinf_user.runtime.serving.rollout_server import RolloutServer

    cfg = make_cfg(device, max_wait_ms)
    gpus = 1 if device == "cuda" else 0
    server = None
    if mode == "server":
        server = ray.remote(RolloutServer).options(num_cpus=1, num_gpus=gpus).remote(cfg, SPEC, None)
        ray.get(
            server.act.remote(
                {"state": np.zeros((1, 7), np.float32), "images": {"front": np.zeros((1, 112, 112, 3), np.uint8)}}
            )
        )
    client_gpus = gpus / n if mode == "local" else 0
    clients = [
        ray.remote(Client)
        .options(num_cpus=1, num_gpus=client_gpus)
        .remote(cfg, envs, i, server, device if mode == "local" else "cpu")
        for i in range(n)
    ]
    ray.get([c.loop.remote(1.0, time.time() + 0.5) for c in clients])  # warm up
    start = time.time() + 1.0
    out = ray.get([c.loop.remote(seconds, start) for c in clients])
    stats = ray.get(server.stats.remote()) if server is not None else None
    for a in [*clients, *([server] if server is not None else [])]:
        ray.kill(a)
    return {
        "actions_per_s": sum(o["rows"] for o in out) / seconds,
        "latencies": [x for o in out for x in o["latencies"]],
        "mean_batch_rows": None if stats is None else round(stats["mean_batch_rows"], 2),
    }


def main() -> None:
    import ray

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--envs", type=int, default=1, help="envs per worker (observations per call)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--max-wait-ms", type=float, default=0.0)
    ap.add_argument("--out", default=str(RESULTS / "rollout_server.json"))
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=max(os.cpu_count() or 1, max(args.workers) + 2), include_dashboard=False, log_to_driver=False)
    rows = []
    for n in args.workers:
        for mode in ("local", "server"):
            rates, lats, batch = [], [], []
            for _ in range(args.repeats):
                r = run(mode, n, args.envs, args.seconds, args.device, args.max_wait_ms)
                rates.append(r["actions_per_s"])
                lats.extend(r["latencies"])
                batch.append(r["mean_batch_rows"])
            row = {
                "workers": n, "mode": mode, "envs_per_worker": args.envs,
                "actions_per_s_median": round(float(np.median(rates)), 1),
                "actions_per_s_repeats": [round(x, 1) for x in rates],
                "call_ms_median": round(1000 * float(np.median(lats)), 2),
                "call_ms_p99": round(1000 * float(np.percentile(lats, 99)), 2),
                "mean_batch_rows": batch if mode == "server" else None,
            }  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    ray.shutdown()
    result = {"benchmark": "rollout_server", "device": args.device, "seconds": args.seconds, "repeats": args.repeats,
              "max_wait_ms": args.max_wait_ms, "rows": rows, "machine": describe()}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
