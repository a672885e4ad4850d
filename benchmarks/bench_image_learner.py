"""Image-SAC learner updates/s: two 128x128 cameras, batch 256, per encoder.

Each case builds the learner's algorithm for a pixel spec (two cameras + the arm's 18-D
state), fills a replay buffer with random frames (or, with frame features, the frozen
backbone's maps of them), and times what the learner does per update: sample from the
buffer in host memory, move the batch to the device, update (critics, actor, temperature,
target). Encoders:

* ``cnn``: the DrQ CNN per camera, trained from scratch (frames augmented by random shift);
* ``efficientnet`` / ``resnet10`` frozen, frames in the batch: the backbone runs (no
  gradients) on both observations of every row in every update;
* the same with ``policy.frame_features``: the batch holds the maps, the backbone never runs;
* ``efficientnet`` / ``resnet10`` fine-tuned: the backbone trains with the rest.

``--update-graph`` adds each chosen case again with its whole update captured in a CUDA
graph (``algo.update_graph=on``, :mod:`rlinf_user.algorithms.update_graph`), side by side.

ResNet-10 uses random weights in the Hub file's layout (no weights ship in a wheel; the
speed does not depend on the values). Reports per-update median and p99 latency and the
median updates/s over ``--repeats`` timed blocks, each update's batch sampled and copied
before it (serial); and the median updates/s as the learner runs them (pipelined: the next
batch sampled and copied by a worker thread during the update,
:mod:`rlinf_user.runtime.learning.device_batches`); and the device.

    python benchmarks/bench_image_learner.py --out benchmarks/results/image_learner.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rlinf_user.config.compose import compose_config
from rlinf_user.data.replay import ReplayBuffer
from rlinf_user.env.spec import EnvSpec
from rlinf_user.runtime.learning.device_batches import device_batches, replay_batch

STATE_DIM = 18  # gym_hil's arm state
CAMERAS = ("front", "wrist")


def resnet10_file(folder: Path) -> str:
    from safetensors.torch import save_file

    from rlinf_user.policies.resnet10 import ResNet10

    path = folder / "model.safetensors"
    save_file({k: v.contiguous() for k, v in ResNet10().state_dict().items()}, str(path))
    return str(path)


def fill(rows: int, size: int, featurizer, seed: int = 0) -> ReplayBuffer:
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(rows)
    frames = {c: rng.integers(0, 255, (rows + 1, size, size, 3), dtype=np.uint8) for c in CAMERAS}
    cols = {
        "obs/state": rng.standard_normal((rows, STATE_DIM), dtype=np.float32),
        "next_obs/state": rng.standard_normal((rows, STATE_DIM), dtype=np.float32),
        "action": rng.uniform(-1, 1, (rows, 7)).astype(np.float32),
        "reward": rng.random(rows, dtype=np.float32),
        "terminated": np.zeros(rows, np.float32),
    }
    for c in CAMERAS:
        cols[f"obs/images/{c}"], cols[f"next_obs/images/{c}"] = frames[c][:-1], frames[c][1:]
    buf.add(featurizer.columns(cols) if featurizer is not None else cols)
    return buf


def bench(name: str, overrides: list[str], device: str, rows: int, updates: int, repeats: int, size: int) -> dict:
    from rlinf_user.algorithms.base import build_algorithm
    from rlinf_user.policies.frame_features import FrameFeaturizer, frame_feature_settings

    cfg = compose_config(["policy=cnn", "algo=sac", "algo.batch_size=256", *overrides], sim="gym_hil")
    spec = EnvSpec(state_dim=STATE_DIM, cameras={c: (size, size) for c in CAMERAS}, active_dims=(0, 1, 2, 6))
    algo = build_algorithm(cfg.algo, cfg.policy, spec, device)
    settings = frame_feature_settings(cfg)
    buf = fill(rows, size, FrameFeaturizer(settings, device) if settings else None)
    rng = np.random.default_rng(1)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        batch = replay_batch(buf.sample(256, rng), spec, device)
        t1 = time.perf_counter()
        algo.update(batch)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return t1 - t0, time.perf_counter() - t1

    for _ in range(5):
        step()
    lat, sample_s, rates = [], [], []
    for _ in range(repeats):
        t_block = time.perf_counter()
        for _ in range(updates):
            s, u = step()
            sample_s.append(s)
            lat.append(s + u)
        rates.append(updates / (time.perf_counter() - t_block))
    # as the learner runs: the next batch sampled and copied by a worker thread during the update
    piped = []
    for _ in range(repeats):
        t_block = time.perf_counter()
        for batch in device_batches((buf.sample(256, rng) for _ in range(updates)), spec, device):
            algo.update(batch)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        piped.append(updates / (time.perf_counter() - t_block))
    lat_ms = np.array(lat) * 1e3
    trainable = sum(p.numel() for p in algo.policy.parameters() if p.requires_grad)
    row = {
        "case": name,
        "config": " ".join(overrides),
        "updates_per_s_median": round(float(np.median(rates)), 1),
        "pipelined_updates_per_s_median": round(float(np.median(piped)), 1),
        "update_ms_median": round(float(np.median(lat_ms)), 2),
        "update_ms_p99": round(float(np.percentile(lat_ms, 99)), 2),
        "sample_and_copy_ms_median": round(float(np.median(sample_s)) * 1e3, 2),
        "policy_trainable_params": int(trainable),
        "repeats": repeats,
        "updates_per_repeat": updates,
    }
    graphs = getattr(algo, "update_graphs", None)
    if graphs is not None:  # did the captured update run, or fall back to eager (and why)
        row.update(update_graph_captures=graphs.captures, update_graph_replays=graphs.replays,
                   update_graph_disabled=graphs.disabled)  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--updates", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--cases", default="all")
    ap.add_argument("--update-graph", action="store_true",
                    help="also each chosen case with its whole update captured in a CUDA graph (algo.update_graph=on)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    with tempfile.TemporaryDirectory() as tmp:
        r10 = resnet10_file(Path(tmp))
        cases = {
            "cnn_scratch": [],
            "efficientnet_frozen_frames": ["policy.encoder=efficientnet"],
            "efficientnet_frame_features": ["policy.encoder=efficientnet", "policy.frame_features=true"],
            "efficientnet_finetuned": ["policy.encoder=efficientnet", "policy.encoder_finetune=true"],
            "resnet10_frozen_frames": ["policy.encoder=resnet10", f"policy.vision_weights={r10}"],
            "resnet10_frame_features": ["policy.encoder=resnet10", f"policy.vision_weights={r10}", "policy.frame_features=true"],
            "resnet10_finetuned": ["policy.encoder=resnet10", f"policy.vision_weights={r10}", "policy.encoder_finetune=true"],
        }  # fmt: skip
        # the image trunk under bfloat16 autocast (policy.image_autocast): the cases that run one
        for name in ("cnn_scratch", "efficientnet_frozen_frames", "efficientnet_finetuned", "resnet10_frozen_frames",
                     "resnet10_finetuned"):  # fmt: skip
            cases[f"{name}_bf16"] = [*cases[name], "policy.image_autocast=true"]
        chosen = list(cases) if args.cases == "all" else args.cases.split(",")
        if args.update_graph:  # side by side: each case eager, then captured
            for name in list(chosen):
                cases[f"{name}_graph"] = [*cases[name], "algo.update_graph=on"]
                chosen.insert(chosen.index(name) + 1, f"{name}_graph")
        rows = []
        for name in chosen:
            try:
                rows.append(bench(name, cases[name], args.device, args.rows, args.updates, args.repeats, args.size))
            except Exception as err:  # noqa: BLE001 - one failing case (memory) must not lose the rest
                print(json.dumps({"case": name, "error": f"{type(err).__name__}: {err}"[:300]}), flush=True)
                rows.append({"case": name, "error": f"{type(err).__name__}: {str(err)[:300]}"})
            if args.out:  # after every case: a run stopped part-way keeps what it measured
                Path(args.out).write_text(json.dumps(result(args, rows), indent=1) + "\n")
    device = result(args, rows)["device"]
    print(f"\n{device}, {args.size}x{args.size} x2 cameras, batch 256")
    print(f"{'case':32s} {'updates/s':>10s} {'pipelined':>10s} {'median ms':>10s} {'p99 ms':>9s} {'sample+copy ms':>15s}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:32s} {r['error'][:60]}")
        else:
            print(f"{r['case']:32s} {r['updates_per_s_median']:10.1f} {r['pipelined_updates_per_s_median']:10.1f} "
                  f"{r['update_ms_median']:10.2f} "
                  f"{r['update_ms_p99']:9.2f} {r['sample_and_copy_ms_median']:15.2f}")  # fmt: skip


def result(args, rows: list[dict]) -> dict:
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"CPU ({torch.get_num_threads()} threads)"
    return {
        "benchmark": "image-SAC learner updates/s, batch 256, two cameras",
        "image_size": args.size, "state_dim": STATE_DIM, "device": device, "torch": torch.__version__,
        "replay_rows": args.rows, "cases": rows,
    }  # fmt: skip


if __name__ == "__main__":
    main()
