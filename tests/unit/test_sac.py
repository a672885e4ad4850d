import numpy as np
import pytest
import torch

from rlinf_user.algorithms.augment import random_shift
from rlinf_user.algorithms.base import build_algorithm
from rlinf_user.config.compose import compose_config
from rlinf_user.env.spec import EnvSpec
from rlinf_user.policies.layers import BatchRenorm, EnsembleLinear


def SAC(algo_cfg, policy_cfg, state_dim, cameras, action_dim):
    return build_algorithm(algo_cfg, policy_cfg, EnvSpec(state_dim, cameras, tuple(range(action_dim))))


def _batch(n=64, state_dim=5, reward=1.0, cameras=None):
    obs = {"state": torch.randn(n, state_dim), "images": {}}
    nxt = {"state": torch.randn(n, state_dim), "images": {}}
    for c, (h, w) in (cameras or {}).items():
        obs["images"][c] = torch.randint(0, 255, (n, h, w, 3), dtype=torch.uint8)
        nxt["images"][c] = torch.randint(0, 255, (n, h, w, 3), dtype=torch.uint8)
    return {
        "obs": obs,
        "next_obs": nxt,
        "action": torch.rand(n, 7) * 2 - 1,
        "reward": torch.full((n,), reward),
        "terminated": torch.ones(n),
    }


@pytest.mark.parametrize("algo", ["sac", "rlpd", "crossq"])
def test_critic_learns_terminal_reward(algo):
    """With terminal transitions Q must converge to the reward, for every variant."""
    torch.manual_seed(0)
    cfg = compose_config([f"algo={algo}", "algo.critic_lr=1e-3", "policy.hidden=[64,64]"])
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    # CrossQ's batch-renorm running statistics (momentum 0.01) need a few hundred steps
    for _ in range(700):
        agent.update(_batch(reward=2.0))
    agent.critic.eval()
    with torch.no_grad():
        b = _batch(256)
        q = agent.critic(agent.policy.encoder(b["obs"]), b["action"])
    assert q.shape == (cfg.algo.num_critics, 256)
    assert abs(q.mean().item() - 2.0) < 0.2


def test_actor_moves_toward_higher_q():
    """Reward = action[0]: after training the deterministic action's first dim goes up."""
    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[64,64]", "algo.init_temperature=0.01"])
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    for _ in range(400):
        b = _batch()
        b["reward"] = b["action"][:, 0].clone()
        agent.update(b)
    out = agent.policy.act({"state": torch.randn(128, 5), "images": {}}, deterministic=True)
    assert out.actions.shape == (128, 1, 7)  # a chunk of one step
    assert out.actions[:, 0, 0].mean().item() > 0.8


def test_temperature_tracks_target_entropy():
    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[32]", "algo.alpha_lr=1e-2"])
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    a0 = agent.alpha.item()
    for _ in range(100):
        agent.update(_batch(reward=0.0))
    # the initial policy is near-uniform (entropy far above -3.5): alpha must drop
    assert agent.alpha.item() < a0


def test_a_fixed_temperature_stays_while_the_actor_learns():
    """autotune_temperature=false (the pick's recipe): the same updates that move alpha
    above leave it at init_temperature, and the actor still trains."""
    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[32]", "algo.alpha_lr=1e-2", "algo.init_temperature=0.05",
                          "algo.autotune_temperature=false"])  # fmt: skip
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    before = [p.detach().clone() for p in agent.policy.parameters()]
    for _ in range(100):
        m = agent.update(_batch(reward=0.0))
    assert agent.alpha.item() == pytest.approx(0.05) and m["alpha"] == pytest.approx(0.05)
    assert any(not torch.equal(b, p) for b, p in zip(before, agent.policy.parameters()))
    # and it survives a checkpoint: the temperature is part of the state either way
    again = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    again.load_checkpoint_state(agent.checkpoint_state())
    assert again.alpha.item() == pytest.approx(0.05)


def test_checkpoint_round_trip_restores_everything():
    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[32]"])
    a = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    for _ in range(5):
        a.update(_batch())
    b = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    b.load_checkpoint_state(a.checkpoint_state())
    assert b.num_updates == 5
    sa, sb = a.checkpoint_state()["model"], b.checkpoint_state()["model"]
    assert sa.keys() == sb.keys() and any(k.startswith("target_critic.") for k in sa)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert b.critic_opt.state_dict()["state"].keys() == a.critic_opt.state_dict()["state"].keys()


