"""In-memory ring replay buffer over flat transition arrays, optionally backed by a
:class:`~rlinf_user.data.record_log.RecordLog` so it survives a crash.

A transition chunk is a dict of numpy arrays sharing the leading axis ``N``; keys are
flat paths such as ``obs/state``, ``obs/images/wrist``, ``next_obs/state``, ``action``,
``reward``, ``terminated``, ``truncated``, ``policy_version``, ``intervention``,
``env_id``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

from rlinf_user.data import nstep as nstep_returns
from rlinf_user.data.record_log import SEGMENT_BYTES, RecordLog
from rlinf_user.env.spec import Col

log = logging.getLogger(__name__)

REQUIRED_KEYS = Col.REQUIRED


class TransitionError(ValueError):
    """A chunk that cannot be stored: missing keys, ragged lengths, NaN."""


def validate_chunk(chunk: dict[str, np.ndarray], schema: dict[str, tuple] | None = None) -> int:
    """Return the chunk length or raise :class:`TransitionError` (nothing is stored)."""
    missing = [k for k in REQUIRED_KEYS if k not in chunk]
    if missing:
        raise TransitionError(f"transition chunk lacks {missing}")
    lengths = {k: len(v) for k, v in chunk.items()}
    n = lengths[Col.REWARD]
    if any(v != n for v in lengths.values()):
        raise TransitionError(f"ragged transition chunk: {lengths}")
    for k, v in chunk.items():
        if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
            raise TransitionError(f"transition chunk has NaN/Inf in {k!r}")
    if schema is not None:
        for k, (shape, _dtype) in schema.items():
            if k not in chunk:
                raise TransitionError(f"transition chunk lacks {k!r}")
            if chunk[k].shape[1:] != shape:
                raise TransitionError(f"{k!r} has shape {chunk[k].shape[1:]}, buffer holds {shape}")
    return n


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(capacity: int, schema: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
    """Refuse a buffer that cannot fit in memory, saying what capacity would (an image
    env with the state-sized default capacity asks for tens of GiB)."""
    row = sum(int(np.prod(shape, dtype=np.int64)) * (8 if dtype.kind == "U" else np.dtype(dtype).itemsize)
              for shape, dtype in schema.values())  # fmt: skip
    need, have = capacity * row, available_bytes()
    if have is not None and need > 0.8 * have:
        fit = max(1000, int(0.5 * have / max(row, 1)) // 1000 * 1000)
        images = [f"{k} {'x'.join(map(str, s))}" for k, (s, d) in schema.items() if len(s) == 3]
        raise MemoryError(
            f"buffer.capacity={capacity:,} transitions of {row:,} bytes each ({', '.join(images) or 'state'}) need "
            f"{need / 2**30:.1f} GiB, but {have / 2**30:.1f} GiB is available: set buffer.capacity={fit:,} "
            "(or smaller images: the camera's resize)"
        )


def expected_schema(state_dim: int, cameras: dict[str, tuple[int, int]], frames: bool = True
                    ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The columns every replay row will hold at least, known before the first chunk: the
    state and (``frames``: rows keep the frames, not a frozen encoder's features) each
    camera's frame, before and after. :func:`check_fits` on it refuses a capacity that
    cannot fit before any worker starts (the first chunk would otherwise be refused)."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for prefix in (Col.OBS, Col.NEXT_OBS):
        out[Col.state(prefix)] = ((int(state_dim),), np.dtype(np.float32))
        if frames:
            for cam, (h, w) in cameras.items():
                out[Col.image(prefix, cam)] = ((int(h), int(w), 3), np.dtype(np.uint8))
    return out


def keep_batch_memory(limit_bytes: int = 1 << 30) -> bool:
    """Let this process reuse the memory of freed batches instead of mapping fresh pages.

    glibc maps every allocation over its threshold (at most 32 MB by default) afresh and
    returns it on free, so each sampled batch of image features (~10 MB per 256 rows, a
    train call's batches together often over 32 MB) paid its page faults again: measured
    with a 60,000-row pixel buffer, 4 batches took 11.9 ms against 5.4 ms with the memory
    kept. This raises both thresholds to ``limit_bytes``. A process that samples replay
    calls it once; False where the C library is not glibc (nothing changed)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, int(limit_bytes)) and mallopt(m_trim_threshold, 2 * int(limit_bytes)))


