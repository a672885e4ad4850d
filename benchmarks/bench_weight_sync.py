"""Weight synchronisation: publish-to-applied time across two Ray nodes on loopback.

A two-node Ray cluster on one machine (``ray.cluster_utils.Cluster``): the learner side on
the head, a rollout worker on the second node, so the weights cross between the two
nodes' object stores over TCP on 127.0.0.1. Measured, ``--repeats`` times per model:
from the learner's ``publish`` call to the worker having the new tensors in its module
(the worker polls between "steps" as env workers do). Models:

* ``cnn5m``: the CNN policy (one 112x112 camera, ~5M parameters, fp32); target <= 50 ms;
* ``llm1b``: 1B parameters in bf16 (2 GB; a stack of linear layers); target >= 80% of the
  loopback bandwidth, measured here with a plain TCP socket pair (2 GiB, ``--repeats``
  times before the models and again after, since a shared machine's loopback drifts;
  the fraction is taken against the median of all of them; for the 1B models a loopback
  run also precedes every timed version, giving a paired fraction per version);
* ``frozen1b``: the same model with only its last layer trained (``changed_only``);
* ``litevla``: ``policy=lite_vla`` (71M parameters, real EfficientNet-Lite0 and SmolLM2
  weights, fp32) with its vision and language layers frozen (``finetune=expert``,
  ``changed_only``: the ~10M trained parameters travel per version).

Both transports are measured: ``tcp`` (the learner serves its tensors, the worker pulls
straight into its own buffers) and ``ray`` (chunks through the object stores). Each row
also splits the time: publish call -> the store has the version ("published"), the
worker's ask answered, every byte local ("fetched"), in the module ("applied").

    python benchmarks/bench_weight_sync.py --repeats 5
    python benchmarks/bench_weight_sync.py --models litevla --transports tcp --repeats 7 \
        --out benchmarks/results/weight_sync_lite_vla.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"


def loopback_bandwidth(total: int = 2 * 2**30, block: int = 4 * 2**20) -> float:
    """Bytes/s through one TCP connection on 127.0.0.1."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    got = [0]

    def sink() -> None:
        conn, _ = srv.accept()
        buf = bytearray(block)
        while got[0] < total:
            n = conn.recv_into(buf)
            if not n:
                break
            got[0] += n
        conn.close()

    t = threading.Thread(target=sink)
    t.start()
    cli = socket.create_connection(("127.0.0.1", port))
    payload = b"\0" * block
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        cli.sendall(payload)
        sent += block
    t.join()
    dt = time.perf_counter() - t0
    cli.close()
    srv.close()
    return total / dt


def build(kind: str):
    import torch

    if kind == "cnn5m":
        from rlinf_user.algorithms.sac import build_policy
        from rlinf_user.config.compose import compose_config

        cfg = compose_config(["policy=cnn", "env.cameras=[c]"], sim="gym_hil")
        return build_policy(cfg.policy, 21, {"c": (112, 112)}, 7)
    if kind == "litevla":
        from rlinf_user.config.compose import compose_config
        from rlinf_user.env.spec import EnvSpec
        from rlinf_user.policies.base import build_policy as build_vla

        spec = EnvSpec(state_dim=3, cameras={"top": (64, 64)}, instruction=True, active_dims=(0, 1, 2))
        return build_vla(compose_config(["policy=lite_vla"], sim="reach_color").policy, spec)
    layers = [torch.nn.Linear(8192, 8192, bias=False, dtype=torch.bfloat16) for _ in range(15)]  # 15 x 67M = 1.007B
    model = torch.nn.Sequential(*layers)
    if kind == "frozen1b":
        for layer in layers[:-1]:
            layer.requires_grad_(False)
    return model


class LearnerSide:
    def __init__(self, kind: str, store, changed_only: bool, transport: str):
        import torch

        from rlinf_user.runtime.weights.store import WeightPublisher

        torch.manual_seed(0)
        self.kind = kind
        self.model = build(kind)
        self.pub = WeightPublisher(store, changed_only=changed_only, transport=transport)

    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def step_and_publish(self, version: int) -> tuple[float, dict]:
        import torch

        with torch.no_grad():  # a "training step": the trainable tensors change
            for p in self.model.parameters():
                if p.requires_grad:
                    p.add_(1e-3)
        t0 = time.time()
        self.pub.publish(self.model, version)
        return t0, self.pub.last_stats


class WorkerSide:
    def __init__(self, kind: str, store):
        import ray

        from rlinf_user.runtime.weights.store import WeightSubscriber

        self.node = ray.get_runtime_context().get_node_id()
        self.model = build(kind)
        self.sub = WeightSubscriber(store, self.model, min_interval_s=0.0)

    def wait_for(self, version: int, timeout: float = 300.0) -> float:
        deadline = time.monotonic() + timeout
        while self.sub.version < version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"version {version} not applied")
            self.sub.poll()  # what an env worker does between steps
            time.sleep(0.001)
        return time.time(), dict(self.sub.last_timing)


