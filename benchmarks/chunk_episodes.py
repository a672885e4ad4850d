"""Episodes of one reset state run side by side from chunk policies (the DSRL probes:
``vla_noise_reach.py``, ``vla_dsrl_critic_rank.py``), and how a probe reports."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np


def run_side_by_side(envs, spec, obs: list, chunks: Callable[[np.ndarray, list, int], np.ndarray]) -> np.ndarray:
    """Step every env of ``envs`` (each reset to ``obs[i]``) to its episode's end, a chunk at a
    time: ``chunks(idx, observations, k)`` gives the ``(len(idx), H, A)`` actions of the live
    envs ``idx`` for their ``k``-th chunk. Returns which episodes succeeded."""
    alive, won, k = np.ones(len(envs), bool), np.zeros(len(envs), bool), 0
    while alive.any():
        idx = np.flatnonzero(alive)
        actions = chunks(idx, [obs[j] for j in idx], k)
        k += 1
        for row, j in enumerate(idx):
            for act in actions[row]:
                obs[j], _, term, trunc, info = envs[j].step(spec.expand_action(act))
                if term or trunc:
                    alive[j] = False
                    won[j] = bool(info.get("success"))
                    break
    return won


def report(out: dict, path: str | None, detail: str = "per_state") -> None:
    """Print the probe's figures (its per-state detail left out) and write all of it to ``path``."""
    print(json.dumps({k: v for k, v in out.items() if k != detail}), flush=True)
    if path:
        Path(path).write_text(json.dumps(out, indent=2) + "\n")
