"""IQL's losses on fixed batches: the expectile value, the critics' targets, the
advantage-weighted actor, the offline warm start, checkpoints and its config checks."""

import pytest
import torch

from rlinf_user.algorithms.base import build_algorithm
from rlinf_user.config.compose import ConfigError, compose_config, validate
from rlinf_user.env.spec import Col, EnvSpec


def _iql(*overrides):
    cfg = compose_config(["algo=iql", "policy.hidden=[64,64]", "algo.drq_pad=0", *overrides], sim="reach")
    return build_algorithm(cfg.algo, cfg.policy, EnvSpec(5, {}, tuple(range(7))))


def _batch(n=128, reward=None, action=None, terminated=1.0):
    obs = {Col.STATE: torch.randn(n, 5), Col.IMAGES: {}}
    a = torch.rand(n, 7) * 2 - 1 if action is None else action
    return {
        Col.OBS: obs, Col.NEXT_OBS: {Col.STATE: torch.randn(n, 5), Col.IMAGES: {}}, Col.ACTION: a,
        Col.REWARD: a[:, 0].clone() if reward is None else reward, Col.TERMINATED: torch.full((n,), terminated),
    }  # fmt: skip


def test_the_value_is_an_upper_expectile_of_the_datas_q():
    """Terminal steps with reward = action[0] uniform in [-1, 1]: Q(s, a) learns a[0]; V, the
    0.9-expectile over the data's actions, sits well above the mean (0) and below the best (1)."""
    torch.manual_seed(0)
    agent = _iql("algo.expectile=0.9", "algo.critic_lr=1e-3", "algo.value_lr=1e-3")
    for _ in range(800):
        m = agent.update(_batch())
    with torch.no_grad():
        b = _batch(512)
        v = agent.value(agent.policy.encoder(b[Col.OBS])).mean().item()
        q = agent.critic(agent.policy.encoder(b[Col.OBS]), b[Col.ACTION]).mean(0)
    assert torch.corrcoef(torch.stack([q, b[Col.ACTION][:, 0]]))[0, 1] > 0.9
    assert 0.3 < v < 0.9, v
    assert m["weight_max"] > 1.0 and m["value_loss"] >= 0


def test_the_actor_takes_up_the_better_of_the_actions_it_saw():
    """Half the batch did action[0] = +0.5, half -0.5; reward = action[0]. The actor weights
    the actions it saw by their advantage: it goes to +0.5, not past it (no critic gradient)."""
    torch.manual_seed(0)
    agent = _iql("algo.critic_lr=1e-3", "algo.actor_lr=1e-3", "algo.value_lr=1e-3")
    for _ in range(600):
        a = torch.zeros(128, 7)
        a[:, 0] = 0.5 * torch.where(torch.arange(128) % 2 == 0, 1.0, -1.0)
        agent.update(_batch(action=a))
    out = agent.policy.act({Col.STATE: torch.randn(256, 5), Col.IMAGES: {}}, deterministic=True).actions[:, 0, 0]
    assert 0.3 < out.mean().item() < 0.65, out.mean()


def test_critics_bootstrap_from_the_value_of_the_next_state_with_the_buffers_discount():
    torch.manual_seed(0)
    agent = _iql("algo.critic_lr=1e-3", "algo.value_lr=1e-3", "algo.expectile=0.5")
    for _ in range(600):  # V(s') = 0 where the episode ends; a non-terminal step then adds discount x V
        b = _batch(reward=torch.ones(128), terminated=1.0)
        agent.update(b)
    b = _batch(reward=torch.zeros(128), terminated=0.0)
    b[Col.DISCOUNT] = torch.full((128,), 0.5)
    with torch.no_grad():
        target = b[Col.REWARD] + b[Col.DISCOUNT] * agent.value(agent.policy.encoder(b[Col.NEXT_OBS])).squeeze(-1)
    assert abs(target.mean().item() - 0.5) < 0.15  # V ~ 1 everywhere: the target is 0 + 0.5 x 1


def test_the_warm_start_is_offline_iql_and_checkpoints_restore_it():
    torch.manual_seed(0)
    agent = _iql()
    agent.warm_start(_batch() for _ in range(20))
    assert agent.offline_updates_done == 20 and agent.num_updates == 0  # online updates are metered from 0
    agent.update(_batch())
    clone = _iql()
    clone.load_checkpoint_state(agent.checkpoint_state())
    b = _batch(8)
    with torch.no_grad():
        f = agent.policy.encoder(b[Col.OBS])
        assert torch.equal(agent.value(f), clone.value(clone.policy.encoder(b[Col.OBS])))
        assert torch.equal(agent.target_critic(f, b[Col.ACTION]), clone.target_critic(f, b[Col.ACTION]))
    assert clone.num_updates == 1


def test_iql_checks_its_config_and_its_demonstrations():
    with pytest.raises(ConfigError, match="offline_updates"):
        validate(compose_config(["algo=iql"], sim="reach"))
    validate(compose_config(["algo=iql", "algo.offline_updates=0", "algo.demo_ratio=0"], sim="reach"))  # online only
    with pytest.raises(ConfigError, match="expectile"):
        validate(compose_config(["algo=iql", "demos=d", "algo.expectile=0.3"], sim="reach"))
    with pytest.raises(ConfigError, match="log-probability of the data's actions|needs a policy"):
        validate(compose_config(["algo=iql", "demos=d", "policy=flow"], sim="reach"))


