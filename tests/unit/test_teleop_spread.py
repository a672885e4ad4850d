"""teleop.spread: choosing reset seeds whose object positions cover the workspace."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_user.teleop.spread import choose_spread, farthest_point_order, grid_shape, object_position, spread_seeds


def test_grid_shape_has_enough_cells_and_follows_the_aspect():
    assert grid_shape(40, (0.17, 0.27)) == (5, 8)  # gym_hil's pick box: longer along y
    assert grid_shape(40, (0.27, 0.17)) == (8, 5)
    assert grid_shape(1, (1.0, 1.0)) == (1, 1)
    for n in range(1, 60):
        r, c = grid_shape(n, (0.2, 0.3))
        assert r * c >= n and r * c - n < max(r, c)  # no spare row or column
    with pytest.raises(ValueError, match="at least one episode"):
        grid_shape(0, (1.0, 1.0))


def test_farthest_point_order_starts_at_the_outside_and_visits_every_point():
    pts = np.array([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5], [1.0, 0.0], [0.0, 1.0], [0.6, 0.5]])
    order = farthest_point_order(pts)
    assert sorted(order) == list(range(len(pts)))
    assert set(order[:4]) == {0, 1, 3, 4}  # the corners before the middle


@pytest.mark.parametrize("n", [8, 20, 40])
def test_chosen_positions_cover_the_box_better_than_random_draws(n):
    """From 1,000 uniform candidates, the n chosen leave no large hole: every point of the box
    lies near a chosen one, far nearer than for n random draws, and each corner is covered."""
    rng = np.random.default_rng(0)
    box = np.array([0.17, 0.27])
    cand = rng.uniform(0, 1, (1000, 2)) * box
    chosen = choose_spread(cand, n)
    assert len(chosen) == n == len(set(chosen))
    probe = np.stack(np.meshgrid(np.linspace(0, box[0], 40), np.linspace(0, box[1], 40)), -1).reshape(-1, 2)

    def worst_gap(idx):
        return np.linalg.norm(probe[:, None] - cand[idx][None], axis=2).min(1).max()

    spread_gap = worst_gap(chosen)
    random_gaps = [worst_gap(rng.choice(1000, n, replace=False)) for _ in range(20)]
    assert spread_gap < 0.8 * np.median(random_gaps), (spread_gap, np.median(random_gaps))
    cell = np.sqrt(box.prod() / n)  # the side of a square cell holding one episode
    for corner in [(0, 0), (0, box[1]), (box[0], 0), tuple(box)]:
        assert np.linalg.norm(cand[chosen] - corner, axis=1).min() < cell


@pytest.mark.parametrize("n", [20, 40])
def test_chosen_positions_reach_the_box_sides(n):
    """A policy extrapolates badly past its demonstrations' hull: the n chosen span the box edge
    to edge, leaving under 10% of it outside their convex hull (n random draws leave about a
    quarter, a grid of cell centres half a cell inside about a third)."""
    from scipy.spatial import Delaunay

    rng = np.random.default_rng(1)
    box = np.array([0.2, 0.3])
    cand = rng.uniform(0, 1, (1000, 2)) * box
    probe = np.stack(np.meshgrid(np.linspace(0, box[0], 41), np.linspace(0, box[1], 61)), -1).reshape(-1, 2)

    def outside(points):
        return float((Delaunay(points).find_simplex(probe) < 0).mean())

    spread_out = outside(cand[choose_spread(cand, n)])
    random_out = np.median([outside(cand[rng.choice(1000, n, replace=False)]) for _ in range(10)])
    assert spread_out < 0.1 < random_out, (spread_out, random_out)


def test_too_few_candidates_are_refused():
    with pytest.raises(ValueError, match="3 candidate positions for 5 episodes"):
        choose_spread(np.zeros((3, 2)), 5)


class _Scene:
    """An env whose reset places its object from the seed, as gym_hil's pick reports it."""

    def __init__(self):
        self.block_position = None

    def reset(self, seed):
        self.block_position = np.random.default_rng(seed).uniform(0, 1, 3)


def test_spread_seeds_come_from_the_sessions_stream():
    env = _Scene()
    stream = lambda k: 1000 + 7 * k  # noqa: E731
    seeds = spread_seeds(env, 6, stream, candidates=60)
    assert len(seeds) == len(set(seeds)) == 6 and seeds == sorted(seeds)
    assert set(seeds) <= {stream(k) for k in range(60)}


def test_an_env_without_an_object_position_is_named():
    class Reach:
        def reset(self, seed):
            pass

    with pytest.raises(ValueError, match="Reach does not"):
        object_position(Reach())
