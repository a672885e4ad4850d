import numpy as np
import pytest

from rlinf_user.data.record_log import HEADER, RecordLog


def _chunk(i, n=5):
    return {"reward": np.full(n, i, np.float32), "obs/state": np.arange(n * 3, dtype=np.float32).reshape(n, 3) + i}


def test_round_trip_in_order(tmp_path):
    log = RecordLog(tmp_path)
    for i in range(4):
        log.append(_chunk(i))
    log.close()
    got = list(RecordLog(tmp_path).read_all())
    assert [int(c["reward"][0]) for c in got] == [0, 1, 2, 3]
    np.testing.assert_array_equal(got[2]["obs/state"], _chunk(2)["obs/state"])


@pytest.mark.parametrize("cut", [1, HEADER.size - 1, HEADER.size + 10])
def test_torn_tail_is_dropped_and_repaired(tmp_path, cut):
    log = RecordLog(tmp_path)
    for i in range(3):
        log.append(_chunk(i))
    log.close()
    seg = log.segments()[0]
    size_two = None
    # find the offset after two records by re-reading
    data = seg.read_bytes()
    log2 = RecordLog(tmp_path)
    assert len(list(log2.read_all())) == 3
    # simulate a crash in the middle of a 4th record
    torn = RecordLog(tmp_path)
    torn.append(_chunk(3))
    torn.close()
    full = seg.read_bytes()
    seg.write_bytes(full[: len(data) + cut])
    got = list(RecordLog(tmp_path).read_all())
    assert [int(c["reward"][0]) for c in got] == [0, 1, 2]
    assert seg.stat().st_size == len(data)  # the torn tail was cut off
    # appending after the repair yields a readable log again
    again = RecordLog(tmp_path)
    again.append(_chunk(9))
    again.close()
    assert [int(c["reward"][0]) for c in RecordLog(tmp_path).read_all()] == [0, 1, 2, 9]
    del size_two


def test_corrupt_payload_detected(tmp_path):
    log = RecordLog(tmp_path)
    log.append(_chunk(0))
    log.append(_chunk(1))
    log.close()
    seg = log.segments()[0]
    raw = bytearray(seg.read_bytes())
    raw[-5] ^= 0xFF  # flip a byte in the last record's payload
    seg.write_bytes(bytes(raw))
    got = list(RecordLog(tmp_path).read_all())
    assert len(got) == 1


def test_no_pickle_objects_accepted(tmp_path):
    log = RecordLog(tmp_path)
    with pytest.raises(ValueError):
        log.append({"reward": np.array([object()], dtype=object)})


def test_reader_beside_a_bounded_writer_skips_a_retired_segment(tmp_path):
    """A monitor reads the log while the writer retires its oldest segment: the segment
    it listed but could not open is skipped, the rest is read in order."""
    writer = RecordLog(tmp_path, segment_bytes=1500, keep_rows=10)
    for i in range(3):
        writer.append(_chunk(i))
    reader = RecordLog(tmp_path)
    it = reader.read_all(repair=False)
    first = next(it)  # the reader has listed every segment and read the first
    for i in range(3, 12):
        writer.append(_chunk(i))  # the bounded writer deletes old segments meanwhile
    assert writer.deleted_segments > 0
    rest = [int(c["reward"][0]) for c in it]
    writer.close()
    got = [int(first["reward"][0]), *rest]
    # the listed snapshot held chunks 0-2; the open first segment still reads (POSIX),
    # the retired later one is skipped rather than raising
    assert got == sorted(got) and 1 <= len(got) < 3
