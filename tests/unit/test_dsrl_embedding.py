"""DSRL's noise actor reading the frozen base's own embedding (``algo.noise_encoder.encoder=base``):
one VLM pass per decision serves the embedding and the denoising, rows carry the embedding of
both their observations (the acting policy's for ``obs``, the store's for ``next_obs``: copied
from the same env's next row where it starts there, computed otherwise), and an update never
runs the VLM."""

import numpy as np
import pytest
import torch

from rlinf_user.algorithms.base import build_algorithm, data_plan
from rlinf_user.config.compose import ConfigError, compose_config, validate
from rlinf_user.env.registry import make_env
from rlinf_user.env.spec import Col, EnvSpec, columns_to_torch, flat_obs, obs_to_torch, stack_obs
from rlinf_user.policies.base import build_policy

pytest.importorskip("transformers")

EMB = f"{Col.OBS}/{Col.EMBEDDING}"
NEXT_EMB = f"{Col.NEXT_OBS}/{Col.EMBEDDING}"


@pytest.fixture(scope="module")
def pi0_reach(tmp_path_factory):
    """A tiny pi0 (chunks of 4) for reach, saved as a run's best.pt, and a DSRL config over it
    whose noise actor reads the base's embedding."""
    cfg = compose_config(["policy=pi0", "policy.horizon=4"], sim="reach")
    env = make_env(cfg.env, seed=0)
    spec = EnvSpec.of_env(env)
    torch.manual_seed(0)
    base = build_policy(cfg.policy, spec).eval()
    run = tmp_path_factory.mktemp("pi0_run")
    (run / "checkpoints").mkdir()
    torch.save({"policy": base.state_dict(), "spec": spec.to_dict(), "version": 1}, run / "checkpoints" / "best.pt")
    observations = [env.reset(seed=s)[0] for s in range(6)]
    env.close()
    dsrl = compose_config(["algo=dsrl", "policy=pi0", "policy.horizon=4", f"algo.base_checkpoint={run}",
                           "algo.noise_hidden=[32,32]", "algo.batch_size=8", "algo.noise_encoder.encoder=base"],
                          sim="reach")  # fmt: skip
    validate(dsrl)
    return spec, base, dsrl, observations


def test_one_vlm_pass_gives_the_embedding_and_the_actions(pi0_reach):
    spec, base, cfg, observations = pi0_reach
    steered = build_policy(cfg.policy, spec)
    assert steered.reads_embedding
    obs = obs_to_torch(stack_obs(observations[:4]))
    calls = []
    prefix = steered.base.model.prefix  # the VLM's pass, however the policy reaches it
    steered.base.model.prefix = lambda *a: calls.append(1) or prefix(*a)
    out = steered.act(obs)
    assert len(calls) == 1  # the embedding and the denoising shared one pass of the VLM
    torch.testing.assert_close(out.extras[EMB], base.embed(obs))
    assert out.extras[EMB].shape == (4, base.embedding_dim)
    noise = 1.5 * out.extras[Col.NOISE].view(4, 4, spec.action_dim)
    torch.testing.assert_close(out.actions, base.act_from_noise(obs, noise))
    # an observation that carries its embedding already is not embedded again
    calls.clear()
    steered.act({**obs, Col.EMBEDDING: out.extras[EMB]}, deterministic=True)
    assert len(calls) == 1  # the denoising's only
    assert data_plan(cfg.algo).extras == (Col.NOISE, EMB)  # every replay row keeps it


def test_rows_get_next_obs_embeddings_copied_from_successors_and_computed_elsewhere(pi0_reach):
    spec, base, cfg, observations = pi0_reach
    embedder = build_policy(cfg.policy, spec).row_embedder()
    obs = stack_obs(observations[:4])
    nxt = stack_obs([observations[1], observations[2], observations[4], observations[5]])
    # rows 0 and 1 end where rows 1 and 2 start (the same observation)
    cols = {**flat_obs(Col.OBS, obs), **flat_obs(Col.NEXT_OBS, nxt)}
    # rows 0-2: one env's decisions 0, 1, 2 (row 2 ends its episode); row 3: another env
    cols.update({Col.ENV_ID: np.array([0, 0, 0, 1]), Col.STEP: np.array([0, 1, 2, 0]),
                 Col.TERMINATED: np.array([0, 0, 1, 0], np.float32), Col.TRUNCATED: np.zeros(4, np.float32),
                 Col.REWARD: np.zeros(4, np.float32)})  # fmt: skip
    sent = base.embed(obs_to_torch(obs)).numpy()
    cols[EMB] = sent.copy()
    cols[EMB][1:3] += 100.0  # marks what was copied from rows 1 and 2 rather than computed
    out = embedder(cols)
    assert embedder.computed == 2  # rows 2 (its episode ended) and 3 (no successor here)
    np.testing.assert_array_equal(out[NEXT_EMB][:2], cols[EMB][1:3])
    truth = base.embed(obs_to_torch(nxt)).numpy()
    np.testing.assert_allclose(out[NEXT_EMB][2:], truth[2:], rtol=1e-4, atol=1e-4)
    assert out[EMB] is cols[EMB]  # the acting policy's own are kept
    # without the sent ones (a served policy, demonstrations), both are computed
    bare = {k: v for k, v in cols.items() if k != EMB}
    out = embedder(bare)
    np.testing.assert_allclose(out[EMB], sent, rtol=1e-4, atol=1e-4)


def test_an_update_reads_the_stored_embeddings_and_never_runs_the_vlm(pi0_reach):
    spec, _, cfg, observations = pi0_reach
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    p = algo.policy
    embedder = p.row_embedder()
    obs, nxt = stack_obs(observations[:4] * 2), stack_obs(observations[1:5] * 2)
    rng = np.random.default_rng(0)
    cols = embedder({**flat_obs(Col.OBS, obs), **flat_obs(Col.NEXT_OBS, nxt), Col.REWARD: np.ones(8, np.float32),
                     Col.TERMINATED: np.zeros(8, np.float32),
                     Col.NOISE: rng.uniform(-1, 1, (8, p.noise_dim)).astype(np.float32)})  # fmt: skip
    batch = columns_to_torch(cols)
    p.base.prefix = lambda o: pytest.fail("an update ran the base's VLM")
    before = {k: v.clone() for k, v in p.actor.state_dict().items()}
    algo.num_updates = 1  # past the first update's one-off noise-authority probe (it runs the base)
    for _ in range(2):
        metrics = algo.update(batch)
    assert np.isfinite(metrics["critic_loss"])
    assert any(not torch.equal(before[k], v) for k, v in p.actor.state_dict().items())


def test_a_base_without_an_embedding_is_refused_by_name(tmp_path):
    cfg = compose_config(["algo=dsrl", "policy=flow", f"algo.base_checkpoint={tmp_path}",
                          "algo.noise_encoder.encoder=base"], sim="reach")  # fmt: skip
    with pytest.raises(ConfigError, match="noise_encoder.encoder=base reads the base's own embedding"):
        validate(cfg)