def test_image_policy_updates_with_drq():
    torch.manual_seed(0)
    cfg = compose_config(["policy=cnn", "env.cameras=[wrist]", "policy.encoder_channels=[8,8]"])
    agent = SAC(cfg.algo, cfg.policy, 5, {"wrist": (32, 32)}, 7)
    before = [p.clone() for p in agent.policy.encoder.parameters()]
    m = agent.update(_batch(16, cameras={"wrist": (32, 32)}))
    assert np.isfinite(m["critic_loss"])
    assert any(not torch.equal(p, q) for p, q in zip(before, agent.policy.encoder.parameters()))


def test_separate_encoders_keep_the_actors_features_out_of_td_learning():
    """shared_encoder=false: critic updates train the critics' own encoder and leave the
    actor's untouched; the actor loss trains the actor's; sync_encoders copies it over."""
    torch.manual_seed(0)
    cams = {"wrist": (32, 32)}
    over = ["policy=cnn", "env.cameras=[wrist]", "policy.encoder_channels=[8,8]", "algo.critic_warmup_updates=3"]
    agent = SAC(compose_config([*over, "algo.shared_encoder=false"]).algo, compose_config(over).policy, 5, cams, 7)
    assert agent.critic_encoder is not agent.policy.encoder

    def snap(m):
        return [p.detach().clone() for p in m.parameters()]

    actor0, critic0 = snap(agent.policy.encoder), snap(agent.critic_encoder)
    for _ in range(3):  # critic warm-up: critic updates only
        agent.update(_batch(16, cameras=cams))
    assert all(torch.equal(a, b) for a, b in zip(actor0, agent.policy.encoder.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(critic0, agent.critic_encoder.parameters()))
    agent.update(_batch(16, cameras=cams))  # the first actor update moves the actor's encoder
    assert any(not torch.equal(a, b) for a, b in zip(actor0, agent.policy.encoder.parameters()))
    agent.sync_encoders()
    for a, c, t in zip(agent.policy.encoder.parameters(), agent.critic_encoder.parameters(),
                       agent.target_encoder.parameters()):  # fmt: skip
        assert torch.equal(a, c) and torch.equal(a, t)
    # the critics' encoder is part of the checkpoint and comes back
    other = SAC(compose_config([*over, "algo.shared_encoder=false"]).algo, compose_config(over).policy, 5, cams, 7)
    other.load_checkpoint_state(agent.checkpoint_state())
    for a, b in zip(agent.critic_encoder.parameters(), other.critic_encoder.parameters()):
        assert torch.equal(a, b)
    shared = SAC(compose_config(over).algo, compose_config(over).policy, 5, cams, 7)
    assert shared.critic_encoder is shared.policy.encoder
    assert not any(k.startswith("critic_encoder.") for k in shared.checkpoint_state()["model"])


def test_random_shift_keeps_shape_and_moves_pixels():
    torch.manual_seed(0)
    img = torch.zeros(8, 16, 16, 3, dtype=torch.uint8)
    img[:, 6:10, 6:10] = 255
    out = random_shift(img, 4)
    assert out.shape == img.shape and out.dtype == torch.uint8
    assert (out.float().sum(dim=(1, 2, 3)) > 0).all()
    assert any(not torch.equal(out[i], img[i]) for i in range(8))


@pytest.mark.parametrize("hw", [(16, 16), (12, 20), (20, 12)])
def test_random_shift_is_an_integer_translation_of_the_padded_frame(hw):
    """Each frame is its replicate-padded copy cropped at a random offset of up to pad
    pixels per axis, square or not (a 4:3 camera keeps its shape)."""
    h, w = hw
    img = torch.randint(0, 255, (16, h, w, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)
    out = random_shift(img, 3)
    torch.manual_seed(2)
    offset = torch.randint(0, 7, (16, 1, 1, 2))[:, 0, 0]  # the draw random_shift makes: (dx, dy) per frame
    padded = torch.nn.functional.pad(img.permute(0, 3, 1, 2).float(), (3, 3, 3, 3), mode="replicate")
    assert out.shape == img.shape
    for i, (dx, dy) in enumerate(offset.tolist()):
        assert torch.equal(out[i].permute(2, 0, 1).float(), padded[i, :, dy : dy + h, dx : dx + w])
    assert len({tuple(o) for o in offset.tolist()}) > 1


def test_an_update_shifts_only_the_frames_its_encoders_read(monkeypatch):
    """DrQ shifts the frames the actor's and critics' encoders read: a state-only encoder
    (or a frozen base's embedding, DSRL's encoder=base) reads none, so none is shifted;
    a CNN's camera is."""
    from rlinf_user.algorithms import augment

    shifted = []
    real = augment.random_shift
    monkeypatch.setattr(augment, "random_shift", lambda v, pad: shifted.append(v.shape) or real(v, pad))
    cams = {"top": (16, 16)}
    state_only = SAC(compose_config(["algo=sac", "policy.hidden=[32,32]"]).algo,
                     compose_config(["policy.encoder=mlp"]).policy, 5, cams, 7)  # fmt: skip
    assert state_only.augmented == ()
    state_only.update(_batch(cameras=cams))
    assert shifted == []
    cfg = compose_config(["algo=sac", "policy.encoder=cnn", "policy.encoder_channels=[8]", "policy.hidden=[32,32]"])
    cnn = SAC(cfg.algo, cfg.policy, 5, cams, 7)
    assert cnn.augmented == ("top",)
    cnn.update(_batch(cameras=cams))
    assert shifted and all(s[1:3] == (16, 16) for s in shifted)


def test_ensemble_linear_members_independent():
    layer = EnsembleLinear(3, 4, 2)
    x = torch.randn(5, 4)
    y = layer(x)
    for e in range(3):
        torch.testing.assert_close(y[e], x @ layer.weight[e] + layer.bias[e])


def test_batch_renorm_train_and_eval():
    bn = BatchRenorm(4, leading=(2,), warmup_steps=0)
    x = torch.randn(2, 64, 4) * 3 + 1
    y = bn(x)
    assert y.shape == x.shape
    bn.eval()
    assert torch.isfinite(bn(x)).all()


def test_bc_weight_holds_the_actor_on_demonstrated_actions():
    """An uninformative critic (reward 0) gives the actor nothing to follow; with bc_weight
    the demo rows of each batch pull its actions to the demonstrated ones."""
    from rlinf_user.config.compose import ConfigError, validate

    def train(bc_weight):
        torch.manual_seed(0)
        cfg = compose_config(["policy.hidden=[64,64]", "algo.demo_ratio=0.5", f"algo.bc_weight={bc_weight}",
                              "algo.init_temperature=0.01"])  # fmt: skip
        agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
        for _ in range(300):
            b = _batch(reward=0.0)
            b["action"][32:] = 0.6  # the demonstrator always pushes +0.6
            b["from_demos"] = (torch.arange(64) >= 32).float()
            m = agent.update(b)
        out = agent.policy.act({"state": torch.randn(256, 5), "images": {}}, deterministic=True)
        return out.actions[:, 0].mean(0), m

    with_bc, m = train(2.0)
    without, _ = train(0.0)
    assert "bc_loss" in m
    assert (with_bc - 0.6).abs().max() < 0.15 and (without - 0.6).abs().mean() > 0.3
    with pytest.raises(ConfigError, match="demo_ratio=0 draws none"):
        validate(compose_config(["algo.bc_weight=1.0"]))


def test_critic_warmup_holds_the_actor_and_backup_entropy_leaves_the_target():
    """critic_warmup_updates: the actor and temperature do not move while the critic
    warms up. backup_entropy=false: a sharp policy's log-probs stay out of the Q-target
    (a zero reward then gives Q ~ 0, not minus the entropy term)."""

    def run(extra, updates):
        torch.manual_seed(0)
        cfg = compose_config(["policy.hidden=[64,64]", "algo.critic_lr=1e-3", "algo.init_temperature=0.5", *extra])
        agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
        actor0 = [p.detach().clone() for n, p in agent.policy.named_parameters() if not n.startswith("encoder.")]
        for _ in range(updates):
            b = _batch(reward=0.0)
            b["terminated"] = torch.zeros(64)
            agent.update(b)
        moved = any(not torch.equal(a, p) for a, (n, p) in
                    zip(actor0, [(n, p) for n, p in agent.policy.named_parameters() if not n.startswith("encoder.")]))  # fmt: skip
        with torch.no_grad():
            b = _batch(256)
            q = agent.critic(agent.policy.encoder(b["obs"]), b["action"]).mean().item()
        return agent, moved, q

    agent, moved, _ = run(["algo.critic_warmup_updates=50"], 50)
    assert not moved and agent.alpha.item() == pytest.approx(0.5)
    _, moved, _ = run(["algo.critic_warmup_updates=50"], 51)
    assert moved
    # with the entropy backed up, Q drifts to -alpha * E[log pi] / (1 - gamma) territory
    _, _, q_soft = run(["algo.critic_warmup_updates=400", "algo.gamma=0.9"], 400)
    _, _, q_plain = run(["algo.critic_warmup_updates=400", "algo.gamma=0.9", "algo.backup_entropy=false"], 400)
    assert abs(q_plain) < 0.1 and abs(q_soft - q_plain) > 0.3


def test_td3bc_term_is_scale_free():
    """With bc_weight the Q term is divided by its mean magnitude (once above 1): the same
    critic scaled by 100 or by 1000 gives the same actor loss."""
    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[64,64]", "algo.demo_ratio=0.5", "algo.bc_weight=1.0", "algo.init_temperature=0.01"])
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    b = _batch()
    b["from_demos"] = (torch.arange(64) >= 32).float()
    last = [m for m in agent.critic.modules() if isinstance(m, EnsembleLinear)][-1]
    losses = []
    for scale in (100.0, 10.0):
        with torch.no_grad():
            last.weight.mul_(scale)
            last.bias.mul_(scale)
        torch.manual_seed(1)
        losses.append(agent._actor_loss(b)[0].item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_log_prob_of_given_actions_matches_the_sampled_log_prob():
    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[32,32]"])
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    feats = agent.policy.encoder({"state": torch.randn(16, 5), "images": {}})
    action, logp = agent.policy.sample_features(feats)
    assert torch.allclose(agent.policy.log_prob_features(feats, action.clamp(-0.999, 0.999)), logp, atol=1e-3)


def test_awac_moves_the_actor_to_the_batch_action_the_critic_ranks_higher():
    """Half the batch did action[0] = +0.5, half -0.5, from the same states; reward =
    action[0]. AWAC's actor must take up the +0.5 action: it weights the actions it saw by
    their advantage and never follows the critic's action-gradient (which would push
    action[0] past +0.5 towards +1)."""
    torch.manual_seed(0)
    cfg = compose_config(["algo=rlpd", "algo.actor_loss=awac", "algo.init_temperature=0.001", "policy.hidden=[64,64]",
                          "algo.critic_lr=1e-3", "algo.actor_lr=1e-3"])  # fmt: skip
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    for _ in range(600):
        b = _batch(128)
        sign = torch.where(torch.arange(128) % 2 == 0, 1.0, -1.0)
        b["action"] = torch.zeros(128, 7)
        b["action"][:, 0] = 0.5 * sign
        b["reward"] = b["action"][:, 0].clone()
        m = agent.update(b)
    assert m["awac_weight_max"] > 1.0 and m["advantage_std"] > 0
    out = agent.policy.act({"state": torch.randn(256, 5), "images": {}}, deterministic=True).actions[:, 0, 0]
    assert 0.35 < out.mean().item() < 0.65, out.mean()


def test_awac_keeps_a_confident_clone_on_its_demonstrations_under_a_critic_that_ranks_nothing():
    """A BC warm start leaves the std at its floor (std 0.007). The raw likelihood of a
    demonstrated action 0.2 off is then about -10^3 a row, and AWAC's first updates under a
    critic that has learned nothing yet (weights from noise) pulled the clone's deterministic
    action off its demonstrations; on the pick from pixels it fell from 100% to 0%. The
    weighted fit must leave it where the clone had it."""
    torch.manual_seed(0)
    cfg = compose_config(["algo=rlpd", "algo.actor_loss=awac", "algo.init_temperature=0.01", "policy.hidden=[64,64]",
                          "algo.critic_warmup_updates=0", "algo.bc_weight=1.0"])  # fmt: skip
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 4)
    w = torch.randn(5, 4)

    def demos(n):
        s = torch.randn(n, 5)
        a = torch.tanh(s @ w * 0.5) + 0.2 * torch.randn(n, 4)  # a person's spread around a rule
        a[:, 3] = torch.where(s[:, 0] > 0, 1.0, -1.0)  # a gripper: open or closed
        return s, a.clamp(-1, 1)

    agent.warm_start([{"obs": {"state": s, "images": {}}, "action": a} for s, a in (demos(256) for _ in range(600))])
    test_s, test_a = demos(512)

    def off_demos() -> float:
        out = agent.policy.act({"state": test_s, "images": {}}, deterministic=True).actions[:, 0]
        return (out[:, :3] - torch.tanh(test_s @ w * 0.5)[:, :3]).square().sum(-1).mean().item()

    cloned = off_demos()
    for _ in range(300):
        s, a = demos(64)
        own = {"state": torch.randn(64, 5), "images": {}}
        with torch.no_grad():
            own_a = agent.policy.act(own, deterministic=False).actions[:, 0]
        b = {"obs": {"state": torch.cat([s, own["state"]]), "images": {}},
             "next_obs": {"state": torch.randn(128, 5), "images": {}}, "action": torch.cat([a, own_a]),
             "reward": torch.zeros(128), "terminated": torch.zeros(128),
             "from_demos": torch.cat([torch.ones(64), torch.zeros(64)])}  # fmt: skip
        m = agent.update(b)
    assert "awac_weight_max" in m
    assert off_demos() < 2 * cloned + 0.02, (cloned, off_demos())


def test_a_likelihood_on_the_std_alone_reaches_only_the_std_head_and_fits_the_spread():
    """``std_head_only``: the std's likelihood term leaves every gradient the mean's squared
    error gives unchanged (the trunk's and the mean rows'), and the std, started at its floor
    as a BC warm start leaves it, rises to the spread of the actions plus the floor asked for."""
    from rlinf_user.policies.actor_critic import TanhGaussianActor

    torch.manual_seed(0)
    actor = TanhGaussianActor(5, 3, [32, 32])
    with torch.no_grad():
        actor.net[-1].bias[3:] = -4.0  # log-std at its floor (-5.0), as the BC warm start leaves it
    feats = torch.randn(256, 5)
    with torch.no_grad():
        target = torch.tanh(actor(feats)[0]) + 0.2 * torch.randn(256, 3)  # a spread of 0.2 around the mean

    def grads(**kw) -> dict[str, torch.Tensor]:
        actor.zero_grad()
        actor.fit_loss(feats, target, **kw).mean().backward()
        return {n: p.grad.clone() for n, p in actor.named_parameters()}

    alone, head, full = grads(min_std=None), grads(min_std=0.05, std_head_only=True), grads(min_std=0.05)
    last_w, last_b = f"net.{len(actor.net) - 1}.weight", f"net.{len(actor.net) - 1}.bias"
    for name in alone:
        if name in (last_w, last_b):
            assert torch.allclose(head[name][:3], alone[name][:3], atol=1e-6)  # the mean's rows
            assert head[name][3:].abs().sum() > 0  # the std's rows learn
        else:
            assert torch.allclose(head[name], alone[name], atol=1e-6), name  # the trunk: as the mean alone moves it
    trunk = [n for n in alone if n not in (last_w, last_b)]
    assert any(not torch.allclose(full[n], alone[n], atol=1e-6) for n in trunk)  # the full likelihood moves the trunk

    opt = torch.optim.Adam([actor.net[-1].bias], lr=0.05)
    for _ in range(400):
        opt.zero_grad()
        actor.fit_loss(feats, target, min_std=0.05, std_head_only=True).mean().backward()
        actor.net[-1].bias.grad[:3] = 0  # the std alone: its optimum for these residuals
        opt.step()
    with torch.no_grad():
        mean, log_std = actor(feats)
        want = ((target - torch.tanh(mean)).square().mean(0) + 0.05**2).sqrt()
    assert torch.allclose(log_std.exp().mean(0), want, rtol=0.15), (log_std.exp().mean(0), want)


def _awac_std_after_300_updates(min_std: str) -> float:
    """The std (pre-tanh, mean over states) of an AWAC actor after 300 updates on batches whose
    actions are 0.5 with a spread of 0.3 whatever the state, the critic given no reward."""
    torch.manual_seed(0)
    cfg = compose_config(["algo=rlpd", "algo.actor_loss=awac", "policy.hidden=[32]", "algo.critic_warmup_updates=0",
                          f"algo.awac_min_std={min_std}", "algo.autotune_temperature=false",
                          "algo.init_temperature=1e-4", "algo.batch_size=64"])  # fmt: skip
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 3)
    states = {"state": torch.randn(256, 5), "images": {}}
    for _ in range(300):
        b = _batch(n=64, reward=0.0)
        b["action"] = (0.5 + 0.3 * torch.randn(64, 3)).clamp(-1, 1)
        agent.update(b)
    with torch.no_grad():
        _, log_std = agent.policy.actor(agent.policy.encoder(states))
    return log_std.exp().mean().item()


def test_awac_min_std_fits_the_std_by_likelihood_and_is_checked():
    """Fitted, the std follows the actions' spread (about 0.3 / (1 - 0.5^2) = 0.4 before the
    tanh). Left to the entropy term, even at a temperature of 1e-4 it only grows: Adam takes
    full-size steps on a steady gradient however small (docs/results.md, pixels)."""
    from rlinf_user.config.compose import ConfigError, validate

    with pytest.raises(ConfigError, match="awac_min_std"):
        validate(compose_config(["algo=rlpd", "algo.actor_loss=awac", "algo.awac_min_std=-0.1"]))
    fitted, left = _awac_std_after_300_updates("0.1"), _awac_std_after_300_updates("null")
    assert 0.25 < fitted < 0.7, fitted
    assert left > 0.75, left


def test_awac_is_refused_for_a_flow_policy():
    from rlinf_user.config.compose import ConfigError, validate

    with pytest.raises(ConfigError, match="actor_loss=awac"):
        validate(compose_config(["algo=sac_flow", "policy=flow", "algo.actor_loss=awac"]))
    with pytest.raises(ConfigError, match="actor_loss=best"):
        validate(compose_config(["algo=sac", "algo.actor_loss=best"]))


def test_a_scheduled_temperature_moves_geometrically_to_its_final_value_after_the_warm_up():
    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[32]", "algo.init_temperature=0.04", "algo.autotune_temperature=false",
                          "algo.final_temperature=0.01", "algo.temperature_decay_updates=20",
                          "algo.critic_warmup_updates=10", "algo.batch_size=16"])  # fmt: skip
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    seen = [agent.update(_batch(n=16, reward=0.0)).get("alpha") for _ in range(40)]
    assert seen[:10] == [None] * 10  # the critic's warm-up: no actor update, the temperature as it started
    assert seen[19] == pytest.approx(0.02, rel=1e-4)  # half way (10 of 20 updates): the geometric mean
    assert seen[29] == pytest.approx(0.01, rel=1e-4) and seen[39] == pytest.approx(0.01, rel=1e-4)
    assert all(a >= b for a, b in zip(seen[10:], seen[11:]))
    # a resumed learner goes on from its update count
    again = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    again.load_checkpoint_state(agent.checkpoint_state())
    assert again.alpha.item() == pytest.approx(0.01, rel=1e-4)


