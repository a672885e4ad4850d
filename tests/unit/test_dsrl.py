"""DSRL (``algo=dsrl``): SAC over the input noise of a frozen flow policy. The base's weights
never change, are never part of what is published or saved, and the noise stays in the
range the flow was trained on; the config refuses what DSRL cannot learn from."""

import numpy as np
import pytest
import torch

from rlinf_user.algorithms.base import build_algorithm, data_plan
from rlinf_user.config.compose import ConfigError, compose_config, validate
from rlinf_user.env.registry import make_env
from rlinf_user.env.spec import Col, EnvSpec, obs_to_torch, stack_obs
from rlinf_user.policies.base import build_policy


@pytest.fixture(scope="module")
def reach(tmp_path_factory):
    """A flow policy for reach, saved as a run's best.pt (its spec inside)."""
    cfg = compose_config(["policy=flow", "policy.hidden=[32,32]"], sim="reach")
    env = make_env(cfg.env, seed=0)
    spec = EnvSpec.of_env(env)
    torch.manual_seed(0)
    base = build_policy(cfg.policy, spec)
    run = tmp_path_factory.mktemp("base_run")
    (run / "checkpoints").mkdir()
    torch.save({"policy": base.state_dict(), "spec": spec.to_dict(), "version": 7}, run / "checkpoints" / "best.pt")
    obs = obs_to_torch(stack_obs([env.reset(seed=s)[0] for s in range(4)]))
    env.close()
    return spec, base, run, obs


def dsrl_cfg(run, *extra):
    return compose_config(["algo=dsrl", "policy=flow", "policy.hidden=[32,32]", f"algo.base_checkpoint={run}",
                           "algo.batch_size=16", "algo.noise_hidden=[32,32]", *extra], sim="reach")  # fmt: skip


def test_the_steered_policy_acts_through_the_frozen_base_from_noise_in_range(reach):
    spec, base, run, obs = reach
    cfg = dsrl_cfg(run)
    validate(cfg)
    assert cfg.policy.name == "steered" and cfg.policy.base.name == "flow"  # algo=dsrl wrapped policy=flow
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    p = algo.policy
    assert p.noise_shape == (1, spec.action_dim) and p.horizon == 1
    for k, v in base.state_dict().items():  # the base came from the run's best.pt
        torch.testing.assert_close(p.base.state_dict()[k], v)
    out = p.act(obs)
    u = out.extras[Col.NOISE]
    assert u.shape == (4, 3) and u.abs().max() <= 1.0
    # the actions are the base's deterministic flow from noise_max x u, nothing else
    expected = base.act_from_noise(obs, (1.5 * u).view(4, 1, 3))
    torch.testing.assert_close(out.actions, expected)
    # zero noise is the base's own deterministic action
    torch.testing.assert_close(base.act_from_noise(obs, torch.zeros(4, 1, 3)), base.act(obs, deterministic=True).actions)
    assert data_plan(cfg.algo).extras == (Col.NOISE,) and data_plan(cfg.algo).learning_starts == 0
    assert data_plan(cfg.algo).chunk_rows  # a chunk's noise is chosen once: a chunk is one row