def measure(kind: str, transport: str, repeats: int, node_resources: dict, warmup: int = 3) -> dict:
    import ray

    from rlinf_user.runtime.weights.store import WeightStore

    changed_only = kind in ("frozen1b", "litevla")
    store = ray.remote(WeightStore).options(resources={"learner_node": 0.01}).remote()
    learner = (
        ray.remote(LearnerSide)
        .options(resources={"learner_node": 0.01}, num_cpus=1)
        .remote(kind, store, changed_only, transport)
    )
    worker = ray.remote(WorkerSide).options(resources=node_resources, num_cpus=1).remote(kind, store)
    ray.get(learner.step_and_publish.remote(0))
    ray.get(worker.wait_for.remote(0))  # the first, full copy (not timed)
    for v in range(1, warmup + 1):  # the object stores' memory in use once (first touches are slow on VMs)
        done = worker.wait_for.remote(v)
        ray.get(learner.step_and_publish.remote(v))
        ray.get(done)
    lat, stats, phases, paired = [], [], [], []
    for v in range(warmup + 1, warmup + repeats + 1):
        bw = loopback_bandwidth() if "1b" in kind else None  # the link as it is right now
        done = worker.wait_for.remote(v)
        t0, st = ray.get(learner.step_and_publish.remote(v))
        t1, timing = ray.get(done)
        lat.append(t1 - t0)
        stats.append(st)
        if bw:
            paired.append(st["bytes"] / (t1 - t0) / bw)
        # publish call -> the store has the version, and from there to answered/fetched/applied
        t_pub = t1 - timing["applied"]
        phases.append({"published": t_pub - t0, **{k: x + (t_pub - t0) for k, x in timing.items()}})
    params = ray.get(learner.params.remote())
    for a in (learner, worker, store):
        ray.kill(a)
    lat_arr = np.array(lat)
    nbytes = stats[-1]["bytes"]
    return {
        "model": kind, "transport": transport, "parameters": params, "bytes_sent_per_version": nbytes,
        "tensors_sent": stats[-1]["tensors"], "tensors_total": stats[-1]["of"], "chunks": stats[-1]["chunks"],
        "publish_to_applied_ms": [round(x * 1e3, 1) for x in lat],
        "median_ms": round(float(np.median(lat_arr)) * 1e3, 1), "p99_ms": round(float(np.percentile(lat_arr, 99)) * 1e3, 1),
        "phases_median_ms": {k: round(float(np.median([p[k] for p in phases])) * 1e3, 1) for k in phases[0]},
        "effective_bytes_per_s_median": nbytes / float(np.median(lat_arr)),
        **({"paired_fraction_of_loopback": [round(f, 3) for f in paired],
            "paired_fraction_median": round(float(np.median(paired)), 3)} if paired else {}),
    }  # fmt: skip


def stream_only(repeats: int) -> dict:
    """The tcp transport's wire alone: 1B bf16 params already staged, pulled in-process
    over loopback into warm buffers (no Ray, no staging copy in the timed window)."""
    import torch

    from rlinf_user.runtime.weights.stream import WeightServer, WeightStreamClient

    tensors = {f"l{i}": torch.zeros(8192, 8192, dtype=torch.bfloat16) for i in range(15)}
    nbytes = sum(t.numel() * 2 for t in tensors.values())
    server = WeightServer(bind_host="127.0.0.1", advertise_host="127.0.0.1")
    client = WeightStreamClient()
    times = []
    try:
        for v in range(repeats + 2):
            server.stage(v, tensors)
            t0 = time.perf_counter()
            client.fetch(server.endpoint(), v - 1)
            if v >= 2:  # the first two touch fresh memory
                times.append(time.perf_counter() - t0)
    finally:
        client.close()
        server.close()
    med = float(np.median(times))
    return {"bytes": nbytes, "seconds": [round(t, 3) for t in times], "median_s": round(med, 3),
            "bytes_per_s_median": round(nbytes / med)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", nargs="+", default=["cnn5m", "llm1b", "frozen1b"])
    ap.add_argument("--transports", nargs="+", default=["tcp", "ray"])
    ap.add_argument("--out", default=str(RESULTS / "weight_sync.json"))
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    bw = [loopback_bandwidth() for _ in range(args.repeats)]
    wire = stream_only(args.repeats) if "tcp" in args.transports and any("1b" in m for m in args.models) else None
    store_mem = 5 * 2**30  # two 2 GB versions in flight per node
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"learner_node": 1}, "object_store_memory": store_mem},
    )
    cluster.add_node(num_cpus=2, resources={"worker_node": 1}, object_store_memory=store_mem)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        rows = [measure(m, t, args.repeats, {"worker_node": 0.01}) for t in args.transports for m in args.models]
    finally:
        ray.shutdown()
        cluster.shutdown()
    bw += [loopback_bandwidth() for _ in range(args.repeats)]
    loop = float(np.median(bw))
    for r in rows:
        r["fraction_of_loopback"] = round(r["effective_bytes_per_s_median"] / loop, 3)
        r["effective_bytes_per_s_median"] = round(r["effective_bytes_per_s_median"])
    out = {
        "what": "publish-to-applied between two Ray nodes on one machine (object stores over loopback TCP)",
        "machine": describe(),
        "loopback_bytes_per_s": [round(b) for b in bw],
        "loopback_bytes_per_s_median": round(loop),
        "repeats": args.repeats,
        "models": rows,
        "tcp_wire_only_1b": wire and {**wire, "fraction_of_loopback": round(wire["bytes_per_s_median"] / loop, 3)},
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"loopback: {loop / 2**30:.2f} GiB/s (median; {min(bw) / 2**30:.2f}-{max(bw) / 2**30:.2f} over {len(bw)} runs)")
    if wire:
        print(f"tcp wire alone (1B staged): {wire['median_s'] * 1e3:.0f} ms, {wire['bytes_per_s_median'] / loop:.0%} of loopback")
    for r in rows:
        print(f"{r['transport']:<4}{r['model']:<9} {r['parameters'] / 1e6:8.1f}M params, {r['bytes_sent_per_version'] / 2**20:8.1f} MiB sent: "
              f"median {r['median_ms']} ms, p99 {r['p99_ms']} ms, {r['fraction_of_loopback']:.0%} of loopback"
              + (f" (paired: {r['paired_fraction_median']:.0%})" if "paired_fraction_median" in r else ""))  # fmt: skip


if __name__ == "__main__":
    main()
