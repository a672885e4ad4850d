import logging

import pytest

from rlinf_user.config.compose import ConfigError, compose_config, validate
from rlinf_user.runtime.orchestration.placement import make_plan


def test_defaults_are_sim_training_on_this_machine():
    cfg = compose_config([])
    validate(cfg)
    assert (cfg.env.kind, cfg.env.backend, cfg.env.task) == ("sim", "gym_hil", "PandaPickCube")
    assert cfg.algo.name == "sac" and cfg.placement.mode == "collocated"


def test_group_and_key_overrides():
    cfg = compose_config(["algo=rlpd", "env.task=PushCube-v1", "seed=3"], sim="maniskill")
    assert cfg.algo.name == "rlpd" and cfg.algo.num_critics == 10 and cfg.algo.critic_layer_norm
    assert cfg.env.task == "PushCube-v1" and cfg.seed == 3
    assert cfg.algo.gamma == 0.8  # the sim preset's tuned value survives the algo group


@pytest.mark.parametrize("sim", ["maniskill", "gym_hil", "robosuite"])
def test_every_sim_group_composes(sim):
    cfg = compose_config([], sim=sim)
    assert cfg.env.backend == sim and cfg.env.kind == "sim"


def test_robot_requires_edge_host_and_names_the_key():
    cfg = compose_config([], robot="franka")
    assert cfg.env.kind == "robot"
    assert dict(cfg.placement.env_worker.resources) == {"franka": 1}
    with pytest.raises(ConfigError, match=r"env\.edge\.host"):
        validate(cfg)
    cfg = compose_config(["env.edge.host=172.16.0.2"], robot="franka")
    validate(cfg)
    with pytest.raises(ConfigError, match="algo.paced=true.*a robot"):  # a robot cannot wait for the learner
        validate(compose_config(["env.edge.host=172.16.0.2", "algo.paced=true"], robot="franka"))
    validate(compose_config(["algo.paced=true"], sim="reach"))


def test_unknown_names_fail_clearly():
    with pytest.raises(ConfigError, match="unknown simulator"):
        compose_config([], sim="isaac")
    with pytest.raises(ConfigError, match="unknown robot"):
        compose_config([], robot="ur5")
    with pytest.raises(ConfigError, match="algo.gama"):
        compose_config(["algo.gama=0.9"])
    with pytest.raises(ConfigError, match="unknown algorithm.*algo/dreamer"):
        compose_config(["algo=dreamer"])


def test_each_algorithm_has_its_own_typed_config():
    """algo=<name> brings that algorithm's dataclass: its keys type-checked, another
    algorithm's keys refused, the env's tuning applied to its family only."""
    ppo = compose_config(["algo=ppo", "policy=gaussian_ac", "algo.clip_coef=0.3"])
    assert ppo.algo.clip_coef == 0.3 and "tau" not in ppo.algo
    with pytest.raises(ConfigError, match="num_critics"):
        compose_config(["algo=ppo", "algo.num_critics=4"])
    with pytest.raises(ConfigError, match="clip_coef"):
        compose_config(["algo=ppo", "algo.clip_coef=wide"])
    sac = compose_config([])  # gym_hil tunes the SAC family: tau 0.01, learning_starts 2000
    assert sac.algo.tau == 0.01 and sac.algo.learning_starts == 2000
    assert compose_config(["algo.learning_starts=5"]).algo.learning_starts == 5  # the command line wins
    assert compose_config(["algo=rlpd"]).algo.num_critics == 10
    assert compose_config([], robot="franka").algo.utd_ratio == 4.0


def test_grpo_warns_when_hovering_out_scores_the_success_bonus(caplog):
    """The horizon that hovering is scored over: 1/(1-gamma) steps for the per-step
    baseline, the whole episode (50 steps on PushCube) for episode scoring."""

    def warning(*extra):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlinf_user.config.compose"):
            validate(compose_config(["algo=grpo", "policy=gaussian_ac", "placement.envs_per_worker=4", *extra], sim="maniskill"))
        return " ".join(r.getMessage() for r in caplog.records if "algo=grpo" in r.getMessage())

    assert "env.success_bonus=10 " in warning("env.success_bonus=8")  # step baseline, gamma 0.9
    assert warning("env.success_bonus=10") == ""
    assert "whole undiscounted episodes" in warning("env.success_bonus=10", "algo.baseline=episode")
    assert "env.success_bonus=50 " in warning("env.success_bonus=10", "algo.baseline=episode")
    assert warning("env.success_bonus=50", "algo.baseline=episode") == ""


