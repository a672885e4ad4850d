"""Demonstrations spread over the workspace: reset seeds chosen so that the object's initial
positions cover the box a simulator samples them from, instead of falling where N random
draws put them.

Forty random block positions cover gym_hil's pick box unevenly: one seed's 40 demos had 2 in
the corner x > 0.45 m, y < -0.05 m (11% of the box), and its policy picked 2 of the 11 test
positions there against 86 of 89 elsewhere (docs/results.md). ``teleop.spread=true`` picks
the seeds instead:

1. reset the env with ``candidates`` seeds of the run's own teleop stream (below the held-out
   ranges, see :mod:`rlinf_user.seeds`) and read where each placed the object;
2. lay a grid of at least N points over the candidates' bounding box, edge to edge (its outer
   rows and columns on the box's sides), its shape following the box's aspect, and take for
   each point the candidate nearest it;
3. when the grid has more points than N, keep N of those by farthest-point order (the corners
   and edges first, then the gaps between them).

Each chosen seed is still a seed of the teleop stream, so the dataset records which scene each
episode came from, and nothing is drawn from the held-out validation and test ranges.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

CANDIDATES_PER_EPISODE = 25  # candidate resets per wanted episode (40 episodes: 1,000 resets)


def object_position(env: Any) -> np.ndarray:
    """Where the env's last reset placed its object, in the plane (x, y): an env that supports
    spreading says so with a ``block_position`` property (gym_hil's pick)."""
    pos = getattr(env, "block_position", None)
    if pos is None:
        name = type(getattr(env, "unwrapped", env)).__name__
        raise ValueError(
            f"teleop.spread=true needs a simulator that reports where its reset placed the object "
            f"(gym_hil's pick: block_position); {name} does not. Drop teleop.spread."
        )
    return np.asarray(pos, np.float64)[:2]


def grid_shape(n: int, extent: Sequence[float]) -> tuple[int, int]:
    """(rows along x, columns along y) with rows x columns >= n, cells about square."""
    if n < 1:
        raise ValueError(f"need at least one episode, got {n}")
    wx, wy = (max(float(e), 1e-9) for e in extent)
    rows = max(1, min(n, round(math.sqrt(n * wx / wy))))
    return rows, math.ceil(n / rows)


def farthest_point_order(points: np.ndarray) -> list[int]:
    """Indices of ``points`` in farthest-point order, starting from the one farthest from their
    mean: each next point is the one farthest from all chosen so far."""
    points = np.asarray(points, np.float64)
    first = int(np.argmax(np.linalg.norm(points - points.mean(0), axis=1)))
    order, dist = [first], np.linalg.norm(points - points[first], axis=1)
    while len(order) < len(points):
        nxt = int(np.argmax(dist))
        order.append(nxt)
        dist = np.minimum(dist, np.linalg.norm(points - points[nxt], axis=1))
    return order


def _edge_to_edge(k: int) -> np.ndarray:
    """k fractions from 0 to 1 (a single one: the middle)."""
    return np.array([0.5]) if k == 1 else np.linspace(0.0, 1.0, k)


def choose_spread(positions: np.ndarray, n: int) -> list[int]:
    """Indices of ``n`` of ``positions`` (K x 2) that cover their bounding box evenly."""
    positions = np.asarray(positions, np.float64)
    if len(positions) < n:
        raise ValueError(f"{len(positions)} candidate positions for {n} episodes")
    low, high = positions.min(0), positions.max(0)
    rows, cols = grid_shape(n, high - low)
    # grid points from edge to edge: the outermost rows and columns lie on the box's sides, so
    # the strip along each side gets demonstrations too (cell centres, half a cell inside, left
    # 29% of gym_hil's box outside the chosen set's hull)
    fx, fy = _edge_to_edge(rows), _edge_to_edge(cols)
    points = [low + (high - low) * np.array([a, b]) for a in fx for b in fy]
    chosen: list[int] = []
    for c in points:  # the nearest candidate not yet taken
        d = np.linalg.norm(positions - c, axis=1)
        d[chosen] = np.inf
        chosen.append(int(np.argmin(d)))
    if len(chosen) > n:
        keep = farthest_point_order(positions[chosen])[:n]
        chosen = [chosen[k] for k in sorted(keep)]
    return chosen


def spread_seeds(env: Any, episodes: int, seed_of: Callable[[int], int], candidates: int | None = None) -> list[int]:
    """Reset seeds for ``episodes`` episodes whose object positions cover the workspace;
    ``seed_of(k)`` is the k-th seed of the session's stream (the candidates are its first
    ``candidates`` seeds, by default 25 per episode)."""
    candidates = int(candidates or CANDIDATES_PER_EPISODE * episodes)
    seeds = [int(seed_of(k)) for k in range(candidates)]
    positions = []
    for s in seeds:
        env.reset(seed=s)
        positions.append(object_position(env))
    picked = [seeds[i] for i in sorted(choose_spread(np.asarray(positions), episodes))]
    log.info("spread %d episodes over %d candidate scenes", episodes, candidates)
    return picked
