import numpy as np
import pytest

from rlinf_user.data.replay import ReplayBuffer, TransitionError
from rlinf_user.runtime.learning.replay_service import ReplayService


def chunk(n=10, start=0, state_dim=4, nan=False):
    s = np.arange(start, start + n, dtype=np.float32)[:, None].repeat(state_dim, 1)
    c = {
        "obs/state": s,
        "next_obs/state": s + 1,
        "action": np.zeros((n, 7), np.float32),
        "reward": np.arange(start, start + n, dtype=np.float32),
        "terminated": np.zeros(n, np.float32),
        "policy_version": np.full(n, 3, np.int64),
        "intervention": np.zeros(n, bool),
    }
    if nan:
        c["reward"][n // 2] = np.nan
    return c


def test_ring_wraps_and_samples_only_stored(tmp_path):
    rb = ReplayBuffer(capacity=15)
    rb.add(chunk(10, 0))
    rb.add(chunk(10, 10))
    assert rb.size == 15 and rb.total_added == 20
    s = rb.sample(500, np.random.default_rng(0))
    # slots 0-4 were overwritten by transitions 15-19; 0-4 are gone
    assert set(s["reward"].astype(int)) == set(range(5, 20))
    np.testing.assert_array_equal(s["next_obs/state"][:, 0], s["obs/state"][:, 0] + 1)


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda c: c.pop("reward"), "lacks"),
        (lambda c: c.__setitem__("action", np.zeros((3, 7), np.float32)), "ragged"),
        (lambda c: c["obs/state"].__setitem__((0, 0), np.inf), "NaN/Inf"),
    ],
)
def test_bad_chunks_are_refused_and_store_nothing(tmp_path, bad, match):
    rb = ReplayBuffer(100, tmp_path)
    rb.add(chunk(5))
    c = chunk(5, 5)
    bad(c)
    with pytest.raises(TransitionError, match=match):
        rb.add(c)
    assert rb.size == 5
    rb.close()
    again = ReplayBuffer(100, tmp_path)
    assert again.restore() == 5  # nothing of the bad chunk reached the disk either


def test_schema_mismatch_refused():
    rb = ReplayBuffer(100)
    rb.add(chunk(5, state_dim=4))
    with pytest.raises(TransitionError, match="shape"):
        rb.add(chunk(5, state_dim=6))


def test_persistent_buffer_survives_restart(tmp_path):
    rb = ReplayBuffer(1000, tmp_path)
    for i in range(5):
        rb.add(chunk(10, 10 * i))
    # no close(): simulate a crash; appends were fsynced
    rb2 = ReplayBuffer(1000, tmp_path)
    assert rb2.restore() == 50
    s = rb2.sample(200, np.random.default_rng(1))
    assert s["policy_version"].dtype == np.int64 and set(s["policy_version"]) == {3}
    assert sorted(set(s["reward"].astype(int))) == sorted(set(s["reward"].astype(int)) & set(range(50)))


def test_service_rejects_nan_without_raising(tmp_path):
    svc = ReplayService(100, str(tmp_path))
    assert svc.add(chunk(4)) == 4
    assert svc.add(chunk(4, nan=True)) == 0
    assert svc.stats()["rejected"] == 1 and svc.size() == 4


def test_demo_mixing_ratio(tmp_path):
    demo_dir = tmp_path / "demos"
    d = ReplayBuffer(100, demo_dir)
    d.add({**chunk(20), "reward": np.full(20, -1.0, np.float32)})
    d.close()
    svc = ReplayService(100, None, demo_path=str(demo_dir))
    svc.add(chunk(20))
    batch = svc.sample(batch_size=8, num_batches=3, demo_ratio=0.5)
    assert batch["reward"].shape == (3, 8)
    assert ((batch["reward"] == -1).sum(axis=1) == 4).all()


def test_demos_loaded_after_construction_are_the_ones_a_path_would_load(tmp_path):
    demo_dir = tmp_path / "demos"
    d = ReplayBuffer(100, demo_dir)
    d.add({**chunk(20), "reward": np.full(20, -1.0, np.float32)})
    d.close()
    later = ReplayService(100, None)
    assert later.sample_demos(4) is None
    assert later.load_demos(str(demo_dir)) == 20
    assert ReplayService(100, None, demo_path=str(demo_dir)).demos.size == later.demos.size
    assert (later.sample_demos(4)["reward"] == -1).all()
    with pytest.raises(FileNotFoundError, match="no replay log"):
        later.load_demos(str(tmp_path / "nope"))


