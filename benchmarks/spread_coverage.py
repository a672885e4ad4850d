"""How well ``teleop.spread`` covers gym_hil's pick box, against random draws: for n chosen of
1,000 uniform candidates over the box (x 0.30-0.50 m, y -0.15-0.15 m), the share of the box
outside the chosen positions' convex hull (where a policy must extrapolate), the worst gap and
the median distance from a point of the box to its nearest chosen position. ``centre grid`` is
the grid's points half a cell inside the box, as ``teleop.spread`` laid them before they went
edge to edge. Means over 20 candidate draws.

    python benchmarks/spread_coverage.py

Then, for the teleop seeds 0, 1 and 2, the 40 block positions ``teleop.spread`` picks from
gym_hil's own resets (what ``bench_pick_random.py --spread --demos 40`` records): their span and
how many lie in the corner x > 0.45 m, y < -0.05 m. Writes
``benchmarks/results/spread_coverage.json``; about a minute on one core.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from machine import describe
from scipy.spatial import Delaunay

from rlinf_user.teleop import spread

RESULTS = Path(__file__).resolve().parent / "results"
LOW, HIGH = np.array([0.30, -0.15]), np.array([0.50, 0.15])  # gym_hil's _SAMPLING_BOUNDS
DRAWS, CANDIDATES = 20, 1000


def centre_grid(positions: np.ndarray, n: int) -> list[int]:
    """The grid as it was: cell centres, half a cell inside the candidates' box."""
    low, high = positions.min(0), positions.max(0)
    rows, cols = spread.grid_shape(n, high - low)
    chosen: list[int] = []
    for i in range(rows):
        for j in range(cols):
            d = np.linalg.norm(positions - (low + (high - low) * np.array([(i + 0.5) / rows, (j + 0.5) / cols])), axis=1)
            d[chosen] = np.inf
            chosen.append(int(np.argmin(d)))
    if len(chosen) > n:
        keep = spread.farthest_point_order(positions[chosen])[:n]
        chosen = [chosen[k] for k in sorted(keep)]
    return chosen


def measure(points: np.ndarray, probe: np.ndarray) -> dict[str, float]:
    dist = np.linalg.norm(probe[:, None] - points[None], axis=2).min(1)
    return {"outside_hull": float((Delaunay(points).find_simplex(probe) < 0).mean()),
            "worst_gap_m": float(dist.max()), "median_distance_m": float(np.median(dist))}  # fmt: skip


def gym_hil_set(seed: int, n: int = 40) -> dict:
    """The n block positions teleop.spread picks for teleop ``seed`` on gym_hil's random pick."""
    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.registry import make_recording_env
    from rlinf_user.seeds import teleop_episode_seed

    env = make_recording_env(compose_config([], sim="gym_hil_random").env, seed=0)
    try:
        seeds = [teleop_episode_seed(seed, k) for k in range(spread.CANDIDATES_PER_EPISODE * n)]
        pos = []
        for q in seeds:
            env.reset(seed=q)
            pos.append(spread.object_position(env))
    finally:
        env.close()
    xy = np.asarray(pos)[spread.choose_spread(np.asarray(pos), n)]
    row = {"teleop_seed": seed, "episodes": n, "low": xy.min(0).round(3).tolist(), "high": xy.max(0).round(3).tolist(),
           "in_corner": int(((xy[:, 0] > 0.45) & (xy[:, 1] < -0.05)).sum())}  # fmt: skip
    print(row)
    return row


def main() -> None:
    probe = np.stack(np.meshgrid(np.linspace(LOW[0], HIGH[0], 81), np.linspace(LOW[1], HIGH[1], 121)), -1).reshape(-1, 2)
    out: dict = {"what": __doc__.split("\n\n")[0], "box": [LOW.tolist(), HIGH.tolist()], "draws": DRAWS,
                 "candidates": CANDIDATES, "machine": describe(), "rows": []}  # fmt: skip
    for n in (20, 40):
        per: dict[str, list[dict[str, float]]] = {"edge to edge (teleop.spread)": [], "centre grid": [], "random": []}
        for s in range(DRAWS):
            rng = np.random.default_rng(s)
            cand = LOW + rng.uniform(0, 1, (CANDIDATES, 2)) * (HIGH - LOW)
            per["edge to edge (teleop.spread)"].append(measure(cand[spread.choose_spread(cand, n)], probe))
            per["centre grid"].append(measure(cand[centre_grid(cand, n)], probe))
            per["random"].append(measure(cand[rng.choice(CANDIDATES, n, replace=False)], probe))
        for how, ms in per.items():
            row = {"episodes": n, "selection": how, **{k: round(float(np.mean([m[k] for m in ms])), 4) for k in ms[0]}}
            out["rows"].append(row)
            print(row)
    out["gym_hil_sets"] = [gym_hil_set(seed) for seed in (0, 1, 2)]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spread_coverage.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
