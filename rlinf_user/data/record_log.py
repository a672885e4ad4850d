"""Append-only, crash-tolerant log of transition chunks on disk.

Layout: ``<dir>/seg-00000.log, seg-00001.log, ...``. Each record is::

    b"RLTX" | uint64 payload length | uint32 crc32(payload) | payload

where the payload is an uncompressed ``.npz`` of flat numpy arrays (never pickle:
``np.load(..., allow_pickle=False)``). Records are flushed and fsynced as they are
appended, so a crash loses at most the record being written; a torn or corrupt tail is
detected by length/CRC on reading, reported, and truncated away before appending resumes.

With ``keep_rows`` the log stays bounded: when a new segment starts, the oldest segments
are deleted as long as the newer ones still hold at least ``keep_rows`` rows (a replay
buffer keeps its capacity's worth, so a restart restores a full buffer).
"""

from __future__ import annotations

import io
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"RLTX"
HEADER = struct.Struct("<4sQI")
SEGMENT_BYTES = 256 << 20


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    for k, v in arrays.items():
        if v.dtype.hasobject:
            raise ValueError(f"{k!r}: object arrays cannot be stored (no pickle in the replay log)")
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()


def decode(payload: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _rows_of(arrays: dict[str, np.ndarray]) -> int:
    return max((len(v) for v in arrays.values() if v.ndim > 0), default=0)


def _scan(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield (offset_after_record, payload) for every intact record of one segment."""
    with open(path, "rb") as f:
        offset = 0
        while True:
            head = f.read(HEADER.size)
            if not head:
                return
            if len(head) < HEADER.size:
                raise _Torn(offset, "truncated header")
            magic, length, crc = HEADER.unpack(head)
            if magic != MAGIC:
                raise _Torn(offset, "bad magic")
            payload = f.read(length)
            if len(payload) < length:
                raise _Torn(offset, "truncated payload")
            if zlib.crc32(payload) != crc:
                raise _Torn(offset, "checksum mismatch")
            offset += HEADER.size + length
            yield offset, payload


class _Torn(Exception):
    def __init__(self, offset: int, why: str):
        super().__init__(why)
        self.offset, self.why = offset, why


class RecordLog:
    """Durable append log of array dicts. ``fsync=False`` trades durability for speed."""

    def __init__(
        self, directory: str | os.PathLike, fsync: bool = True, segment_bytes: int = SEGMENT_BYTES,
        keep_rows: int | None = None,
    ):  # fmt: skip
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.segment_bytes = int(segment_bytes)
        self.keep_rows = keep_rows
        self._file = None
        self._path: Path | None = None
        self._rows: dict[str, int] = {}  # rows per segment, for the ones read or written here
        self.records = 0
        self.deleted_segments = 0

    def segments(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.log"))

    def read_all(self, repair: bool = True) -> Iterator[dict[str, np.ndarray]]:
        """Yield every intact record in order; a torn tail is logged and (optionally) cut.

        A reader beside a live bounded writer may find a listed segment already retired
        (deleted as the oldest); that segment is skipped, as its rows left the buffer."""
        for seg in self.segments():
            self._rows[seg.name] = 0
            try:
                for _good, payload in _scan(seg):
                    arrays = decode(payload)
                    self._rows[seg.name] += _rows_of(arrays)
                    yield arrays
            except FileNotFoundError:  # retired by a bounded writer after we listed it
                log.debug("replay log %s was retired while being read; skipping it", seg)
                self._rows.pop(seg.name, None)
            except _Torn as torn:
                log.warning(
                    "replay log %s: %s at byte %d (a crash mid-write); keeping the %d intact bytes",
                    seg, torn.why, torn.offset, torn.offset,
                )
                if repair:
                    with open(seg, "r+b") as f:
                        f.truncate(torn.offset)

    def append(self, arrays: dict[str, np.ndarray]) -> None:
        payload = encode(arrays)
        f = self._writer(len(payload))
        f.write(HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload)
        f.flush()
        if self.fsync:
            os.fsync(f.fileno())
        self.records += 1
        self._rows[self._path.name] = self._rows.get(self._path.name, 0) + _rows_of(arrays)

    def _writer(self, incoming: int):
        if self._file is not None and self._file.tell() + incoming > self.segment_bytes:
            self._file.close()
            self._file = None
        if self._file is None:
            segs = self.segments()
            if segs and segs[-1].stat().st_size + incoming <= self.segment_bytes:
                path = segs[-1]
            else:
                idx = int(segs[-1].stem.split("-")[1]) + 1 if segs else 0
                path = self.dir / f"seg-{idx:05d}.log"
            self._file = open(path, "ab")
            self._path = path
            self._rows.setdefault(path.name, 0)
            self._retain()
        return self._file

    def _retain(self) -> None:
        """Delete the oldest segments the newer ones make unnecessary (``keep_rows``)."""
        if self.keep_rows is None:
            return
        segs = self.segments()
        while len(segs) > 1 and all(s.name in self._rows for s in segs):
            if sum(self._rows[s.name] for s in segs[1:]) < self.keep_rows:
                break  # without the oldest, fewer than keep_rows would remain
            oldest = segs.pop(0)
            oldest.unlink()
            self._rows.pop(oldest.name, None)
            self.deleted_segments += 1
            log.info("replay log: deleted %s (the newer segments hold >= %d rows)", oldest.name, self.keep_rows)

    def size_bytes(self) -> int:
        return sum(s.stat().st_size for s in self.segments())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