def test_missing_demos_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no replay log"):
        ReplayService(10, None, demo_path=str(tmp_path / "nope"))


def flagged(n, start, every=4):
    c = chunk(n, start)
    c["intervention"] = (np.arange(start, start + n) % every) == 0
    return c


def test_interventions_are_drawn_on_the_demo_side(tmp_path):
    svc = ReplayService(1000, str(tmp_path / "buf"), interventions_as_demos=True, seed=1)
    svc.add(flagged(40, 0))  # transitions 0, 4, 8, ... were the human's
    batch = svc.sample(batch_size=10, num_batches=50, demo_ratio=0.5)
    demo_side = batch["reward"][:, 5:].astype(int)
    assert (demo_side % 4 == 0).all()  # only intervention transitions on the demo side
    online = batch["reward"][:, :5].astype(int)
    assert (online % 4 != 0).any()  # the online side draws from everything
    assert svc.stats()["interventions"] == 10 and svc.stats()["intervention_samples"] == 250
    svc.close()
    # the pool is the flag column of the persistent buffer: a restart has it back
    again = ReplayService(1000, str(tmp_path / "buf"), interventions_as_demos=True)
    assert again.stats()["interventions"] == 10
    assert (again.sample(8, 1, 0.5)["reward"][0, 4:].astype(int) % 4 == 0).all()


def test_interventions_pool_with_loaded_demos_in_proportion(tmp_path):
    demo_dir = tmp_path / "demos"
    d = ReplayBuffer(100, demo_dir)
    d.add({**chunk(30), "reward": np.full(30, -1.0, np.float32)})
    d.close()
    svc = ReplayService(1000, None, demo_path=str(demo_dir), interventions_as_demos=True, seed=0)
    svc.add(flagged(40, 0, every=4))  # 10 interventions next to 30 demos
    batch = svc.sample(batch_size=100, num_batches=20, demo_ratio=0.5)
    demo_side = batch["reward"][:, 50:]
    share = float((demo_side >= 0).mean())
    assert 0.2 < share < 0.3  # 10 / (10 + 30) of the demo side are interventions
    assert set(batch) == set(chunk(1)) | {"from_demos"}  # keys common to every source, and which rows are demos
    assert not batch["from_demos"][:, :50].any() and batch["from_demos"][:, 50:].all()


def test_without_interventions_or_demos_the_batch_is_all_online():
    svc = ReplayService(100, None, interventions_as_demos=True)
    svc.add(chunk(20))  # nobody intervened yet
    batch = svc.sample(batch_size=8, num_batches=2, demo_ratio=0.5)
    assert batch["reward"].shape == (2, 8) and svc.stats()["intervention_samples"] == 0
    assert batch["from_demos"].shape == (2, 8) and not batch["from_demos"].any()


def test_log_keeps_a_capacity_worth_and_deletes_older_segments(tmp_path):
    rb = ReplayBuffer(100, tmp_path, segment_bytes=4096)  # a few chunks per segment
    for i in range(60):
        rb.add(chunk(10, 10 * i))  # 600 transitions through a 100-slot buffer
    log = rb.log
    assert log.deleted_segments > 0
    rows = sum(log._rows[s.name] for s in log.segments())
    assert 100 <= rows < 100 + 3 * 40  # a capacity's worth plus at most about a segment
    rb.close()
    again = ReplayBuffer(100, tmp_path, segment_bytes=4096)
    assert again.restore() == rows and again.size == 100
    newest = set(again.storage["reward"].astype(int))
    assert newest == set(range(500, 600))  # the restart refilled it with the newest 100
    full = ReplayBuffer(100, tmp_path / "all", segment_bytes=4096, keep_full_log=True)
    for i in range(60):
        full.add(chunk(10, 10 * i))
    assert full.log.deleted_segments == 0 and sum(1 for _ in full.log.read_all()) == 60


