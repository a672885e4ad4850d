"""The weight store: the small Ray actor where workers learn of new weight versions.

A module of its own that imports no torch: the actor's process then costs Ray's worker start
(about 0.5 s of CPU), not a torch import on top (about 1.5 s more), and every training run
starts one. The publisher and subscriber, which move tensors, are in ``store``."""

from __future__ import annotations

import time
from typing import Any


class WeightStore:
    """Where workers learn of new versions (a Ray actor in the runtime). For the ``ray``
    transport it holds, for every tensor, the version (and chunk references) of its
    current value; for ``tcp``, the learner's weight server to pull from."""

    def __init__(self) -> None:
        self.version = -1
        self.tensor_version: dict[str, int] = {}
        self.chunks: dict[int, list] = {}  # version -> its chunk references
        self.published_at: dict[int, float] = {}
        self.stream: dict[str, Any] | None = None  # the weight server's endpoint (tcp)

    def publish(self, version: int, ref_box: list, names: list[str], stream: dict[str, Any] | None = None) -> int:
        """``ref_box``: the version's chunk references (in a list so Ray does not resolve
        them); ``names``: the tensors it carries, on top of what earlier versions hold;
        ``stream``: instead of chunks, the endpoint serving the version."""
        if version <= self.version:
            raise ValueError(f"weight version {version} is not newer than {self.version}")
        self.version = version
        if stream is not None:  # the server knows which tensors are current
            self.stream = dict(stream)
            self.tensor_version.clear()
            self.chunks.clear()
            self.published_at = {version: time.time()}
            return version
        self.stream = None
        for n in names:
            self.tensor_version[n] = version
        self.chunks[version] = list(ref_box)
        self.published_at[version] = time.time()
        live = set(self.tensor_version.values()) | {version}
        for v in [v for v in self.chunks if v not in live]:  # nobody's current value: drop
            del self.chunks[v]
            self.published_at.pop(v, None)
        return self.version

    def latest(self, newer_than: int = -1) -> tuple[int, Any, float] | None:
        """``(version, [(v, [refs...]), ...], published_at)`` for the versions holding a
        tensor newer than ``newer_than`` (oldest first), ``(version, {"stream": endpoint},
        published_at)`` for a served version, or None when nothing is newer."""
        if self.version <= newer_than:
            return None
        if self.stream is not None:
            return self.version, {"stream": self.stream}, self.published_at[self.version]
        wanted = sorted({v for v in self.tensor_version.values() if v > newer_than})
        return self.version, [(v, self.chunks[v]) for v in wanted], self.published_at[self.version]

    def current_version(self) -> int:
        return self.version
