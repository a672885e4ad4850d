"""Env steps/s per backend (single env, random actions, contract wrapper included).

Repeats each measurement ``--repeats`` times (fresh episode each repeat) and reports the
median and p99 of per-step latency and the median steps/s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
from omegaconf import OmegaConf

from rlinf_user.config.schema import EnvConfig
from rlinf_user.env.registry import make_env

# (backend, task, cameras, env.kwargs, variant); variant "library controller": gym_hil's
# own apply_action instead of FastOpspace (the same torques, side by side)
PIXELS = {"render_shadows": False, "render_samples": 0}
CASES = [
    ("maniskill", "PickCube-v1", [], {}, None),
    ("maniskill", "PushCube-v1", [], {}, None),
    ("maniskill", "PegInsertionSide-v1", [], {}, None),
    ("maniskill", "PickCube-v1", ["base_camera"], {}, None),
    ("gym_hil", "PandaPickCube", [], {}, "library controller"),
    ("gym_hil", "PandaPickCube", [], {}, None),
    ("gym_hil", "PandaPickCube", ["front", "wrist"], PIXELS, None),  # gym_hil_pixels' cameras and rendering
]


def bench(backend: str, task: str, cameras: list[str], kwargs: dict, variant: str | None, steps: int,
          repeats: int) -> dict:  # fmt: skip
    cfg = OmegaConf.structured(EnvConfig(backend=backend, task=task, cameras=cameras, kwargs=kwargs,
                                         max_episode_steps=10**9))  # fmt: skip
    size = cfg.image_size
    env = make_env(cfg, seed=0)
    if variant == "library controller":
        del env.base_env.apply_action  # gym_hil's own method again
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    for _ in range(20):
        env.step(rng.uniform(-1, 1, 7))
    lat, rates = [], []
    for r in range(repeats):
        env.reset(seed=r)
        t_run = time.perf_counter()
        for _ in range(steps):
            t = time.perf_counter()
            env.step(rng.uniform(-1, 1, 7).astype(np.float32))
            lat.append(time.perf_counter() - t)
        rates.append(steps / (time.perf_counter() - t_run))
    env.close()
    lat_ms = np.array(lat) * 1e3
    return {
        "backend": backend,
        "task": task,
        "obs": f"rgb {','.join(cameras)} {size}x{size}" if cameras else "state",
        **({"variant": variant} if variant else {}),
        "steps_per_s_median": round(float(np.median(rates)), 1),
        "step_ms_median": round(float(np.median(lat_ms)), 3),
        "step_ms_p99": round(float(np.percentile(lat_ms, 99)), 3),
        "repeats": repeats,
        "steps_per_repeat": steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--case", type=int, default=None, help="run one case in this process")
    args = ap.parse_args()
    if args.case is not None:
        backend, task, cams, kwargs, variant = CASES[args.case]
        try:
            row = bench(backend, task, cams, kwargs, variant, args.steps, args.repeats)
        except Exception as err:  # noqa: BLE001 - report and continue with other backends
            row = {"backend": backend, "task": task, "error": str(err)[:200]}
        print("RESULT " + json.dumps(row))
        return
    rows = []
    for i in range(len(CASES)):  # each simulator in a fresh process (OpenGL/Vulkan state)
        out = subprocess.run(
            [sys.executable, __file__, "--case", str(i), "--steps", str(args.steps), "--repeats", str(args.repeats)],
            capture_output=True, text=True,
        ).stdout
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        rows.append(json.loads(line[-1][7:]) if line else {"case": CASES[i], "error": "no result"})
        print(json.dumps(rows[-1]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
