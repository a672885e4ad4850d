"""A worker's chunks reach a threaded Ray sink in the order they were made, across a
sink killed mid-stream and replaced (what the learner's crash recovery does)."""

import random
import threading
import time

import pytest

from rlinf_user.runtime.learning.ordered_sink import SenderOrder
from rlinf_user.runtime.rollout.chunk_sender import ChunkSender


@pytest.fixture(scope="module")
def ray_local():
    import sys

    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's Sink goes by value
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


class Sink:
    """Stores chunk numbers; each call dawdles a random while first, as a busy learner
    would, so calls running at once finish out of order."""

    def __init__(self, ordered: bool):
        self.order = SenderOrder() if ordered else None
        self.stored: list[int] = []
        self.lock = threading.Lock()
        self.rng = random.Random(0)

    def _store(self, chunk):
        with self.lock:
            self.stored.append(int(chunk["n"]))
        return 1

    def add(self, chunk, sender=None, seq=0, base=0):
        time.sleep(self.rng.random() * 0.02)
        if self.order is None:
            return self._store(chunk)
        return self.order.add(chunk, sender, seq, base, self._store)

    def get(self):
        return self.stored


def _stream(ray, ordered: bool, kill_at: int | None = None, n: int = 60):
    cls = ray.remote(max_concurrency=4)(Sink)
    sinks = [cls.remote(ordered)]
    out = ChunkSender("w0", sinks[0])
    for i in range(n):
        out.put({"n": i})
        if i == kill_at:
            ray.kill(sinks[0])
            out.drain(timeout=5)  # the window's sends fail: the chunks wait for a new sink
            sinks.append(cls.remote(ordered))
            out.set_sink(sinks[-1])
    out.drain()
    return [ray.get(s.get.remote()) for s in sinks[-1:]], out


def test_an_unordered_threaded_sink_does_reorder_a_workers_chunks(ray_local):
    # the defect this guards against: without numbering, a threaded actor stores out of order
    (got,), _ = _stream(ray_local, ordered=False)
    assert sorted(got) == list(range(60)) and got != list(range(60))


def test_numbered_chunks_are_stored_in_order_across_a_killed_and_replaced_sink(ray_local):
    (after,), out = _stream(ray_local, ordered=True, kill_at=29)
    assert after == sorted(after) and after[-1] == 59  # the new sink stored in order
    assert after[0] <= 30  # nothing after the kill was skipped: unacknowledged chunks were resent
    assert not out.backlog and not out.inflight and out.dropped_chunks == 0