def test_a_scheduled_actor_learning_rate_falls_geometrically_after_the_warm_up():
    """algo.final_actor_lr: the actor's Adam steps shrink from actor_lr to it over
    actor_lr_decay_updates updates after the critic's warm-up; the critic's rate stays."""
    from rlinf_user.algorithms.sac import SAC as SACClass

    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[32]", "algo.actor_lr=4e-4", "algo.final_actor_lr=1e-4",
                          "algo.actor_lr_decay_updates=20", "algo.critic_warmup_updates=10", "algo.batch_size=16"])  # fmt: skip
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    lrs = []
    for _ in range(40):
        agent.update(_batch(n=16, reward=0.0))
        lrs.append(agent.actor_opt.param_groups[0]["lr"])
    assert lrs[:10] == [4e-4] * 10  # the warm-up: no actor update, the rate as configured
    assert lrs[19] == pytest.approx(2e-4, rel=1e-6)  # half way: the geometric mean
    assert lrs[29] == pytest.approx(1e-4, rel=1e-6) and lrs[39] == pytest.approx(1e-4, rel=1e-6)
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert agent.critic_opt.param_groups[0]["lr"] == cfg.algo.critic_lr
    # a resumed learner goes on from its update count
    again = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    again.load_checkpoint_state(agent.checkpoint_state())
    again.update(_batch(n=16, reward=0.0))
    assert again.actor_opt.param_groups[0]["lr"] == pytest.approx(1e-4, rel=1e-6)
    cfg = compose_config(["algo.final_actor_lr=1e-4"])
    assert any("actor_lr_decay_updates > 0" in p for p in SACClass.problems(cfg.algo, cfg.policy))


