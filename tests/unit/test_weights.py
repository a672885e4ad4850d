"""Weight chunking and the store's bookkeeping of which version holds each tensor."""

import numpy as np
import pytest

from rlinf_user.runtime.weights.store import WeightStore, _assign, pack


def assemble(chunks, like):
    """What a subscriber does with a version's chunks: each value, or each part of a split
    tensor at its offset, copied straight into the target tensors."""
    import torch

    out = {k: torch.zeros_like(torch.as_tensor(v)) for k, v in like.items()}
    for chunk in chunks:
        for name, val in chunk.items():
            if isinstance(val, dict) and "part" in val:
                _assign(out[name], val["data"], val["offset"])
            else:
                _assign(out[name], val)
    return out


def test_pack_splits_large_tensors_and_groups_small_ones():
    rng = np.random.default_rng(0)
    state = {"big": rng.normal(size=(300, 100)).astype(np.float32), "a": np.ones(3), "b": np.arange(10.0)}
    chunks = pack(state, chunk_bytes=40_000)  # big: 120 kB -> 3 parts; a, b together
    assert len(chunks) == 4 and sum("big" in c for c in chunks) == 3
    parts = [c["big"] for c in chunks if "big" in c]
    assert [p["offset"] for p in parts] == [0, 10_000, 20_000] and all(p["shape"] == (300, 100) for p in parts)
    out = assemble(chunks, state)
    assert set(out) == set(state) and all(np.array_equal(out[k].numpy(), state[k]) for k in state)


def test_store_serves_only_versions_holding_current_values():
    store = WeightStore()
    store.publish(0, ["r0"], ["w", "b", "frozen"])
    store.publish(1, ["r1"], ["w", "b"])  # the frozen tensor is not sent again
    version, groups, _ = store.latest(-1)
    assert version == 1 and [v for v, _ in groups] == [0, 1]  # a new worker needs both
    assert store.latest(0)[1] == [(1, ["r1"])]  # a worker at v0 needs only v1
    assert store.latest(1) is None
    store.publish(2, ["r2"], ["w", "b", "frozen"])
    assert 0 not in store.chunks and 1 not in store.chunks  # nobody's current value any more
    with pytest.raises(ValueError, match="not newer"):
        store.publish(2, ["x"], ["w"])
    store.publish(3, [], [])  # nothing changed: a new version all the same
    version, groups, _ = store.latest(2)
    assert version == 3 and groups == []  # nothing to fetch, just the version to take
    assert [v for v, _ in store.latest(-1)[1]] == [2]


def test_bf16_tensors_travel_as_their_bits():
    import torch

    from rlinf_user.runtime.weights.store import to_numpy_state

    src = torch.randn(5, 3).to(torch.bfloat16)
    arr = to_numpy_state({"w": src})["w"]
    assert arr.dtype == np.int16
    dst = torch.zeros(5, 3, dtype=torch.bfloat16)
    for chunk in pack({"w": arr}, chunk_bytes=8):  # split into parts on the way
        _assign(dst, chunk["w"]["data"], chunk["w"]["offset"])
    assert torch.equal(dst, src)


def test_the_weight_store_actor_module_imports_no_torch():
    """The store's Ray actor process imports only its own module: a torch import there would
    add about 1.5 s of CPU to every training run's start."""
    import subprocess
    import sys

    code = "import sys, rlinf_user.runtime.weights.versions as v; v.WeightStore(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