def test_an_algorithm_refuses_a_policy_that_cannot_serve_it():
    with pytest.raises(ConfigError, match="algo=ppo needs a policy with log-prob.*gaussian_ac"):
        validate(compose_config(["algo=ppo"]))
    with pytest.raises(ConfigError, match="algo=sac needs a policy with reparameterised"):
        validate(compose_config(["policy=gaussian_ac"]))
    with pytest.raises(ConfigError, match="group_size=3 must divide"):
        validate(compose_config(["algo=grpo", "policy=gaussian_ac", "algo.group_size=3", "placement.envs_per_worker=4"]))
    validate(compose_config(["algo=grpo", "policy=gaussian_ac", "algo.group_size=2", "placement.envs_per_worker=4"]))
    with pytest.raises(ConfigError, match="policy.encoder=mlp would ignore env.cameras"):
        validate(compose_config(["algo=sac_flow", "policy=flow", "env.cameras=[base_camera]"], sim="maniskill"))
    validate(compose_config(["algo=sac_flow", "policy=flow", "policy.encoder=cnn", "env.cameras=[base_camera]"], sim="maniskill"))
    with pytest.raises(ConfigError, match="algo=sac_flow trains a flow policy"):
        validate(compose_config(["algo=sac_flow"]))
    with pytest.raises(ConfigError, match="demos= is not used"):
        validate(compose_config(["algo=ppo", "policy=gaussian_ac", "demos=somewhere"]))


def test_type_errors_are_caught():
    with pytest.raises(ConfigError, match="seed"):
        compose_config(["seed=abc"])


def test_semantic_validation():
    with pytest.raises(ConfigError, match="demos"):
        validate(compose_config(["algo=rlpd"]))
    with pytest.raises(ConfigError, match="cameras"):
        validate(compose_config(["policy=cnn"], sim="maniskill"))
    validate(compose_config(["policy=cnn", "env.cameras=[base_camera]"], sim="maniskill"))


def test_placements():
    col = make_plan(compose_config([]).placement, gpu_available=False)
    assert col.replay is None and col.learner.num_gpus == 0
    dis = make_plan(compose_config(["placement=disaggregated"]).placement, gpu_available=False)
    assert dis.replay is not None and dis.learner.num_gpus == 0  # no GPU: nothing requested
    dis_gpu = make_plan(compose_config(["placement=disaggregated"]).placement, gpu_available=True)
    assert dis_gpu.learner.num_gpus == 1 and dis_gpu.env_worker.num_gpus == 0
    col_gpu = make_plan(compose_config([]).placement, gpu_available=True)
    assert 0 < col_gpu.learner.num_gpus < 1 and 0 < col_gpu.env_worker.num_gpus < 1
    robot = make_plan(compose_config(["env.edge.host=x"], robot="franka").placement, False)
    assert robot.env_worker.actor_options()["resources"] == {"franka": 1}


def test_placement_auto_is_checked_and_refused_where_it_cannot_plan():
    validate(compose_config(["placement=auto"], sim="reach"))
    # a cluster's node groups are planned (tests/integration/test_plan_cluster.py); a fleet is placed by hand
    validate(compose_config(["placement=auto", "placement.ray_address=10.0.0.2:6379",
                             "+placement.groups.gpu_box={gpu_box: 1}"], sim="reach"))  # fmt: skip
    with pytest.raises(ConfigError, match="a fleet's members are placed by their robots' resources"):
        validate(compose_config(["placement=auto", "fleet=[{name: a}]"], sim="reach"))
    with pytest.raises(ConfigError, match="collocated, disaggregated or auto"):
        validate(compose_config(["placement.mode=fastest"], sim="reach"))
    with pytest.raises(ValueError, match="chosen when `rlinf-user train` starts"):
        make_plan(compose_config(["placement=auto"], sim="reach").placement, gpu_available=False)


def test_rollout_server_placement():
    off = make_plan(compose_config([]).placement, gpu_available=True)
    assert off.rollout is None
    col = make_plan(compose_config(["placement.rollout.enabled=true"]).placement, gpu_available=True)
    # the server shares the GPU with the learner; workers only step envs
    assert 0 < col.rollout.num_gpus < 1 and col.env_worker.num_gpus == 0
    assert col.total_cpus() == off.total_cpus() + col.rollout.num_cpus
    cpu = make_plan(compose_config(["placement.rollout.enabled=true"]).placement, gpu_available=False)
    assert cpu.rollout.num_gpus == 0
    cluster = make_plan(compose_config(["placement=cluster", "placement.rollout.enabled=true"]).placement, False)
    assert cluster.rollout.resources == {"gpu_box": 0.01}  # on the GPU box with the learner


def test_the_randomised_pick_carries_its_recipe_per_algorithm():
    """--sim gym_hil_random: random block, sparse reward, 50 held-out positions; RLPD gets the
    recipe's tuning unless the command line sets a key, SAC its own."""
    cfg = compose_config(["algo=rlpd", "algo.bc_weight=2.0"], sim="gym_hil_random")
    assert cfg.env.backend == "gym_hil" and cfg.env.kwargs.random_block_position is True
    assert cfg.env.reward == "sparse" and cfg.env.success_bonus == 0.0 and cfg.eval_episodes == 50
    a = cfg.algo
    assert (a.n_step, a.num_critics, a.backup_entropy, a.bc_warmup_updates, a.critic_warmup_updates, a.paced) == (
        3, 2, False, 3000, 2000, True)  # fmt: skip
    assert a.bc_weight == 2.0  # the command line wins
    sac = compose_config([], sim="gym_hil_random").algo
    assert sac.name == "sac" and sac.n_step == 3 and sac.learning_starts == 2000 and sac.bc_warmup_updates == 0
    with pytest.raises(ConfigError, match="n_step"):
        validate(compose_config(["algo.n_step=0"], sim="gym_hil_random"))