def test_a_temperature_schedule_is_refused_where_it_cannot_hold():
    from rlinf_user.algorithms.sac import SAC as SACClass

    cfg = compose_config(["algo.final_temperature=0.01", "algo.temperature_decay_updates=100"])
    assert any("autotune_temperature=false" in p for p in SACClass.problems(cfg.algo, cfg.policy))
    cfg = compose_config(["algo.final_temperature=0.01", "algo.autotune_temperature=false"])
    assert any("temperature_decay_updates > 0" in p for p in SACClass.problems(cfg.algo, cfg.policy))


def test_policy_ema_publishes_a_moving_average_of_the_actor():
    """algo.policy_ema: the acting policy follows the actor at the given rate after each actor
    update (the average starts from the warm-started actor); checkpoints keep it, eval reads it,
    and one saved without it starts from the actor."""
    from rlinf_user.policies.base import policy_state_of

    torch.manual_seed(0)
    cfg = compose_config(["policy.hidden=[32]", "algo.policy_ema=0.9", "algo.batch_size=16"])
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    agent.policy_avg.load_state_dict({k: torch.zeros_like(v) for k, v in agent.policy_avg.state_dict().items()})
    agent.after_warm_start()  # the average starts where the (cloned) actor is
    first = {k: v.clone() for k, v in agent.policy.state_dict().items()}
    assert all(torch.equal(v, first[k]) for k, v in agent.policy_state().items())
    # the weight publisher sends the parameters that require grad with every version (and the
    # others once): the average's must be the actor's, or the workers would keep the first
    trains = {n for n, p in agent.policy.named_parameters() if p.requires_grad}
    assert trains and {n for n, p in agent.acting_policy.named_parameters() if p.requires_grad} == trains
    agent.update(_batch(n=16))
    actor, avg = agent.policy.state_dict(), agent.policy_state()
    moved = [k for k in actor if not torch.equal(actor[k], first[k])]
    assert moved  # the actor learned ...
    for k in moved:  # ... and the published weights went a tenth of the way
        assert torch.allclose(avg[k], 0.9 * first[k] + 0.1 * actor[k], atol=1e-6)
    state = agent.checkpoint_state()
    assert torch.equal(policy_state_of({"agent": state})[moved[0]], avg[moved[0]])
    again = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    again.load_checkpoint_state(state)
    assert all(torch.equal(v, avg[k]) for k, v in again.policy_state().items())
    old = {**state, "model": {k: v for k, v in state["model"].items() if not k.startswith("policy_avg.")}}
    again.load_checkpoint_state(old)
    assert all(torch.equal(v, actor[k]) for k, v in again.policy_state().items())
    plain = SAC(compose_config(["policy.hidden=[32]"]).algo, cfg.policy, 5, {}, 7)
    assert plain.acting_policy is plain.policy
    with pytest.raises(ValueError, match="policy_ema=1.0"):
        SAC(compose_config(["algo.policy_ema=1.0"]).algo, cfg.policy, 5, {}, 7)


