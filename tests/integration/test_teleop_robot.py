"""``rlinf-user teleop --robot franka`` without hardware: a recorded keyboard session
(kernel input events) drives franky-sim's MuJoCo Franka through the edge daemon (its own
process: control loop, safety, the real franky client), and the episode lands in a
LeRobotDataset."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("franky")
pytest.importorskip("franky_sim")

from edge_helpers import EdgeProcess, free_ports  # noqa: E402

from rlinf_user.cli.main import main  # noqa: E402
from rlinf_user.data.lerobot_reader import LeRobotReader  # noqa: E402
from rlinf_user.robots.teleop.evdev_input import EV_KEY, EV_SYN, pack_event  # noqa: E402
from rlinf_user.robots.teleop.keyboard import KEY  # noqa: E402


def keys(events) -> bytes:
    return b"".join(pack_event(EV_KEY, KEY[c], v, t) + pack_event(EV_SYN, 0, 0, t) for t, c, v in events)


@pytest.mark.timeout(300)
def test_teleop_records_a_robot_episode_through_the_edge(tmp_path, capsys):
    session = keys([(0.0, "W", 1), (1.0, "W", 0), (1.3, "ENTER", 1), (1.35, "ENTER", 0), (2.6, "ESC", 1), (2.65, "ESC", 0)])
    (tmp_path / "keys.bin").write_bytes(session)
    port = free_ports(2)
    edge = EdgeProcess(
        ["--robot", "franka", "franky_sim=true", "robot.ip=127.0.0.43", "control_hz=10", "robot.relative_dynamics_factor=0.5"],
        port, tmp_path / "edge.log",
    )  # fmt: skip
    try:
        rc = main([
            "teleop", "--robot", "franka", "env.edge.host=127.0.0.1", f"env.edge.port={port}",
            "teleop=keyboard", f"teleop.replay={tmp_path / 'keys.bin'}", f"dataset.root={tmp_path / 'demos'}",
            "dataset.episodes=3", "dataset.task=move forward",
        ])  # fmt: skip
    finally:
        edge.close()
    out = capsys.readouterr()
    assert rc == 0, out.err
    r = LeRobotReader(tmp_path / "demos")
    assert r.num_episodes == 1 and r.info["robot_type"] == "franka", out.out  # the stopped episode is discarded
    ep = r.episode(0)
    assert ep.meta["outcome"] == "success" and ep.task == "move forward"
    a, s = ep.columns["action"], ep.columns["observation.state"]
    assert (a[:, 0] > 0.5).sum() >= 5 and np.all(a[:, 6] == -1.0)
    assert s[-1, 0] - s[0, 0] > 0.03, f"the TCP did not move forward: {s[0, :3]} -> {s[-1, :3]}"
    assert ep.columns["intervention"].all() and (ep.columns["policy_version"] == -1).all()