def test_ddpg_bc_extraction_climbs_the_critics_past_the_data_and_awr_rules_the_warm_start():
    """The same data as above: extracted by the critics' action-gradient (bc_weight small),
    the actor goes past the best action it saw (+0.5); in the warm start (the offline phase)
    it is still AWR, which stays within the data's actions."""

    def batches(n):
        for _ in range(n):
            a = torch.zeros(128, 7)
            a[:, 0] = 0.5 * torch.where(torch.arange(128) % 2 == 0, 1.0, -1.0)
            yield _batch(action=a)

    def mean_action(agent):
        obs = {Col.STATE: torch.randn(256, 5), Col.IMAGES: {}}
        return agent.policy.act(obs, deterministic=True).actions[:, 0, 0].mean().item()

    lrs = ["algo.critic_lr=1e-3", "algo.actor_lr=1e-3", "algo.value_lr=1e-3", "algo.extraction=ddpg_bc"]
    torch.manual_seed(0)
    online = _iql(*lrs, "algo.bc_weight=0.05")
    for b in batches(600):
        online.update(b)
    assert mean_action(online) > 0.7
    torch.manual_seed(0)
    offline = _iql(*lrs, "algo.bc_weight=0.05")
    offline.warm_start(batches(600))
    assert 0.3 < mean_action(offline) < 0.65
    with pytest.raises(ConfigError, match="extraction"):
        validate(compose_config(["algo=iql", "demos=d", "algo.extraction=max"], sim="reach"))


@pytest.mark.parametrize(("rows", "low", "high"), [("demos", 0.35, 0.65), ("all", -0.2, 0.2)])
def test_ddpg_bc_regression_pulls_toward_the_rows_bc_rows_names(rows, low, high):
    """Every action is worth the same (reward 1, the episode ends): the critics give no
    direction, so the regression term alone places the actor. The demonstrated rows did
    action[0] = +0.5, the policy's own rows -0.5: with ``bc_rows=demos`` the actor takes the
    demonstrations' action, with ``all`` it sits between the two."""
    torch.manual_seed(0)
    agent = _iql("algo.critic_lr=1e-3", "algo.actor_lr=1e-3", "algo.value_lr=1e-3", "algo.extraction=ddpg_bc",
                 f"algo.bc_rows={rows}")  # fmt: skip
    demo = (torch.arange(128) % 2 == 0).float()
    for _ in range(600):
        a = torch.zeros(128, 7)
        a[:, 0] = torch.where(demo > 0, 0.5, -0.5)
        agent.update({**_batch(action=a, reward=torch.ones(128)), Col.FROM_DEMOS: demo})
    out = agent.policy.act({Col.STATE: torch.randn(256, 5), Col.IMAGES: {}}, deterministic=True).actions[:, 0, 0]
    assert low < out.mean().item() < high, out.mean()
    with pytest.raises(ConfigError, match="bc_rows"):
        validate(compose_config(["algo=iql", "demos=d", "algo.bc_rows=some"], sim="reach"))
    with pytest.raises(ConfigError, match="demo_ratio"):
        validate(compose_config(["algo=iql", "demos=d", "algo.bc_rows=demos", "algo.demo_ratio=0"], sim="reach"))


def test_ddpg_bc_extracts_by_awr_for_its_online_warmup_updates():
    """``ddpg_bc_warmup_updates``: the first online updates still weight the data's actions
    (the actor stays at the best action seen, +0.5), while the critics learn the policy's own
    actions; after them the critics' action-gradient takes it past the data."""
    torch.manual_seed(0)
    agent = _iql("algo.critic_lr=1e-3", "algo.actor_lr=1e-3", "algo.value_lr=1e-3", "algo.extraction=ddpg_bc",
                 "algo.bc_weight=0.05", "algo.ddpg_bc_warmup_updates=600")  # fmt: skip

    def step():
        a = torch.zeros(128, 7)
        a[:, 0] = 0.5 * torch.where(torch.arange(128) % 2 == 0, 1.0, -1.0)
        agent.update(_batch(action=a))

    def mean_action():
        obs = {Col.STATE: torch.randn(256, 5), Col.IMAGES: {}}
        return agent.policy.act(obs, deterministic=True).actions[:, 0, 0].mean().item()

    for _ in range(600):
        step()
    assert 0.3 < mean_action() < 0.65
    for _ in range(600):
        step()
    assert mean_action() > 0.7


@pytest.mark.parametrize("floor", [0.0, 0.3])
def test_the_exploration_floor_keeps_the_std_and_leaves_the_action_alone(floor):
    """Every row did the same action: the regression fits it exactly, so without a floor the
    std falls toward its minimum (exploration: none); with ``explore_std`` it settles at the
    floor while the deterministic action fits as well."""
    torch.manual_seed(0)
    agent = _iql("algo.actor_lr=3e-3", f"algo.explore_std={floor}")
    a = torch.full((128, 7), 0.4)
    for _ in range(400):
        agent.update(_batch(action=a, reward=torch.zeros(128)))
    obs = {Col.STATE: torch.randn(256, 5), Col.IMAGES: {}}
    with torch.no_grad():
        mean, log_std = agent.policy.actor(agent.policy.encoder(obs))
    assert torch.tanh(mean).sub(0.4).abs().median() < 0.05
    std = log_std.exp().median().item()
    assert (std < 0.1) if floor == 0 else (0.25 < std < 0.36), std
    with pytest.raises(ConfigError, match="explore_std"):
        validate(compose_config(["algo=iql", "algo.explore_std=-1", "demos=x"], sim="reach"))
