"""A sink stores each worker's chunks in the order the worker sent them, whatever order
the (threaded) actor runs the calls in."""

import random
import threading

from rlinf_user.runtime.learning.ordered_sink import SenderOrder


def _sink(max_held=8):
    stored = []
    order = SenderOrder(max_held=max_held)

    def add(chunk, sender, seq, base):
        return order.add(chunk, sender, seq, base, lambda c: stored.append(c) or 1)

    return order, stored, add


def test_early_chunks_wait_for_the_gap_and_copies_are_dropped():
    order, stored, add = _sink()
    assert add("a2", "w", 2, 0) == 0 and add("a1", "w", 1, 0) == 0  # held: 0 not here yet
    assert add("b0", "v", 0, 0) == 1  # another sender is not held up by this one's gap
    assert add("a0", "w", 0, 0) == 3
    assert stored == ["b0", "a0", "a1", "a2"]
    assert add("a1", "w", 1, 1) == 0  # a resend after a lost reply
    assert order.stats() == {"held_chunks": 0, "duplicate_chunks": 1, "chunk_gaps": 0}


def test_a_new_sink_starts_at_the_senders_lowest_unacknowledged_chunk():
    _, stored, add = _sink()
    # a restarted learner: the worker's chunks 0-4 went to the old one, 6 overtakes 5
    assert add("c6", "w", 6, 5) == 0
    assert add("c5", "w", 5, 5) == 2
    assert stored == ["c5", "c6"]
    # chunks the sender dropped for good (below base) are not waited for
    assert add("c9", "w", 9, 9) == 1 and stored[-1] == "c9"


def test_a_gap_that_never_fills_is_skipped_after_max_held_chunks():
    order, stored, add = _sink()
    for seq in range(1, 10):
        add(f"c{seq}", "w", seq, 0)
    assert stored == [f"c{s}" for s in range(1, 10)] and order.stats()["chunk_gaps"] == 1
    assert add("c0", "w", 0, 0) == 0  # too late: dropped, not stored out of order


def test_concurrent_out_of_order_calls_store_every_senders_stream_in_order():
    _, stored, add = _sink(max_held=64)
    calls = [(f"w{w}", s) for w in range(3) for s in range(40)]
    random.Random(0).shuffle(calls)
    threads = [threading.Thread(target=add, args=((w, s), w, s, 0)) for w, s in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in range(3):
        assert [s for sw, s in stored if sw == f"w{w}"] == list(range(40))
