"""The daemon's request budget: per peer, in total, bounded peer table; throttled logs."""

from __future__ import annotations

import logging
import time

from rlinf_user.edge.ratelimit import LogThrottle, PeerLimiter


def test_one_peer_gets_its_burst_then_its_rate():
    t0 = time.monotonic()
    lim = PeerLimiter(per_peer_hz=10, total_hz=1000)
    allowed = sum(lim.allow("a", now=t0) for _ in range(100))
    assert allowed == 20  # burst: two seconds' worth
    assert sum(lim.allow("a", now=t0 + 1.0) for _ in range(100)) == 10  # then 10 per second
    assert lim.allow("b", now=t0 + 1.0)  # another peer has its own budget
    assert lim.limited == 170


def test_many_peers_share_the_total_and_a_refusal_costs_no_token():
    t0 = time.monotonic()
    lim = PeerLimiter(per_peer_hz=10, total_hz=20)
    allowed = sum(lim.allow(f"peer{i}", now=t0) for i in range(100))
    assert allowed == 40  # the total bucket's burst, whatever the number of peers
    # peer0 was refused by the total only: its own tokens were not spent
    assert lim.peers["peer99"].tokens == 20
    assert len(lim.peers) == 100


def test_the_peer_table_is_bounded():
    lim = PeerLimiter(per_peer_hz=10, total_hz=1e9, max_peers=8)
    for i in range(50):
        lim.allow(i, now=0.0)
    assert len(lim.peers) == 8 and list(lim.peers) == list(range(42, 50))


def test_log_throttle_logs_the_first_then_a_count(caplog):
    t = LogThrottle(logging.getLogger("throttle-test"), interval_s=10.0)
    with caplog.at_level(logging.WARNING, logger="throttle-test"):
        for _ in range(500):
            t.warn("refused", "refused a connection: %s", "bad key")
        t.first["refused"] -= 11  # as if the interval had passed
        t.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refused a connection: bad key", "refused: 499 more in the last 10 s"]
