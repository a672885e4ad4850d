"""Recording demonstrations in simulation through the real device code paths.

A synthetic human operates a SpaceMouse (HID reports through the device's parser) on
gym_hil's Franka pick-cube; a recorded keyboard session (kernel input events) drives
``rlinf-user teleop`` on ManiSkill with a camera. Datasets are read back and checked.
"""

import json
import time

import numpy as np
import pytest

from rlinf_user.cli.main import main
from rlinf_user.data import lerobot_format as fmt
from rlinf_user.data.lerobot_reader import LeRobotReader
from rlinf_user.data.lerobot_writer import LeRobotWriter
from rlinf_user.env.spec import Col
from rlinf_user.robots.teleop.device import QueueSource
from rlinf_user.robots.teleop.evdev_input import EV_KEY, EV_SYN, pack_event
from rlinf_user.robots.teleop.keyboard import KEY
from rlinf_user.robots.teleop.spacemouse import SpaceMouse
from rlinf_user.runtime.learning.replay_service import load_demo_buffer
from rlinf_user.sims.gym_hil import GymHilEnv
from rlinf_user.teleop.record import Recorder
from rlinf_user.teleop.synthetic import PickCubeExpert, SpaceMouseHand, SyntheticHuman

BUTTONS = {0: "gripper", 1: "intervene", 2: "rerecord", 3: "failure", 4: "stop"}  # a SpaceMouse Pro's keys


@pytest.fixture(scope="module")
def pick_env():
    env = GymHilEnv("PandaPickCube", max_episode_steps=60)
    yield env
    env.close()


def writer_for(env, root) -> LeRobotWriter:
    feats = fmt.contract_features(env.observation_space["state"].shape[0], {}, fps=10)
    return LeRobotWriter(root, 10, feats, robot_type="gym_hil")


def test_synthetic_human_records_successful_pick_demos(pick_env, tmp_path):
    dev = SpaceMouse(QueueSource())
    human = SyntheticHuman(SpaceMouseHand(dev), PickCubeExpert())
    rec = Recorder(pick_env, dev, writer_for(pick_env, tmp_path / "demos"), "pick up the cube", rate_hz=0, before_step=human)
    stats = rec.run(3, seed=0)
    assert [e.outcome for e in stats.episodes] == ["success"] * 3
    assert dev.reports > 30  # every step went through the HID parser

    r = LeRobotReader(tmp_path / "demos")
    assert r.num_episodes == 3
    for i in range(3):
        ep = r.episode(i)
        assert ep.meta["outcome"] == "success" and ep.meta["teleop_device"] == "spacemouse"
        assert ep.columns["intervention"].all() and (ep.columns["policy_version"] == -1).all()
        assert ep.columns["next.done"][-1] and not ep.columns["next.truncated"][-1] and ep.columns["next.success"][-1]
        a = ep.columns["action"]
        assert a[0, 6] == -1.0 and a[-1, 6] == 1.0  # opened, then closed on the cube
    demos = load_demo_buffer(str(tmp_path / "demos"))
    assert demos.size == sum(len(r.episode(i)) for i in range(3))


class Script:
    """Per episode attempt: press a button after ``n`` steps (or unplug the device)."""

    def __init__(self, dev, src, plan):
        self.dev, self.src, self.plan = dev, src, list(plan)
        self.hand = SpaceMouseHand(dev)
        self.steps = 0

    def reset(self):
        self.steps = 0
        self.current = self.plan.pop(0) if self.plan else None

    def __call__(self, obs):
        self.hand.move(np.array([0.3, 0, 0.2, 0, 0, 0]))
        what = self.current
        if what and self.steps == what[1]:
            if what[0] == "unplug":
                self.src.unplug()
                deadline = time.monotonic() + 2
                while self.dev.connected and time.monotonic() < deadline:
                    time.sleep(0.01)
            else:
                self.hand.click(what[0])
        self.steps += 1


