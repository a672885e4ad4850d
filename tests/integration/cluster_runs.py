"""A training run in a thread against a ``ray.cluster_utils.Cluster`` simulated on this machine,
for the tests that add and remove its nodes while the run goes on."""

from __future__ import annotations

import contextlib
import json
import threading
import time


def wait_for(cond, timeout: float, what: str, thread=None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if thread is not None and not thread.is_alive():
            raise AssertionError(f"the run ended while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


class ClusterRun:
    """The trainer, its thread and (once it ended) the run's summary."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.result: dict = {}
        self.thread = threading.Thread(target=lambda: self.result.setdefault("p", trainer.run()), daemon=True)
        self.summary: dict | None = None

    def finish(self, timeout: float = 600) -> dict:
        self.thread.join(timeout=timeout)
        assert not self.thread.is_alive() and "p" in self.result
        self.summary = json.loads((self.trainer.run_dir / "eval" / "summary.json").read_text())
        return self.summary


@contextlib.contextmanager
def cluster_run(cluster, make_trainer):
    """Connect to ``cluster``, start ``make_trainer()``'s run in a thread, and on leaving close
    the trainer, Ray and the cluster (whatever happened)."""
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    run = None
    try:
        run = ClusterRun(make_trainer())
        run.thread.start()
        yield run
    finally:
        if run is not None:
            run.trainer.close()
        ray.shutdown()
        cluster.shutdown()
