"""Data-parallel learning is the whole batch's learning: two replicas (real processes in a
gloo group), each updating on half of every batch with averaged gradients, end with the
weights one learner reaches on the whole batches."""

import pytest
import torch
import torch.multiprocessing as mp

from rlinf_user.algorithms.base import build_algorithm
from rlinf_user.config.compose import compose_config
from rlinf_user.env.spec import EnvSpec
from rlinf_user.runtime.learning.data_parallel import join_group, shard

SPEC = EnvSpec(state_dim=5, active_dims=(0, 1, 2))
STEPS = 6


def batches():
    g = torch.Generator().manual_seed(7)
    return [
        {"obs": {"state": torch.randn(32, 5, generator=g)}, "action": torch.rand(32, 3, generator=g) * 2 - 1}
        for _ in range(STEPS)
    ]


def bc():
    torch.manual_seed(0)
    cfg = compose_config(["algo=bc", "policy=mlp", "policy.hidden=[32,32]", "algo.lr=1e-2"])
    return build_algorithm(cfg.algo, cfg.policy, SPEC)


def replica(rank, world, address, out):
    torch.set_num_threads(1)
    algo = bc()
    join_group(algo, address, rank, world)
    for b in batches():
        algo.update(shard(b, world, rank))
    out[rank] = {k: v.clone() for k, v in algo.policy.state_dict().items()}
    torch.distributed.destroy_process_group()


def test_two_replicas_on_half_batches_end_where_one_learner_on_whole_batches_does(tmp_path):
    single = bc()
    for b in batches():
        single.update(b)
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        address = f"file://{tmp_path / 'rendezvous'}"
        procs = [ctx.Process(target=replica, args=(r, 2, address, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs)
        got = dict(out)
    for k, v in single.policy.state_dict().items():
        torch.testing.assert_close(got[0][k], v, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got[1][k], got[0][k], rtol=0, atol=0)  # replicas identical to the bit
    moved = sum(
        float((v - bc().policy.state_dict()[k]).abs().sum()) for k, v in got[0].items() if v.is_floating_point()
    )
    assert moved > 1e-2  # (the updates did change the weights)


def test_a_batch_too_small_to_shard_is_refused_and_shards_are_equal():
    b = {"obs": {"state": torch.zeros(5, 2)}, "instruction": ["a"] * 5, "action": torch.zeros(5, 3)}
    parts = [shard(b, 2, r) for r in range(2)]
    assert [len(p["action"]) for p in parts] == [2, 2] and parts[1]["instruction"] == ["a", "a"]
    with pytest.raises(ValueError, match="cannot feed 8"):
        shard(b, 8, 0)
