"""The SAC family's update captured whole (``algo.update_graph``): replays that train exactly
as the eager update does, nothing read back to the host inside an update, and refusals
and fallbacks by name.

CUDA graphs need a GPU; here the machinery runs with its ``rerun`` backend (the update
re-run on the same static buffers instead of a graph replayed), which checks the buffers,
the phases, the saving and restoring around the capture's warm-up, and the fallbacks.
``benchmarks/bench_image_learner.py --update-graph`` times the real graphs."""

import logging

import pytest
import torch

from rlinf_user.algorithms.base import build_algorithm
from rlinf_user.algorithms.update_graph import UpdateGraphs, flatten, unflatten
from rlinf_user.config.compose import compose_config
from rlinf_user.env.spec import Col, EnvSpec

CAMERAS = {"front": (16, 16), "wrist": (16, 16)}


def spec(cameras=None):
    return EnvSpec(state_dim=6, cameras=dict(cameras or {}), active_dims=(0, 1, 2, 6))


def agent(*over, cameras=None, rerun=False):
    torch.manual_seed(0)
    policy = ["policy=cnn", "policy.hidden=[32]"] if cameras else ["policy.hidden=[32]"]
    cfg = compose_config(["algo=rlpd", "algo.num_critics=4", "algo.batch_size=16", "algo.bc_weight=0.5",
                          "algo.critic_warmup_updates=3", *policy, *over], sim="gym_hil")  # fmt: skip
    algo = build_algorithm(cfg.algo, cfg.policy, spec(cameras))
    if rerun:  # no GPU here: the same machinery, the update re-run instead of replayed
        algo.update_graphs = UpdateGraphs(algo, backend="rerun")
    return algo


def batch(k: int, n=16, cameras=None, device="cpu"):
    g = torch.Generator().manual_seed(k)

    def obs():
        return {"state": torch.randn(n, 6, generator=g),
                "images": {c: torch.randint(0, 255, (n, *hw, 3), generator=g, dtype=torch.uint8) for c, hw in
                           (cameras or {}).items()}}  # fmt: skip

    return {Col.OBS: obs(), Col.NEXT_OBS: obs(), Col.ACTION: torch.rand(n, 4, generator=g) * 2 - 1,
            Col.REWARD: (torch.rand(n, generator=g) > 0.7).float(), Col.TERMINATED: torch.zeros(n),
            Col.FROM_DEMOS: (torch.arange(n) < n // 2).float()}  # fmt: skip


@pytest.mark.parametrize("cameras", [None, CAMERAS])
def test_captured_updates_train_exactly_as_eager_ones(cameras):
    """The same seeds, batches and random draws: the weights, optimiser state and metrics of
    a learner whose updates are replayed equal the eager learner's after every update,
    through the critic warm-up, the first actor updates and the captures."""
    eager, fast = agent(cameras=cameras), agent(cameras=cameras, rerun=True)
    for k in range(10):
        b = batch(k, cameras=cameras)
        torch.manual_seed(100 + k)
        m_eager = eager.update(b)
        torch.manual_seed(100 + k)
        m_fast = fast.update(b)
        assert m_fast.keys() == m_eager.keys() and m_fast == pytest.approx(m_eager, rel=1e-5, abs=1e-6)
    for (name, p), q in zip(eager.critic.named_parameters(), fast.critic.parameters()):
        torch.testing.assert_close(q, p, msg=name)
    for p, q in zip(eager.policy.parameters(), fast.policy.parameters()):
        torch.testing.assert_close(q, p)
    g = fast.update_graphs
    assert g.captures == 2 and g.replays == 10 - 2  # two phases, each eager once, then captured and replayed
    assert fast.num_updates == eager.num_updates == 10


def test_an_update_reads_nothing_back_to_the_host():
    """Run on meta tensors (shapes, no data) any host read raises: the captured part holds
    none, for the pixel RLPD recipe (AWAC actor, own encoder), TD3+BC, CrossQ's batch
    renormalisation and SAC-Flow."""
    s = spec(CAMERAS)
    b = batch(0, cameras=CAMERAS)
    for over in (["algo=rlpd", "policy=cnn", "algo.actor_loss=awac", "algo.shared_encoder=false", "algo.bc_weight=0.5"],
                 ["algo=rlpd", "algo.bc_weight=1.0"], ["algo=crossq"], ["algo=sac_flow", "policy=flow"]):  # fmt: skip
        cfg = compose_config([*over, "algo.batch_size=16"], sim="gym_hil")
        with torch.device("meta"):
            algo = build_algorithm(cfg.algo, cfg.policy, s if "policy=cnn" in over else spec(), "meta")
        meta = unflatten(flatten(b)[1], [x.to("meta") for x in flatten(b)[0]])
        if "policy=cnn" not in over:
            meta[Col.OBS]["images"], meta[Col.NEXT_OBS]["images"] = {}, {}
        metrics = algo.update_on_device(meta, True)
        assert {"critic_loss", "actor_loss", "alpha"} <= set(metrics), over
        with pytest.raises((RuntimeError, NotImplementedError)):  # the check itself: a host read raises
            float(metrics["critic_loss"])


def test_refusals_and_fallbacks_are_named(caplog):
    with pytest.raises(ValueError, match="algo.update_graph=on: CUDA graphs need a CUDA device, and this learner runs on cpu"):
        agent("algo.update_graph=on")
    assert agent("algo.update_graph=auto").update_graphs is None  # auto: eager off a GPU
    assert agent().update_graphs is None  # off by default
    fast = agent(rerun=True)
    fast.grad_world = 2  # a data-parallel replica: the all-reduce sits inside the update
    with caplog.at_level(logging.WARNING, logger="rlinf_user.algorithms.update_graph"):
        for k in range(6):
            assert fast.update_graphs.run(batch(k), k % 2 == 0) is None  # eager: the learner's own update
    assert fast.update_graphs.captures == 0 and caplog.text.count("all-reduce their gradients") == 1
    cfg = compose_config(["algo=dsrl", "policy=flow"], sim="gym_hil")
    dsrl = build_algorithm(cfg.algo, cfg.policy, spec())
    assert "reads values back to the host" in UpdateGraphs(dsrl, backend="rerun").disabled


def test_flatten_round_trips_a_batch():
    b = batch(1, cameras=CAMERAS)
    leaves, layout = flatten(b)
    assert len(leaves) == 2 * 3 + 4 and hash(layout)
    back = unflatten(layout, leaves)
    assert back[Col.OBS]["images"]["wrist"] is b[Col.OBS]["images"]["wrist"] and back[Col.REWARD] is b[Col.REWARD]
