"""A flow VLA's chunk as one captured replay (``policy.cuda_graph``): the same actions as the
eager chunk, batches padded to a few captured sizes, fallbacks that are said once and never
return a stale or wrong chunk, and refusals by name.

CUDA graphs need a GPU; here the same machinery runs with its ``rerun`` backend (the
function run again on the static buffers instead of a graph replayed), so the buffers,
padding, keys, fallbacks and invalidation are what is tested. The GPU run
(``benchmarks/gpu_benchmarks.sh``) checks the real graphs' chunks against the eager ones."""

import logging

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rlinf_user.config.compose import compose_config  # noqa: E402
from rlinf_user.env.spec import EnvSpec, obs_to_torch  # noqa: E402
from rlinf_user.policies.base import build_policy  # noqa: E402
from rlinf_user.policies.chunk_graph import ChunkGraphs, bucket, graph_mode, pad_rows  # noqa: E402

SPEC = EnvSpec(state_dim=10, cameras={"front": (48, 64), "wrist": (32, 32)}, instruction=True)


def obs(b=3, seed=0):
    rng = np.random.default_rng(seed)
    words = ["pick up the cube", "push the cube to the left", "stack"]
    return obs_to_torch({
        "state": rng.normal(size=(b, 10)).astype(np.float32),
        "images": {"front": rng.integers(0, 255, (b, 48, 64, 3), dtype=np.uint8),
                   "wrist": rng.integers(0, 255, (b, 32, 32, 3), dtype=np.uint8)},
        "instruction": np.array([words[i % 3] for i in range(b)]),
    })  # fmt: skip


def policy(*extra, graphs: ChunkGraphs | None = None):
    torch.manual_seed(0)
    p = build_policy(compose_config(["policy=pi0", "policy.num_steps=3", *extra]).policy, SPEC).eval()
    if graphs is not None:  # no GPU here: the policy takes the rerun backend where it would take CUDA graphs
        p.chunk_graphs = lambda device: graphs
    return p


def test_modes_buckets_and_padding():
    assert [graph_mode(v) for v in (None, True, False, "auto", "ON", "off", "true")] == \
        ["auto", "on", "off", "auto", "on", "off", "on"]  # fmt: skip
    with pytest.raises(ValueError, match="policy.cuda_graph='fast': one of auto, on, off"):
        graph_mode("fast")
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 33)] == [1, 2, 4, 8, 8, 16, 64]
    x = torch.arange(6.0).view(3, 2)
    assert pad_rows(x, 4).tolist() == [[0, 1], [2, 3], [4, 5], [0, 1]] and pad_rows(x, 3) is x


def test_the_replayed_chunk_is_the_eager_chunk_and_batches_share_a_padded_graph():
    eager, graphs = policy(), ChunkGraphs(backend="rerun")
    fast = policy(graphs=graphs)
    for b in (3, 4, 1):  # 3 and 4 share the graph for 4; 1 gets its own
        o = obs(b, seed=b)
        torch.testing.assert_close(fast.act(o, deterministic=True).actions, eager.act(o, deterministic=True).actions)
    assert graphs.captures == 2 and graphs.fallbacks == 0 and {k[1] for k in graphs.graphs} == {1, 4}
    # the Flow-Noise chunk: its own graph; its chain, log-prob and value are the policy's for that chain
    o = obs(3)
    out = fast.act(o)
    assert out.actions.shape == (3, 4, 7) and out.extras["sample"].shape == (3, 4, 4, 32)
    torch.testing.assert_close(out.actions, eager.env_actions(out.extras["sample"][:, -1]))
    logp, _ = eager.log_prob(o, out.extras["sample"])
    torch.testing.assert_close(out.extras["log_prob"], logp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.extras["value"], eager.value(o))
    assert not torch.equal(out.extras["sample"], fast.act(o).extras["sample"])  # fresh noise every replay


def test_weights_loaded_in_place_are_what_the_next_replay_reads_and_replaced_tensors_recapture(caplog):
    graphs = ChunkGraphs(backend="rerun")
    fast, other = policy(graphs=graphs), policy()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    o = obs(2)
    before = fast.act(o, deterministic=True).actions
    fast.load_state_dict(other.state_dict())  # in place: a weight update
    after = fast.act(o, deterministic=True).actions
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, other.act(o, deterministic=True).actions)
    assert graphs.captures == 1
    with caplog.at_level(logging.INFO, logger="rlinf_user.policies.chunk_graph"):
        for p in fast.parameters():  # replaced storage (as .to() or new adapters do): the graph would read freed memory
            p.data = p.data.clone()
        torch.testing.assert_close(fast.act(o, deterministic=True).actions, after)
    assert graphs.captures == 2 and "captured again" in caplog.text


def test_shapes_it_does_not_hold_run_eagerly_and_say_so_once(caplog):
    eager = policy()
    graphs = ChunkGraphs(max_batch=4, max_graphs=1, backend="rerun")
    fast = policy(graphs=graphs)
    with caplog.at_level(logging.WARNING, logger="rlinf_user.policies.chunk_graph"):
        for _ in range(2):
            o = obs(6)  # above max_batch
            torch.testing.assert_close(fast.act(o, deterministic=True).actions, eager.act(o, deterministic=True).actions)
        fast.act(obs(2), deterministic=True)  # the one graph allowed
        for _ in range(2):
            o = obs(1)  # a new shape past max_graphs
            torch.testing.assert_close(fast.act(o, deterministic=True).actions, eager.act(o, deterministic=True).actions)
    assert graphs.fallbacks == 4 and graphs.captures == 1
    assert caplog.text.count("above the captured sizes") == 1 and caplog.text.count("shapes captured already") == 1


