"""What a run holds: resident memory of its processes and bytes on disk (Linux /proc).

Used by the soak test and benchmark to show that a long run stays bounded."""

from __future__ import annotations

import os
from pathlib import Path


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (None when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def dir_bytes(path: str | os.PathLike) -> int:
    """Bytes of every file under ``path`` (0 when it does not exist)."""
    total = 0
    for p in Path(path).rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except FileNotFoundError:  # deleted while we walked (a retired log segment)
            pass
    return total
