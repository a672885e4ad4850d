"""Control-loop timing: wake-up error statistics and real-time scheduling."""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class TimingStats:
    def __init__(self, window: int):
        self.errors: collections.deque[float] = collections.deque(maxlen=window)
        self.ticks = 0
        self.overruns = 0
        self._cached: tuple[float, dict[str, Any]] | None = None

    def add(self, err: float) -> None:
        self.errors.append(err)
        self.ticks += 1

    def summary(self, max_age_s: float = 0.0) -> dict[str, Any]:
        """Percentiles over the window, recomputed at most every ``max_age_s``."""
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < max_age_s:
            return {**self._cached[1], "ticks": self.ticks, "overruns": self.overruns}
        out = self._summary()
        self._cached = (now, out)
        return out

    def _summary(self) -> dict[str, Any]:
        e = np.abs(np.asarray(self.errors)) * 1e3
        out: dict[str, Any] = {"ticks": self.ticks, "overruns": self.overruns}
        if e.size:
            out.update(
                period_error_ms_p50=float(np.median(e)),
                period_error_ms_p99=float(np.percentile(e, 99)),
                period_error_ms_max=float(e.max()),
            )
        return out


def set_realtime(priority: int) -> None:
    if priority <= 0:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        log.info("control loop runs SCHED_FIFO priority %d", priority)
    except (PermissionError, OSError) as err:
        log.warning(
            "could not get real-time priority %d (%s); timing under load will suffer. Give the "
            "user an rtprio limit (/etc/security/limits.conf) or run a PREEMPT_RT kernel", priority, err
        )