def test_a_capture_that_fails_leaves_the_policy_eager_from_then_on(caplog):
    graphs = ChunkGraphs(backend="rerun")
    calls = []

    def syncs(x):  # as an op a graph cannot hold would fail its capture
        calls.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    with caplog.at_level(logging.WARNING, logger="rlinf_user.policies.chunk_graph"):
        assert graphs.run("flow", syncs, [torch.zeros(2, 3)], (1,)) is None
        assert graphs.run("flow", syncs, [torch.zeros(2, 3)], (1,)) is None
    assert len(calls) == 1 and graphs.disabled and caplog.text.count("acts eagerly from now on") == 1
    oom = ChunkGraphs(backend="rerun")

    def too_big(x):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):  # the rollout server's to answer: it halves its batch
        oom.run("flow", too_big, [torch.zeros(2, 3)], (1,))
    assert not oom.graphs and oom.disabled is None


def test_refusals_name_the_setting():
    p = policy("policy.cuda_graph=on")
    with pytest.raises(ValueError, match="policy.cuda_graph=on: CUDA graphs need a CUDA device, and this policy acts on cpu"):
        p.act(obs(1), deterministic=True)
    assert policy().chunk_graphs(torch.device("cpu")) is None  # auto: eager off a GPU
    with pytest.raises(ValueError, match="policy.compile=aot_eager and policy.cuda_graph=on: choose one"):
        policy("policy.compile=aot_eager", "policy.cuda_graph=on")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, and this machine has none"):
            ChunkGraphs()
    p = policy()
    p.train()
    assert p.chunk_graphs(torch.device("cuda")) is None  # training passes stay eager


def test_fused_attention_is_the_eager_attention():
    """``scaled_dot_product_attention`` (grouped queries, the block mask, padded prompts)
    gives transformers' eager Gemma attention's chunk."""
    fused, ref = policy(), policy()
    ref.model.sdpa = False
    o = obs(3)
    torch.testing.assert_close(fused.act(o, deterministic=True).actions, ref.act(o, deterministic=True).actions,
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    sample = ref.act(o).extras["sample"]
    torch.testing.assert_close(fused.log_prob(o, sample)[0], ref.log_prob(o, sample)[0], rtol=1e-4, atol=1e-4)


def test_a_worker_or_rollout_server_off_a_gpu_refuses_cuda_graph_on_when_it_starts():
    from rlinf_user.policies.chunk_graph import refuse_unusable_graphs

    with pytest.raises(ValueError, match="policy.cuda_graph=on: CUDA graphs need a CUDA device"):
        refuse_unusable_graphs(policy("policy.cuda_graph=on"), torch.device("cpu"))
    refuse_unusable_graphs(policy(), torch.device("cpu"))  # auto: eager there, nothing to refuse
    refuse_unusable_graphs(object(), torch.device("cpu"))  # a policy without chunk graphs


@pytest.mark.parametrize("cameras", [["front", "wrist"], ["wrist"]])
def test_a_chunk_reads_nothing_back_to_the_host(cameras):
    """What a CUDA graph cannot hold, caught on a CPU: the chunk's functions run on meta
    tensors (shapes, no data), where any read of a value on the host (``.item()``, a tensor
    in an ``if``, ``torch.distributions``' argument checks) raises. A model image slot the
    env has no camera for (``[wrist]``) was one such read."""
    p = policy(f"policy.cameras=[{','.join(cameras)}]")
    raw = p.raw_inputs(obs(2))  # the host's part: tokenising the instruction
    p = p.to("meta")
    meta = [x.to("meta") for x in raw]
    cfg = p.model.cfg
    with torch.no_grad():
        (actions,) = p._flow_chunk(meta[0], torch.zeros(2, cfg.horizon, cfg.action_dim, device="meta"), *meta[1:])
        chain = p._chain_chunk(*meta)
    assert actions.shape == (2, 4, 7) and [tuple(x.shape) for x in chain] == [(2, 4, 7), (2, 4, 4, 32), (2, 28), (2,)]
    with pytest.raises(RuntimeError, match="meta"):  # the check itself: a host read does raise here
        bool(meta[0].sum() > 0)


def test_dsrl_s_embedding_and_flow_from_its_noise_replay_as_their_eager_passes():
    """``algo=dsrl`` on a GPU: the frozen base's embedding and its flow from the chosen noise
    (the env's dims, the rest zero) are replays of their own, equal to the eager passes
    over one shared prefix."""
    eager, graphs = policy(), ChunkGraphs(backend="rerun")
    fast = policy(graphs=graphs)
    o = obs(3)
    noise = torch.randn(3, *fast.noise_shape)
    prefix = eager.prefix(o)
    torch.testing.assert_close(fast.embed(o), eager.embed(o, prefix))
    torch.testing.assert_close(fast.act_from_noise(o, noise), eager.act_from_noise(o, noise, prefix=prefix))
    assert {k[0] for k in graphs.graphs} == {"embed", "flow"} and graphs.fallbacks == 0