def test_check_finite_finds_a_non_finite_weight_and_not_a_large_finite_one():
    """The learner checks the metrics after every update and the weights when they leave it:
    a NaN weight is named; weights so large their fused norm overflows are still finite."""
    from rlinf_user.algorithms.base import NonFiniteLoss

    cfg = compose_config(["algo=rlpd", "policy.hidden=[16,16]"])
    agent = SAC(cfg.algo, cfg.policy, 5, {}, 7)
    agent.check_finite({"critic_loss": 1.0})
    with pytest.raises(NonFiniteLoss, match="critic_loss"):
        agent.check_finite({"critic_loss": float("nan")}, weights=False)
    name, param = next(iter(agent.policy.named_parameters()))
    with torch.no_grad():
        param.fill_(1e30)  # finite, its norm's square overflows float32
    assert not agent.weights_finite()
    agent.check_finite({})  # the exact pass finds nothing
    with torch.no_grad():
        param[0].fill_(float("nan"))
    agent.check_finite({}, weights=False)  # metrics only
    with pytest.raises(NonFiniteLoss, match=name.split(".")[-1]):
        agent.check_finite({})


def test_the_profile_times_the_steady_update_not_the_critic_warm_up():
    """The pick's recipe updates only its critics for its first 2,000 updates; its data plan
    names the overrides that skip that, so the planner's profile times the updates of the
    rest of the run (the actor's included)."""
    from omegaconf import OmegaConf

    from rlinf_user.algorithms.base import algorithm_class
    from rlinf_user.runtime.planning.profile_learner import steady_state

    torch.manual_seed(0)
    cfg = compose_config(["algo=rlpd"], sim="gym_hil_random")
    assert cfg.algo.critic_warmup_updates > 0
    opening = SAC(cfg.algo, cfg.policy, 5, {}, 7).update(_batch())
    plan = algorithm_class(cfg.algo).data_plan(cfg.algo)
    steady_cfg = OmegaConf.merge(cfg, steady_state(plan))
    steady = SAC(steady_cfg.algo, steady_cfg.policy, 5, {}, 7).update(_batch())
    assert "actor_loss" not in opening and "actor_loss" in steady
    reach = compose_config([], sim="reach")  # no warm-up: the config as it is
    assert steady_state(algorithm_class(reach.algo).data_plan(reach.algo)) == {}