def test_intervention_pool_follows_the_ring_as_flags_are_overwritten():
    svc = ReplayService(40, None, interventions_as_demos=True, seed=0)
    flagged = chunk(10, 0)
    flagged["intervention"][:] = True
    svc.add(flagged)
    svc.add(chunk(10, 10))
    assert list(svc._interventions()) == list(range(10))
    svc.add(chunk(10, 20))  # no flags added or overwritten: the cached index stays
    cached = svc._interventions()
    svc.add(chunk(10, 30))
    assert svc._interventions() is cached
    svc.add(chunk(10, 40))  # wraps onto the flagged positions 0..9
    assert len(svc._interventions()) == 0
    batch = svc.sample(8, 1, demo_ratio=0.5)  # no pool left: all online
    assert batch["reward"].shape == (1, 8) and svc.intervention_samples == 0


def test_a_buffer_too_big_for_memory_is_refused_with_a_capacity_that_fits(monkeypatch):
    from rlinf_user.data import replay

    monkeypatch.setattr(replay, "available_bytes", lambda: 24 * 2**30)
    rb = replay.ReplayBuffer(1_000_000)
    c = {**chunk(2), "obs/images/front": np.zeros((2, 128, 128, 3), np.uint8)}
    with pytest.raises(MemoryError, match=r"need 45\.8 GiB.*set buffer.capacity="):
        rb.add(c)
    small = replay.ReplayBuffer(100_000)
    assert small.add(c) == 2  # 4.6 GiB fits


def test_the_replay_service_refuses_a_capacity_before_its_first_row(monkeypatch, tmp_path):
    """Given the rows' known columns, the service refuses at construction, not when a
    worker's first chunk arrives; with frame features the frames are not counted."""
    from rlinf_user.data import replay
    from rlinf_user.runtime.learning.replay_service import ReplayService

    monkeypatch.setattr(replay, "available_bytes", lambda: 24 * 2**30)
    expected = replay.expected_schema(7, {"front": (128, 128), "wrist": (128, 128)})
    assert expected["next_obs/images/wrist"] == ((128, 128, 3), np.dtype(np.uint8))
    with pytest.raises(MemoryError, match=r"196,664 bytes each \(obs/images/front 128x128x3, .*set buffer.capacity=65,000 "):
        ReplayService(1_000_000, str(tmp_path / "buffer"), expected=expected)
    assert not list((tmp_path / "buffer").glob("seg-*.log"))  # nothing created on disk either
    feats = replay.expected_schema(7, {"front": (128, 128)}, frames=False)
    assert list(feats) == ["obs/state", "next_obs/state"]
    ReplayService(1_000_000, None, expected=feats)  # 56 bytes a row: fits


def test_gather_writes_each_column_into_the_arrays_given_and_matches_a_plain_gather():
    buf = ReplayBuffer(100, nstep=3, gamma=0.5)
    buf.add({**chunk(30), "truncated": np.zeros(30, np.float32)})
    idx = np.array([[3, 7, 11], [0, 29, 5]])
    plain = buf.gather(idx)
    whole = {k: np.full((2, 5, *shape), -7, dtype) for k, (shape, dtype) in buf.columns().items()}
    before = {k: v.copy() for k, v in whole.items()}
    views = {k: v[:, 1:4] for k, v in whole.items()}  # strided views inside a larger batch
    assert buf.gather(idx, views) is views
    assert set(plain) == set(whole) and "discount" in plain  # the n-step columns included
    for k, v in plain.items():
        np.testing.assert_array_equal(whole[k][:, 1:4], v)
        np.testing.assert_array_equal(whole[k][:, [0, 4]], before[k][:, [0, 4]])  # rows outside untouched
    # the bootstrap observation is the one 3 rows on (no episode end in this chunk)
    np.testing.assert_array_equal(plain["next_obs/state"][0, 0], buf.storage["next_obs/state"][5])


def test_a_process_that_samples_keeps_its_batch_memory():
    from rlinf_user.data.replay import keep_batch_memory

    assert keep_batch_memory() is True  # glibc: the thresholds were raised
    svc = ReplayService(100, None)
    svc.add(chunk(20))
    batch = svc.sample(batch_size=8, num_batches=2)
    assert batch["obs/state"].shape == (2, 8, 4) and batch["obs/state"].flags.c_contiguous
