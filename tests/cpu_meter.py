"""What each test costs in CPU, its own processes included (``RLINF_TEST_CPU=<file.jsonl>``).

On a 2-core machine both test lanes together keep the cores busy, so CI's time is the CPU
the tests spend, not their wall time. A sampling thread reads the CPU time of this process
and of every process below it (Ray's GCS, raylet and workers, edge daemons, franky-sim)
every ``INTERVAL_S``; each test is charged what the tree spent between its start and end.
A process that exits between two samples loses at most one interval of its time.
One JSON line per test: nodeid, wall seconds, CPU seconds, the most processes seen.
"""

from __future__ import annotations

import json
import os
import threading
import time

import psutil
import pytest

INTERVAL_S = 0.5


class CpuMeter:
    def __init__(self, path: str) -> None:
        self.path = path
        self.root = psutil.Process()
        self.seen: dict[int, tuple[float, float]] = {}  # pid -> (create_time, cpu seconds last read)
        self.total = 0.0  # CPU seconds of the tree since the meter started
        self.peak = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        with self.lock:
            self.peak = max(self.peak, len(procs))
            for p in procs:
                try:
                    t = p.cpu_times()
                    key, spent = p.create_time(), t.user + t.system
                except psutil.Error:
                    continue
                created, last = self.seen.get(p.pid, (key, 0.0))
                if created != key:  # a pid reused by a new process
                    last = 0.0
                self.total += max(0.0, spent - last)
                self.seen[p.pid] = (key, spent)

    def _run(self) -> None:
        while not self.stop.wait(INTERVAL_S):
            self._sample()

    def mark(self) -> tuple[float, float, int]:
        self._sample()
        with self.lock:
            peak, self.peak = self.peak, 0
            return time.monotonic(), self.total, peak


def register(config) -> None:
    """From conftest's ``pytest_configure``: meter the run when ``RLINF_TEST_CPU`` names a file."""
    path = os.environ.get("RLINF_TEST_CPU")
    if path:
        config.pluginmanager.register(_Plugin(CpuMeter(path)), "rlinf-cpu-meter")


class _Plugin:
    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):  # noqa: ARG002 - pytest's signature
        t0, c0, _ = self.meter.mark()
        outcome = yield
        t1, c1, peak = self.meter.mark()
        with open(self.meter.path, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "wall_s": round(t1 - t0, 2), "cpu_s": round(c1 - c0, 2),
                                "procs": peak}) + "\n")  # fmt: skip
        return outcome