def test_feature_noise_perturbs_each_cameras_maps_by_its_spread_and_nothing_else():
    from rlinf_user.algorithms.augment import feature_noise

    torch.manual_seed(0)
    obs = {"state": torch.randn(64, 5), "features": {"front": (3.0 * torch.randn(64, 320, 4, 4)).half(),
                                                     "wrist": (0.1 * torch.randn(64, 320, 4, 4)).half()}}  # fmt: skip
    assert feature_noise(obs, 0.0) is obs and feature_noise({"state": obs["state"]}, 0.3)["state"] is obs["state"]
    out = feature_noise(obs, 0.3)
    assert out["state"] is obs["state"]
    for cam, spread in (("front", 3.0), ("wrist", 0.1)):  # each camera scaled by its own features' std
        assert out["features"][cam].dtype == torch.float16 and out["features"][cam].shape == (64, 320, 4, 4)
        added = (out["features"][cam].float() - obs["features"][cam].float()).std().item()
        assert abs(added - 0.3 * spread) < 0.03 * spread, (cam, added)


def test_the_warm_start_clones_through_noisy_feature_maps_when_asked(monkeypatch):
    """``algo.bc_feature_noise``: each BC step of the warm start sees the frozen encoder's maps
    with noise of that many stds added (the state and the targets as they are); 0 leaves
    the batch as it came. A negative scale is refused."""
    from rlinf_user.algorithms.bc import BC
    from rlinf_user.config.compose import ConfigError, validate

    spec = EnvSpec(state_dim=18, cameras={"front": (128, 128), "wrist": (128, 128)}, active_dims=(0, 1, 2, 6))
    feats = {c: torch.randn(32, 320, 4, 4).half() for c in ("front", "wrist")}
    batch = {"obs": {"state": torch.randn(32, 18), "features": feats}, "action": torch.rand(32, 4) * 2 - 1}
    real = BC.step
    for scale in (0.0, 0.5):
        cfg = compose_config(["algo=rlpd", f"algo.bc_feature_noise={scale}"], sim="gym_hil_pixels")
        algo = build_algorithm(cfg.algo, cfg.policy, spec)
        seen: list = []

        def step(self, obs, target, seen=seen):
            seen.append((obs, target))
            return real(self, obs, target)

        monkeypatch.setattr(BC, "step", step)
        loss = algo.warm_start(iter([batch, batch]))
        assert len(seen) == 2 and np.isfinite(loss)
        for obs, target in seen:
            assert obs["state"] is batch["obs"]["state"] and target is batch["action"]
            for c in feats:
                added = (obs["features"][c].float() - feats[c].float()).std().item()
                assert (added == 0.0) if scale == 0 else abs(added - scale * feats[c].float().std().item()) < 0.05
    with pytest.raises(ConfigError, match="bc_feature_noise"):
        validate(compose_config(["algo=rlpd", "algo.bc_feature_noise=-0.1", "demos=x"], sim="gym_hil_pixels"))
