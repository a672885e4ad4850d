"""What the profile (:mod:`.profile`) puts in place of the rest of a run: a receiving actor that
takes a worker's chunks (and keeps them when asked), and an observation of zeros for a robot
that is not stepped."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_user.env.spec import Col


def _zero_obs(spec) -> dict[str, Any]:
    """One observation of the spec's shapes, all zeros (a robot is not stepped to get one)."""
    obs: dict[str, Any] = {Col.STATE: np.zeros(spec.state_dim, np.float32),
                           Col.IMAGES: {k: np.zeros((*hw, 3), np.uint8) for k, hw in spec.cameras.items()}}  # fmt: skip
    if spec.instruction:
        obs[Col.INSTRUCTION] = "profile"
    return obs


def _sink_class():
    import ray

    @ray.remote
    class Sink:
        """The receiving end of the transport profile: takes chunks, serves a batch."""

        def __init__(self):
            self.rows = None
            self.kept: list[dict] | None = None  # chunks kept while keeping (on-policy update profile)

        def ping(self) -> int:
            return 0

        def keep(self, on: bool) -> list[dict]:
            """Start keeping the chunks that arrive (on), or stop and return them."""
            kept, self.kept = self.kept or [], ([] if on else None)
            return kept

        def add(self, chunk: dict, sender=None, seq: int = 0, base: int = 0) -> int:
            if self.kept is not None:
                self.kept.append(chunk)
            return len(chunk[Col.REWARD])

        def fill(self, chunk: dict) -> int:
            self.rows = chunk
            return len(chunk[Col.REWARD])

        def batch(self) -> dict:
            return self.rows

    return Sink