def test_episode_controls_rerecord_failure_and_unplug_lose_nothing(pick_env, tmp_path):
    src = QueueSource()
    dev = SpaceMouse(src, buttons=BUTTONS).start()
    plan = [(2, 3), (3, 4), ("unplug", 5)]  # re-record after 3 steps; fail after 4; unplug after 5
    script = Script(dev, src, plan)
    rec = Recorder(pick_env, dev, writer_for(pick_env, tmp_path / "d"), "pick", rate_hz=0, before_step=script)
    try:
        stats = rec.run(5, seed=0)
    finally:
        dev.close()
    assert [e.outcome for e in stats.episodes] == ["failure", "device_lost"]
    assert "disconnected" in stats.error and "dataset.resume=true" in stats.error
    r = LeRobotReader(tmp_path / "d")
    assert r.num_episodes == 2
    failed, lost = r.episode(0), r.episode(1)
    assert len(failed) == 4 and failed.meta["outcome"] == "failure"  # the re-recorded attempt is gone
    assert failed.columns["next.done"][-1] and not failed.columns["next.success"][-1]
    assert len(lost) == 5 and lost.meta["outcome"] == "device_lost"  # the steps before the unplug are kept
    assert lost.columns["next.truncated"][-1]
    assert not list((tmp_path / "d").rglob("*.partial"))


def keys(events, t0=0.0):
    out = b""
    for dt, code, value in events:
        out += pack_event(EV_KEY, KEY[code], value, t0 + dt) + pack_event(EV_SYN, 0, 0, t0 + dt)
    return out


@pytest.mark.timeout(300)
def test_teleop_cli_records_a_camera_dataset_from_a_keyboard_session(tmp_path, capsys):
    session = keys(
        [
            (0.00, "W", 1), (0.60, "W", 0),  # move +x for ~6 steps
            (0.70, "E", 1), (1.00, "E", 0),
            (1.10, "ENTER", 1), (1.15, "ENTER", 0),  # success: episode 0 saved
            (1.60, "A", 1), (2.00, "A", 0),
            (2.10, "BACKSPACE", 1), (2.15, "BACKSPACE", 0),  # failure: episode 1 saved
            (2.60, "ESC", 1), (2.65, "ESC", 0),  # stop
        ]
    )  # fmt: skip
    (tmp_path / "keys.bin").write_bytes(session)
    root = tmp_path / "push"
    argv = [
        "teleop", "--sim", "maniskill", "env.task=PushCube-v1", "env.cameras=[base_camera]",
        "env.max_episode_steps=100", "teleop=keyboard", f"teleop.replay={tmp_path / 'keys.bin'}",
        f"dataset.root={root}", "dataset.episodes=5", "dataset.task=push the cube",
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr()
    r = LeRobotReader(root)
    assert r.num_episodes == 2, out
    assert r.cameras() == {"base_camera": (128, 128)}
    ok, failed = r.episode(0), r.episode(1)
    assert ok.meta["outcome"] == "success" and failed.meta["outcome"] == "failure"
    assert ok.task == "push the cube"
    a = ok.columns["action"]
    # W then E reached the env (the replay runs on the clock and the env steps at its own
    # pace: a loaded machine fits fewer steps into a key's 0.3-0.6 s, at least one)
    assert (a[:, 0] > 0.5).sum() >= 1 and (a[:, 2] > 0.5).sum() >= 1
    assert np.flatnonzero(a[:, 0] > 0.5).max() < np.flatnonzero(a[:, 2] > 0.5).min()  # in that order
    assert (failed.columns["action"][:, 1] > 0.5).sum() >= 1
    assert ok.images["base_camera"].shape == (len(ok), 128, 128, 3)
    assert ok.images["base_camera"].std() > 5  # a rendered scene, not a blank frame
    # running again into the same folder is refused, nothing is touched
    before = sorted(p.name for p in root.rglob("*"))
    assert main(argv) == 2
    assert "already exists" in capsys.readouterr().err.replace("\n", " ")
    assert sorted(p.name for p in root.rglob("*")) == before


def test_teleop_cli_records_scripted_demos_without_a_person(tmp_path, capsys):
    """teleop=synthetic: the task's scripted expert on a simulated SpaceMouse records a
    demo set from the command line (distinct randomised starts, all successes, and new ones
    when a second session appends); a sim with
    no scripted expert is refused by name and nothing is written."""
    root = tmp_path / "pick"
    argv = ["teleop", "--sim", "gym_hil", "env.kwargs.random_block_position=true", "teleop=synthetic",
            f"dataset.root={root}", "dataset.episodes=3"]  # fmt: skip
    assert main(argv) == 0
    r = LeRobotReader(root)
    eps = [r.episode(i) for i in range(r.num_episodes)]
    assert len(eps) == 3 and all(e.meta["outcome"] == "success" for e in eps)
    starts = {tuple(np.round(e.columns["observation.state"][0], 4)) for e in eps}
    assert len(starts) == 3  # a block placed anew each episode
    # the rewards are the ones training sees: gym_hil's success bonus (15) on each success step
    assert r.info[fmt.REWARD_INFO_KEY] == {"reward": "dense", "success_bonus": 15.0, "bonus_applied": True}
    for e in eps:
        reward, success = e.columns["next.reward"].ravel(), e.columns["next.success"].ravel().astype(bool)
        assert success[-1] and reward[-1] >= 15.0 and (reward[~success] < 15.0).all(), reward
    # a second session appending to the dataset records new scenes, not the first session's again
    assert main([*argv, "dataset.resume=true", "dataset.episodes=2"]) == 0
    r = LeRobotReader(root)
    assert r.num_episodes == 5
    starts = [tuple(np.round(r.episode(i).columns["observation.state"][0], 4)) for i in range(5)]
    assert len(set(starts)) == 5, starts
    capsys.readouterr()
    assert main(["teleop", "--sim", "maniskill", "teleop=synthetic", f"dataset.root={tmp_path / 'x'}"]) == 2
    assert "no scripted supervisor for maniskill" in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "x").exists()