class ReplayBuffer:
    def __init__(
        self, capacity: int, directory: str | Path | None = None, fsync: bool = True, keep_full_log: bool = False,
        segment_bytes: int = SEGMENT_BYTES, nstep: int = 1, gamma: float = 0.99,
    ):  # fmt: skip
        """``directory``: the on-disk log. It keeps what a restart needs to refill the
        buffer (its capacity's worth; older segments are deleted) unless ``keep_full_log``.
        ``nstep`` > 1: samples carry ``nstep``-step returns discounted by ``gamma``
        (:mod:`rlinf_user.data.nstep`); the log keeps the one-step rows."""
        self.capacity = int(capacity)
        self.gamma = float(gamma)
        self.nstep = nstep_returns.NStepReturns(nstep, gamma, self.capacity) if int(nstep) > 1 else None
        self.storage: dict[str, np.ndarray] = {}
        self.schema: dict[str, tuple] | None = None
        self.size = 0
        self.cursor = 0
        self.total_added = 0
        self.log = (
            RecordLog(directory, fsync=fsync, segment_bytes=segment_bytes, keep_rows=None if keep_full_log else self.capacity)
            if directory is not None
            else None
        )

    def restore(self) -> int:
        """Reload every intact chunk from the on-disk log; returns transitions restored."""
        if self.log is None:
            return 0
        n = 0
        for chunk in self.log.read_all():
            n += self._insert(chunk)
        log.info("restored %d transitions from %s", n, self.log.dir)
        return n

    def add(self, chunk: dict[str, np.ndarray]) -> int:
        n = validate_chunk(chunk, self.schema)
        if self.log is not None:
            self.log.append(chunk)  # durable first, then visible to the learner
        self._insert(chunk)
        return n

    def _insert(self, chunk: dict[str, np.ndarray]) -> int:
        n = len(chunk[Col.REWARD])
        if not self.storage:
            self.schema = {k: (v.shape[1:], v.dtype) for k, v in chunk.items()}
            check_fits(self.capacity, self.schema)
            # text columns (instructions) are held as shared Python strings, not fixed-width
            self.storage = {
                k: np.empty((self.capacity, *shape), dtype=object) if dtype.kind == "U"
                else np.zeros((self.capacity, *shape), dtype=dtype)
                for k, (shape, dtype) in self.schema.items()
            }  # fmt: skip
        idx = (self.cursor + np.arange(n)) % self.capacity
        for k, arr in self.storage.items():
            col = chunk[k]
            arr[idx] = [sys.intern(str(t)) for t in col] if arr.dtype == object else col
        if self.nstep is not None:
            self.nstep.add(chunk)
        self.cursor = int((self.cursor + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.total_added += n
        return n

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        return self.gather(rng.integers(0, self.size, size=batch_size))

    def columns(self) -> dict[str, tuple]:
        """What :meth:`gather` returns: each column's row shape and dtype."""
        cols = dict(self.schema or {})
        if self.nstep is not None:
            cols[Col.REWARD] = ((), self.nstep.ret.dtype)
            cols[Col.DISCOUNT] = ((), self.nstep.disc.dtype)
        return cols

    def gather(self, idx: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The rows at buffer positions ``idx`` (with n-step targets when configured: the
        n-step return, the bootstrap observation and its discount), gathered once each.
        ``out``: arrays shaped ``idx.shape + row`` (views of a larger batch are fine) that
        receive the columns they name, with no copy in between; returned."""
        boot = None if self.nstep is None else self.nstep.boot[idx]
        sources = dict(self.storage)
        if self.nstep is not None:
            sources[Col.REWARD], sources[Col.DISCOUNT] = self.nstep.ret, self.nstep.disc
        batch = {} if out is None else out
        for k in sources if out is None else out:
            rows = boot if boot is not None and k.startswith("next_obs/") else idx
            if out is None:
                batch[k] = sources[k][rows]
            else:  # 'clip' writes straight into a strided view ('raise' buffers it first)
                np.take(sources[k], rows, axis=0, out=out[k], mode="clip")
        return batch

    def recompute_nstep(self) -> None:
        """Rebuild the n-step returns from the stored rows (after rewards were relabelled)."""
        if self.nstep is None or self.size == 0:
            return
        order = (self.cursor + np.arange(self.size)) % self.capacity if self.size == self.capacity else np.arange(self.size)
        self.nstep = nstep_returns.NStepReturns(self.nstep.n, self.nstep.gamma, self.capacity)
        self.nstep.total = int(order[0])  # the oldest row's ring position
        self.nstep.add({k: v[order] for k, v in self.storage.items() if v.dtype != object})

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
