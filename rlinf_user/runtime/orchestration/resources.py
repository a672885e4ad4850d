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


def run_snapshot(run_dir: str | os.PathLike, pids: dict[str, int]) -> dict:
    """One sample of a run's footprint: bytes of its replay log and whole folder, learner
    checkpoints kept, records readable from the log right now (it may be mid-append), the
    seconds that read took, and each named process's resident memory."""
    import time

    from rlinf_user.data.record_log import RecordLog

    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    records = sum(1 for _ in RecordLog(run_dir / "buffer").read_all(repair=False))
    return {
        "buffer_bytes": dir_bytes(run_dir / "buffer"), "run_dir_bytes": dir_bytes(run_dir),
        "checkpoints": len(list((run_dir / "checkpoints").glob("ckpt-*.pt"))),
        "log_records": records, "log_read_s": round(time.perf_counter() - t0, 4),
        **{f"rss_{name}": rss_bytes(pid) for name, pid in pids.items()},
    }  # fmt: skip
