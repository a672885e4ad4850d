"""Replay batches onto the learner's device: the same tensors as a direct conversion, in
order, a lazy source read one batch ahead (on a GPU, the copy overlaps the update)."""

import numpy as np
import pytest
import torch

from rlinf_user.env.spec import EnvSpec
from rlinf_user.runtime.learning.device_batches import device_batches, replay_batch


def spec():
    return EnvSpec(state_dim=3, cameras={"front": (8, 12)}, active_dims=(0, 1, 6))


def host_batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs/state": rng.standard_normal((4, 3)),  # float64: arrives as float32
        "obs/images/front": rng.integers(0, 255, (4, 8, 12, 3), dtype=np.uint8),
        "next_obs/state": rng.standard_normal((4, 3)).astype(np.float32),
        "next_obs/images/front": rng.integers(0, 255, (4, 8, 12, 3), dtype=np.uint8),
        "action": rng.uniform(-1, 1, (4, 7)).astype(np.float32),
        "reward": rng.random(4, dtype=np.float32),
        "terminated": np.zeros(4, bool),
    }


def flatten(tree, prefix=""):
    if isinstance(tree, dict):
        return {k2: v2 for k, v in tree.items() for k2, v2 in flatten(v, f"{prefix}{k}/").items()}
    return {prefix.rstrip("/"): tree}


def check_same(got, want, device):
    got, want = flatten(got), flatten(want)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].device.type == torch.device(device).type, k
        assert got[k].dtype == want[k].dtype and torch.equal(got[k].cpu(), want[k]), k


def lazy(n, seen):
    for i in range(n):
        seen.append(i)
        yield host_batch(i)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_device_batches_equal_a_direct_conversion_in_order(device):
    seen = []
    out = device_batches(lazy(5, seen), spec(), device)
    first = next(out)
    # a lazy source is read at most one batch ahead of the caller
    assert seen[:1] == [0] and len(seen) <= (2 if device == "cuda" else 1)
    check_same(first, replay_batch(host_batch(0), spec(), "cpu"), device)
    assert first["action"].shape == (4, 3)  # the active action dims
    rest = list(out)
    assert len(rest) == 4 and seen == [0, 1, 2, 3, 4]
    for i, got in enumerate(rest, start=1):
        check_same(got, replay_batch(host_batch(i), spec(), "cpu"), device)
    assert list(device_batches([], spec(), device)) == []


@pytest.mark.gpu
def test_a_batch_copied_behind_a_running_update_is_complete_when_read():
    """The copy of the next batch is queued while the GPU is still busy with a long kernel
    sequence that reads the current one; every batch still arrives intact."""
    batches = [host_batch(i) for i in range(6)]
    big = torch.randn(4096, 4096, device="cuda")
    for i, got in enumerate(device_batches(batches, spec(), "cuda")):
        for _ in range(20):
            big = torch.tanh(big @ big * 1e-3)  # keeps the stream busy while the next copy is queued
        check_same(got, replay_batch(batches[i], spec(), "cpu"), "cuda")