def test_a_chunk_rows_target_discounts_its_steps_and_bootstraps_after_those_that_ran(reach):
    spec, _, run, _ = reach
    algo = build_algorithm(dsrl_cfg(run, "algo.gamma=0.9").algo, dsrl_cfg(run).policy, spec)
    batch = {Col.STEP_REWARDS: torch.tensor([[1.0, 2.0, 4.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
             Col.CHUNK_STEPS: torch.tensor([3, 1, 3]), Col.TERMINATED: torch.tensor([0.0, 1.0, 0.0]),
             Col.REWARD: torch.tensor([7.0, 1.0, 1.0])}  # fmt: skip
    reward, discount = algo._returns(batch)
    torch.testing.assert_close(reward, torch.tensor([1 + 0.9 * 2 + 0.81 * 4, 1.0, 0.81]))
    torch.testing.assert_close(discount, torch.tensor([0.729, 0.0, 0.729]))
    # one-step rows (no chunk columns) keep gamma and the reward as they are
    reward, discount = algo._returns({Col.REWARD: torch.tensor([2.0]), Col.TERMINATED: torch.tensor([0.0])})
    torch.testing.assert_close((reward, discount), (torch.tensor([2.0]), torch.tensor([0.9])))


def test_updates_train_the_noise_actor_and_critics_only(reach):
    spec, _, run, obs = reach
    cfg = dsrl_cfg(run)
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    p = algo.policy
    assert not [k for k in p.state_dict() if k.startswith("base")]  # never published, never saved
    assert {id(q) for q in p.parameters()}.isdisjoint({id(q) for q in p.base.parameters()})
    base_before = {k: v.clone() for k, v in p.base.state_dict().items()}
    actor_before = {k: v.clone() for k, v in p.actor.state_dict().items()}
    b = 16
    rng = np.random.default_rng(0)
    batch = {Col.OBS: {Col.STATE: torch.randn(b, spec.state_dim)}, Col.NEXT_OBS: {Col.STATE: torch.randn(b, spec.state_dim)},
             Col.REWARD: torch.randn(b), Col.TERMINATED: torch.zeros(b),
             Col.NOISE: torch.as_tensor(rng.uniform(-1, 1, (b, 3)), dtype=torch.float32)}  # fmt: skip
    for _ in range(3):
        metrics = algo.update(batch)
    assert np.isfinite(metrics["critic_loss"]) and "actor_loss" in metrics
    assert all(torch.equal(base_before[k], v) for k, v in p.base.state_dict().items())
    assert any(not torch.equal(actor_before[k], v) for k, v in p.actor.state_dict().items())
    feats = p.encoder(obs)
    assert algo.critic(feats, torch.zeros(4, 3)).shape == (2, 4)  # the critics score (features, noise)
    with pytest.raises(RuntimeError):
        algo.critic(feats, torch.zeros(4, spec.action_dim + 1))
    # a checkpoint holds the actor and critics; loading it into a fresh one restores the acts
    state = algo.checkpoint_state()
    assert not [k for k in state["model"] if ".base." in k]
    again = build_algorithm(cfg.algo, cfg.policy, spec)
    again.load_checkpoint_state(state)
    torch.testing.assert_close(again.policy.act(obs, deterministic=True).actions, p.act(obs, deterministic=True).actions)


def test_what_dsrl_cannot_learn_from_is_refused_by_name(reach):
    spec, _, run, _ = reach
    for extra, said in [
        (["algo.learning_starts=100"], "algo.learning_starts=100: DSRL explores with its own noise"),
        (["algo.demo_ratio=0.5"], "demonstrations train the base policy"),
        (["intervention.enabled=true"], "learns a person's corrections through an action critic"),
        (["algo.action_critic=true", "algo.bc_weight=1"], "a behaviour-cloning term has no noise"),
    ]:
        with pytest.raises(ConfigError, match=said):
            validate(dsrl_cfg(run, *extra))
    with pytest.raises(ConfigError, match="steers a flow policy through its noise: set policy= to one of flow"):
        validate(compose_config(["algo=dsrl", "policy=mlp", f"algo.base_checkpoint={run}"], sim="reach"))
    with pytest.raises(ConfigError, match="set algo.base_checkpoint"):
        validate(compose_config(["algo=dsrl", "policy=flow"], sim="reach"))
    with pytest.raises(ConfigError, match=r"algo.n_step=3 with chunks of policy.horizon=4"):
        validate(compose_config(["algo=dsrl", "policy=lite_vla", "policy.horizon=4", "algo.n_step=3",
                                 f"algo.base_checkpoint={run}"], sim="reach_color"))  # fmt: skip
    # with the action critic, demonstrations and corrections are taken
    validate(dsrl_cfg(run, "algo.action_critic=true", "algo.demo_ratio=0.5", "intervention.enabled=true"))
    with pytest.raises(ConfigError, match="action_critic=true with chunks of policy.horizon=4"):
        validate(compose_config(["algo=dsrl", "policy=lite_vla", "policy.horizon=4", "algo.action_critic=true",
                                 f"algo.base_checkpoint={run}"], sim="reach_color"))  # fmt: skip
    with pytest.raises(ConfigError, match="a served policy \\(openpi_remote\\) cannot"):
        validate(compose_config(["algo=dsrl", "policy=openpi_remote", "policy.noise_shape=[1,3]", "policy.horizon=1",
                                 "algo.action_critic=true"], sim="reach"))  # fmt: skip
    other = EnvSpec(state_dim=spec.state_dim + 1)  # a checkpoint for another env is refused naming both
    with pytest.raises(ValueError, match="was trained for"):
        build_policy(dsrl_cfg(run).policy, other)


def test_a_chunk_policy_is_steered_a_chunk_at_a_time(reach, tmp_path):
    """A tiny pi0 acting in chunks of 4: one noise per chunk over the env's action dims
    (4 x 3, not the model's padded 4 x 32: the padded dims start from zero, as the
    deterministic flow's do), and DSRL's refusal of n-step returns over chunks."""
    pytest.importorskip("transformers")
    spec, _, _, obs = reach
    cfg = compose_config(["policy=pi0", "policy.horizon=4"], sim="reach")
    torch.manual_seed(0)
    base = build_policy(cfg.policy, spec)
    (tmp_path / "checkpoints").mkdir()
    torch.save({"policy": base.state_dict(), "spec": spec.to_dict(), "version": 1}, tmp_path / "checkpoints" / "best.pt")
    cfg = compose_config(["algo=dsrl", "policy=pi0", "policy.horizon=4", f"algo.base_checkpoint={tmp_path}",
                          "algo.noise_hidden=[32,32]"], sim="reach")  # fmt: skip
    validate(cfg)
    steered = build_policy(cfg.policy, spec)
    a = spec.action_dim
    assert steered.noise_shape == (4, a) and steered.horizon == 4
    out = steered.act(obs)
    assert out.actions.shape == (4, 4, a) and out.extras[Col.NOISE].shape == (4, 4 * a)
    noise = 1.5 * out.extras[Col.NOISE].view(4, 4, a)
    torch.testing.assert_close(out.actions, base.act_from_noise(obs, noise))
    padded = torch.cat([noise, torch.zeros(4, 4, 32 - a)], -1)  # the same flow at the model's width
    torch.testing.assert_close(out.actions, base.act_from_noise(obs, padded))
    zero = base.act_from_noise(obs, torch.zeros(4, 4, a))
    torch.testing.assert_close(zero, base.act(obs, deterministic=True).actions)  # zero noise: the clone


def test_the_action_critic_learns_from_rows_without_noise_and_steers_the_actor_to_them(reach):
    """DSRL-NA: rows that carry only an executed action (a demonstration, a correction)
    teach the action critic; the noise critic distilled from it leads the actor to the noise
    whose executed action scores best. Here every row ends its episode with a reward that
    peaks at one action a*: the steered policy must move from the base's action towards it."""
    spec, base, run, obs = reach
    cfg = dsrl_cfg(run, "algo.action_critic=true", "algo.demo_ratio=0.5", "algo.batch_size=64")
    assert data_plan(cfg.algo).demo_ratio == 0.5
    torch.manual_seed(0)
    algo = build_algorithm(cfg.algo, cfg.policy, spec)
    p = algo.policy
    state = obs[Col.STATE][:1].repeat(64, 1)
    start = p.act({Col.STATE: state[:1]}, deterministic=True).actions[0, 0]
    goal = torch.clamp(start + torch.tensor([0.6, -0.6, 0.4])[: spec.action_dim], -0.9, 0.9)
    base_before = {k: v.clone() for k, v in p.base.state_dict().items()}
    for _ in range(400):
        a = torch.rand(64, spec.action_dim) * 2 - 1
        batch = {Col.OBS: {Col.STATE: state}, Col.NEXT_OBS: {Col.STATE: state}, Col.ACTION: a,
                 Col.REWARD: 1.0 - (a - goal).square().sum(-1), Col.TERMINATED: torch.ones(64),
                 Col.FROM_DEMOS: torch.arange(64) >= 32}  # fmt: skip
        metrics = algo.update(batch)
    assert {"distill_loss", "q_noise_mean"} <= set(metrics) and np.isfinite(metrics["critic_loss"])
    after = p.act({Col.STATE: state[:1]}, deterministic=True).actions[0, 0]
    assert (after - goal).norm() < 0.5 * (start - goal).norm(), (start, after, goal)
    assert all(torch.equal(base_before[k], v) for k, v in p.base.state_dict().items())  # the base never trains
    # the action critic and its target travel in the checkpoint, the base does not
    saved = algo.checkpoint_state()
    assert any(k.startswith("action_critic.") for k in saved["model"]) and not [k for k in saved["model"] if ".base." in k]
    again = build_algorithm(cfg.algo, cfg.policy, spec)
    again.load_checkpoint_state(saved)
    torch.testing.assert_close(again.policy.act({Col.STATE: state[:1]}, deterministic=True).actions, after[None, None])


def test_the_base_noise_authority_names_dims_that_steering_cannot_move(reach, caplog):
    """At its first update the learner measures how far the base's action moves with its
    noise, per action dim, and warns about a dim that does not move (a base whose output
    there ignores the noise, as a clone of deterministic demonstrations does)."""
    spec, base, run, obs = reach
    algo = build_algorithm(dsrl_cfg(run).algo, dsrl_cfg(run).policy, spec)
    moves = algo.noise_authority(obs)
    assert set(moves) == {"noise_authority/dx", "noise_authority/dy", "noise_authority/dz"}
    assert all(v > 0.01 for v in moves.values()), moves  # an untrained flow: every dim follows the noise
    # a base that ignores its noise for dz (its dz the same from every noise)
    flow = algo.policy.base.act_from_noise

    def deaf_in_dz(o, noise):
        a = flow(o, noise).clone()
        a[..., 2] = flow(o, torch.zeros_like(noise))[..., 2]
        return a

    algo.policy.base.act_from_noise = deaf_in_dz
    with caplog.at_level("WARNING"):
        moves = algo.noise_authority(obs)
    assert moves["noise_authority/dz"] < 1e-6 and moves["noise_authority/dx"] > 0.01, moves
    assert "does not move with its noise in dz " in caplog.text


def test_the_noise_actors_encoder_is_configured_under_algo(reach):
    """algo.noise_encoder.*: the steered policy's own encoder (the base's is frozen with it)."""
    from rlinf_user.algorithms.base import algorithm_class

    _, _, run, _ = reach
    cfg = compose_config(["algo=dsrl", "policy=lite_vla", "policy.horizon=4", f"algo.base_checkpoint={run}",
                          "algo.noise_encoder.encoder_channels=[16,16]", "algo.noise_encoder.image_feature_dim=8"],
                         sim="reach_color")  # fmt: skip
    algorithm_class(cfg.algo).configure(cfg)
    assert cfg.policy.name == "steered" and cfg.policy.base.name == "lite_vla"
    assert list(cfg.policy.encoder_channels) == [16, 16] and cfg.policy.image_feature_dim == 8