def test_teleop_spread_records_demos_over_the_workspace_and_refuses_where_it_cannot(tmp_path, capsys):
    """teleop.spread=true on gym_hil's randomised pick records all its episodes from chosen
    scenes; a sim that does not report its object's position, and a robot, are refused by name
    before anything is written."""
    root = tmp_path / "spread"
    argv = ["teleop", "--sim", "gym_hil_random", "teleop=synthetic", "teleop.spread=true",
            f"dataset.root={root}", "dataset.episodes=4"]  # fmt: skip
    assert main(argv) == 0
    assert "spread 4 episodes over the workspace (from 100 candidate scenes)" in capsys.readouterr().err
    r = LeRobotReader(root)
    eps = [r.episode(i) for i in range(r.num_episodes)]
    assert len(eps) == 4 and all(e.meta["outcome"] == "success" for e in eps)
    assert len({tuple(np.round(e.columns["observation.state"][0], 4)) for e in eps}) == 4
    assert main(["teleop", "--sim", "reach", "teleop=synthetic", "teleop.spread=true",
                 f"dataset.root={tmp_path / 'reach'}"]) == 2  # fmt: skip
    assert "ReachEnv does not. Drop teleop.spread" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "reach").exists()
    assert main(["teleop", "--robot", "franka", "env.edge.host=127.0.0.1", "teleop.spread=true", "--dry-run"]) == 2
    assert "place the objects over the whole workspace yourself" in " ".join(capsys.readouterr().err.split())


def test_demos_recorded_without_their_success_bonus_get_it_on_load(tmp_path, caplog):
    """A dataset whose info says env.success_bonus=10 but whose success steps lack it (recorded
    before recordings applied the run's shaping) is repaired on load, with a warning; one
    recorded now loads as written."""
    import glob

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "reach"
    assert main(["teleop", "--sim", "reach", "teleop=synthetic", f"dataset.root={root}", "dataset.episodes=3"]) == 0
    fresh = load_demo_buffer(str(root))
    rewards = fresh.storage[Col.REWARD][: fresh.size].copy()
    assert (rewards >= 10.0).sum() == 3  # one success step per episode, bonus included
    for f in glob.glob(str(root / "data" / "**" / "*.parquet"), recursive=True):  # as the old recorder wrote it
        t = pq.read_table(f)
        r = np.array(t["next.reward"].to_pylist(), np.float32).reshape(-1)
        s = np.array(t["next.success"].to_pylist(), bool).reshape(-1)
        old = np.where(s, r - 10.0, r).astype(np.float32)
        i = t.schema.get_field_index("next.reward")
        pq.write_table(t.set_column(i, t.schema.field(i), pa.array(old.tolist(), type=t.schema.field(i).type)), f)
    assert (LeRobotReader(root).episode(0).columns["next.reward"] < 10.0).all()
    # the mark says the bonus is in: rewards below it on success steps are what was recorded
    # (a task whose steps cost more than its bonus), and load as they are
    with caplog.at_level("WARNING"):
        marked = load_demo_buffer(str(root))
    assert (marked.storage[Col.REWARD][: marked.size] < 10.0).all() and "added on load" not in caplog.text
    info_path = root / fmt.INFO_PATH  # as the old recorder wrote it: no mark
    info = json.loads(info_path.read_text())
    del info[fmt.REWARD_INFO_KEY]["bonus_applied"]
    info_path.write_text(json.dumps(info))
    with caplog.at_level("WARNING"):
        repaired = load_demo_buffer(str(root))
    assert np.allclose(repaired.storage[Col.REWARD][: repaired.size], rewards)
    assert "3 success step(s)" in caplog.text and "added on load" in caplog.text
