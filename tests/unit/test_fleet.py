"""Fleet members, the learner's union spec, and the adapter between them; node groups."""

import numpy as np
import pytest

from rlinf_user.config.compose import compose_config
from rlinf_user.env.spec import EnvSpec
from rlinf_user.runtime.orchestration.placement import make_plan, ray_init_kwargs
from rlinf_user.runtime.rollout.fleet import Adapter, members, misfit, union_spec, wants_member_id


def spec(state, cams, active):
    return EnvSpec(state_dim=state, cameras=cams, active_dims=tuple(active))


XYZG = [0, 1, 2, 6]
POSE = [0, 1, 2, 3, 4, 5, 6]


def test_members_default_to_the_run_env_and_merge_overrides():
    cfg = compose_config(["placement.num_env_workers=3"], sim="gym_hil")
    (m,) = members(cfg)
    assert m.name == "env" and m.workers == 3 and m.env.task == "PandaPickCube"
    cfg = compose_config(["fleet=[{name: a, resources: {ra: 1}}, {name: b, env: {task: PandaArrangeBoxes}, workers: 2}]"],
                         sim="gym_hil")  # fmt: skip
    a, b = members(cfg)
    assert (a.name, a.resources, a.env.task) == ("a", {"ra": 1.0}, "PandaPickCube")
    assert (b.index, b.workers, b.env.task, b.env.backend) == (1, 2, "PandaArrangeBoxes", "gym_hil")
    assert wants_member_id(cfg, [a, b])  # different tasks: the policy is told which one
    same = compose_config(["fleet=[{name: a, env: {edge: {host: h1}}}, {name: b, env: {edge: {host: h2}}}]",
                           "env.edge.host=x"], robot="franka")  # fmt: skip
    assert not wants_member_id(same, members(same))  # two robots of one kind: one embodiment
    with pytest.raises(ValueError, match="bad env override"):
        members(compose_config(["fleet=[{name: a, env: {taks: x}}]"], sim="gym_hil"))
    with pytest.raises(ValueError, match="two members"):
        members(compose_config(["fleet=[{name: a}, {name: a}]"], sim="gym_hil"))


def test_union_spec_pads_state_unions_cameras_and_action_dims():
    u = union_spec({0: spec(21, {}, XYZG), 1: spec(30, {"wrist": (64, 64)}, POSE)}, 2, member_id=True)
    assert u.state_dim == 32 and u.env_state_dim == 30 and u.member_id_dims == 2
    assert u.cameras == {"wrist": (64, 64)} and list(u.active_dims) == POSE and u.action_dim == 7
    assert EnvSpec.from_dict(u.to_dict()) == u  # what checkpoints store reads back the same
    with pytest.raises(ValueError, match="wrist"):
        union_spec({0: spec(4, {"wrist": (64, 64)}, XYZG), 1: spec(4, {"wrist": (128, 128)}, XYZG)}, 2, False)


def test_adapter_maps_observations_in_and_actions_out():
    u = union_spec({0: spec(3, {}, XYZG), 1: spec(5, {"wrist": (4, 4)}, POSE)}, 2, member_id=True)
    small = Adapter(spec(3, {}, XYZG), u, 0)
    obs = small.obs({"state": np.array([[1, 2, 3]], np.float32), "images": {}})
    np.testing.assert_array_equal(obs["state"], [[1, 2, 3, 0, 0, 1, 0]])  # padded, then member 0's id
    assert obs["images"]["wrist"].shape == (1, 4, 4, 3) and not obs["images"]["wrist"].any()  # black
    act = small.env_action(np.arange(1, 8, dtype=np.float32))
    np.testing.assert_array_equal(act, [1, 2, 3, 0, 0, 0, 7])  # rotation: not this robot's
    big = Adapter(spec(5, {"wrist": (4, 4)}, POSE), u, 1)
    img = np.full((2, 4, 4, 3), 9, np.uint8)
    out = big.obs({"state": np.ones((2, 5), np.float32), "images": {"wrist": img}})
    assert out["state"][:, -2:].tolist() == [[0, 1], [0, 1]] and out["images"]["wrist"] is img
    assert Adapter(spec(5, {}, XYZG), union_spec({0: spec(5, {}, XYZG)}, 1, False), 0).identity


def test_a_member_that_does_not_fit_is_named():
    u = union_spec({0: spec(5, {}, XYZG)}, 2, member_id=False)
    problems = misfit(spec(8, {"top": (8, 8)}, POSE), u)
    assert len(problems) == 3 and "state has 8" in problems[0] and "'top'" in problems[1] and "[3, 4, 5]" in problems[2]
    with pytest.raises(ValueError, match="does not fit this run's learner"):
        Adapter(spec(8, {}, XYZG), u, 1)


def test_node_groups_place_roles_and_a_single_machine_offers_them_all():
    cfg = compose_config(
        ["placement=disaggregated", "+placement.groups.gpu_box={gpu_box: 1}", "placement.learner.group=gpu_box",
         "placement.buffer.group=gpu_box", "fleet=[{name: left, resources: {franka_left: 1}}]"],
        sim="gym_hil",
    )  # fmt: skip
    plan = make_plan(cfg.placement, gpu_available=False)
    # a share of the group's resource: membership, so several roles fit on its node
    assert plan.learner.resources == {"gpu_box": 0.01} and plan.replay.resources == {"gpu_box": 0.01}
    assert plan.weights.resources == {"gpu_box": 0.01}  # the weight store sits with the learner
    assert plan.eval_worker.resources == {}  # simulator evaluation goes anywhere
    kwargs = ray_init_kwargs(cfg.placement, plan, ({"franka_left": 1.0},))
    assert kwargs["resources"] == {"gpu_box": 1.0, "franka_left": 1.0}
    bad = compose_config(["placement.learner.group=nowhere"], sim="gym_hil")
    with pytest.raises(ValueError, match="nowhere"):
        make_plan(bad.placement, gpu_available=False)


def test_fleet_validation_names_the_member_and_accepts_per_robot_hosts():
    from rlinf_user.config.compose import ConfigError, validate

    validate(compose_config(["placement=cluster", "fleets=two_frankas"], robot="franka"))  # hosts set per robot
    with pytest.raises(ConfigError, match="env.edge.host"):
        validate(compose_config(["fleet=[{name: a, env: {edge: {host: h}}}, {name: b}]"], robot="franka"))
    with pytest.raises(ConfigError, match="fleet member 'a'.*Nope"):
        validate(compose_config(["fleet=[{name: a, env: {task: Nope}}]"], sim="gym_hil"))
