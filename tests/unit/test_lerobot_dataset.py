"""LeRobotDataset v3.0 writer/reader: round trip, incremental saves, crash leftovers, bad input."""

import json
import logging

import numpy as np
import pytest

from rlinf_user.data import lerobot_format as fmt
from rlinf_user.data.lerobot_reader import LeRobotReader, episode_transitions
from rlinf_user.data.lerobot_writer import LeRobotWriter

FPS = 10
CAMS = {"wrist": (48, 64)}


def frame_image(ep: int, t: int) -> np.ndarray:
    img = np.zeros((48, 64, 3), np.uint8)
    img[..., 0] = 10 * t % 250
    img[..., 1] = 40 * ep
    img[8:24, 4 + 2 * t : 20 + 2 * t] = 255  # a moving square
    return img


def record(w: LeRobotWriter, ep: int, n: int, terminated: bool = True, save: bool = True, rng=None):
    rng = rng or np.random.default_rng(ep)
    states, actions = [], []
    for t in range(n):
        s, a = rng.normal(size=4).astype(np.float32), rng.uniform(-1, 1, 7).astype(np.float32)
        states.append(s)
        actions.append(a)
        last = t == n - 1
        w.add_frame(
            {
                "observation.state": s,
                "action": a,
                "next.reward": float(t),
                "next.done": last,
                "next.truncated": last and not terminated,
                "next.success": last and terminated,
                "intervention": t >= n // 2,
                "policy_version": 3 if t < n // 2 else -1,
            },
            {"wrist": frame_image(ep, t)},
        )
    if save:
        w.save_episode("push the cube", extra={"success": terminated})
    return np.stack(states), np.stack(actions)


def features():
    return fmt.contract_features(4, CAMS, FPS)


def test_round_trip_of_episodes_frames_and_metadata(tmp_path):
    root = tmp_path / "ds"
    w = LeRobotWriter(root, FPS, features(), robot_type="franka")
    written = [record(w, ep, n) for ep, n in enumerate((9, 12))]
    w.close()

    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 2 and info["total_frames"] == 21
    assert (root / "data/chunk-000/file-001.parquet").exists()
    assert (root / "videos/observation.images.wrist/chunk-000/file-001.mp4").exists()
    stats = json.loads((root / "meta/stats.json").read_text())
    assert stats["observation.state"]["count"] == [21]
    assert np.array(stats["observation.images.wrist"]["mean"]).shape == (3, 1, 1)

    r = LeRobotReader(root)
    assert r.num_episodes == 2 and r.cameras() == CAMS and r.fps == FPS
    for ep, (states, actions) in enumerate(written):
        e = r.episode(ep)
        assert e.task == "push the cube" and e.meta["success"] is True
        np.testing.assert_array_equal(e.columns["observation.state"], states)
        np.testing.assert_array_equal(e.columns["action"], actions)
        np.testing.assert_allclose(e.columns["timestamp"], np.arange(len(states)) / FPS, atol=1e-6)
        assert e.columns["intervention"].tolist() == [t >= len(states) // 2 for t in range(len(states))]
        original = np.stack([frame_image(ep, t) for t in range(len(states))])
        err = np.abs(e.images["wrist"].astype(int) - original.astype(int))
        assert err.mean() < 2.0 and np.percentile(err, 99) < 20  # lossy h264 at crf 18


def test_transitions_terminal_and_truncated_episodes(tmp_path):
    w = LeRobotWriter(tmp_path / "ds", FPS, features())
    s_term, _ = record(w, 0, 6, terminated=True)
    s_trunc, _ = record(w, 1, 6, terminated=False)
    r = LeRobotReader(tmp_path / "ds")
    term = episode_transitions(r.episode(0), ["wrist"])
    assert len(term["reward"]) == 6 and term["terminated"].tolist() == [False] * 5 + [True]
    np.testing.assert_array_equal(term["next_obs/state"][:5], s_term[1:])
    trunc = episode_transitions(r.episode(1))
    assert len(trunc["reward"]) == 5 and not trunc["terminated"].any()  # the cut-off frame has no successor
    np.testing.assert_array_equal(trunc["next_obs/state"], s_trunc[1:])
    assert term["obs/images/wrist"].shape == (6, 48, 64, 3)


def test_existing_folder_is_refused_unless_resumed_and_resume_appends(tmp_path):
    root = tmp_path / "ds"
    w = LeRobotWriter(root, FPS, features())
    record(w, 0, 5)
    before = sorted(p.name for p in root.rglob("*"))
    with pytest.raises(fmt.DatasetError, match="already exists.*resume=true"):
        LeRobotWriter(root, FPS, features())
    assert sorted(p.name for p in root.rglob("*")) == before
    w2 = LeRobotWriter(root, FPS, features(), resume=True)
    record(w2, 1, 7)
    r = LeRobotReader(root)
    assert r.num_episodes == 2 and r.info["total_frames"] == 12
    assert r.episode(1).columns["index"][0] == 5  # global frame index continues


def test_mismatched_features_are_named(tmp_path):
    root = tmp_path / "ds"
    record(LeRobotWriter(root, FPS, features()), 0, 4)
    other = fmt.contract_features(6, {"front": (48, 64)}, FPS)
    with pytest.raises(fmt.DatasetError) as e:
        LeRobotWriter(root, FPS, other, resume=True)
    msg = str(e.value)
    assert "observation.state" in msg and "(4,)" in msg and "(6,)" in msg
    assert "observation.images.front: only in the env" in msg and "observation.images.wrist: only in the dataset" in msg
    with pytest.raises(fmt.DatasetError, match="20 fps|10 fps"):
        LeRobotWriter(root, 20, features(), resume=True)


def test_partially_written_episode_after_a_crash_is_removed_and_named(tmp_path, caplog):
    root = tmp_path / "ds"
    w = LeRobotWriter(root, FPS, features())
    record(w, 0, 5)
    record(w, 1, 5, save=False)  # recording when the "crash" happens
    # what a crash mid-save leaves: a half-encoded video, and a data file that landed
    # before info.json (the commit point) was updated
    (root / "videos/observation.images.wrist/chunk-000/.file-001.mp4.partial").write_bytes(b"\0" * 100)
    (root / "data/chunk-000/file-001.parquet").write_bytes(b"PAR1 torn")
    del w  # the process is gone; nothing is flushed
    with caplog.at_level(logging.WARNING):
        w2 = LeRobotWriter(root, FPS, features(), resume=True)
    assert "not completely saved" in caplog.text and "file-001.parquet" in caplog.text
    assert not list(root.rglob("*.partial")) and not (root / "data/chunk-000/file-001.parquet").exists()
    record(w2, 1, 6)
    r = LeRobotReader(root)
    assert [len(r.episode(i)) for i in range(2)] == [5, 6]


def test_rerecord_discards_and_bad_frames_lose_nothing(tmp_path):
    root = tmp_path / "ds"
    w = LeRobotWriter(root, FPS, features())
    record(w, 0, 4, save=False)
    w.discard_episode()
    assert not list(root.rglob("*.partial"))
    good = {
        "observation.state": np.zeros(4),
        "action": np.zeros(7),
        "next.reward": 0.0,
        "next.done": False,
        "next.truncated": False,
        "next.success": False,
        "intervention": False,
        "policy_version": -1,
    }
    w.add_frame(good, {"wrist": frame_image(0, 0)})
    with pytest.raises(fmt.DatasetError, match="NaN"):
        w.add_frame({**good, "action": np.full(7, np.nan)}, {"wrist": frame_image(0, 1)})
    with pytest.raises(fmt.DatasetError, match="shape"):
        w.add_frame({**good, "observation.state": np.zeros(5)}, {"wrist": frame_image(0, 1)})
    with pytest.raises(fmt.DatasetError, match="camera 'wrist'"):
        w.add_frame(good, {})
    with pytest.raises(fmt.DatasetError, match="lacks"):
        w.add_frame({k: v for k, v in good.items() if k != "action"}, {"wrist": frame_image(0, 1)})
    assert w.episode_frames == 1  # the refused frames left the episode as it was
    w.add_frame(good, {"wrist": frame_image(0, 1)})
    w.save_episode("t")
    assert len(LeRobotReader(root).episode(0)) == 2


def test_reader_refuses_what_is_not_a_v3_dataset(tmp_path):
    with pytest.raises(fmt.DatasetError, match="info.json is missing"):
        LeRobotReader(tmp_path)
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta/info.json").write_text(json.dumps({"codebase_version": "v2.1"}))
    with pytest.raises(fmt.DatasetError, match="v2.1"):
        LeRobotReader(tmp_path)


def test_only_human_steps_of_a_session_become_demonstrations(tmp_path):
    from rlinf_user.runtime.learning.replay_service import load_demo_buffer

    root = tmp_path / "session"
    w = LeRobotWriter(root, FPS, features())
    states, _ = record(w, 0, 10)  # the policy acted on steps 0-4, the human on 5-9
    w.close()
    demos = load_demo_buffer(str(root), ["wrist"])
    assert demos.size == 5 and demos.storage["intervention"][:5].all()
    np.testing.assert_allclose(demos.storage["obs/state"][:5], states[5:])
    assert demos.storage["terminated"][4] == 1.0  # the episode's terminal step is one of them

    policy_only = tmp_path / "policy_only"
    w = LeRobotWriter(policy_only, FPS, features())
    w.add_frame({"observation.state": np.zeros(4, np.float32), "action": np.zeros(7, np.float32),
                 "next.reward": 0.0, "next.done": True, "next.truncated": False, "next.success": False,
                 "intervention": False, "policy_version": 1}, {"wrist": frame_image(0, 0)})  # fmt: skip
    w.save_episode("push the cube")
    w.close()
    with pytest.raises(ValueError, match="no human-controlled transitions"):
        load_demo_buffer(str(policy_only))


def test_demos_recorded_under_other_reward_settings_are_refused(tmp_path):
    from omegaconf import OmegaConf

    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.runtime.orchestration.run_record import RunError
    from rlinf_user.runtime.orchestration.trainer import check_demos

    root = tmp_path / "ds"
    dense = OmegaConf.create({"reward": "dense", "success_bonus": 15.0})
    w = LeRobotWriter(root, FPS, fmt.contract_features(4, {}, FPS), reward=fmt.reward_info(dense))
    record(w, 0, 5)
    w.close()
    assert json.loads((root / "meta/info.json").read_text())[fmt.REWARD_INFO_KEY] == {
        "reward": "dense", "success_bonus": 15.0, "bonus_applied": True}  # fmt: skip
    spec = EnvSpec(state_dim=4, cameras={})
    check_demos(str(root), spec, dense)  # the same settings: fine
    check_demos(str(root), spec, None)  # a learned reward relabels them: fine
    with pytest.raises(RunError, match="env.reward=dense env.success_bonus=15.0.*record them again"):
        check_demos(str(root), spec, OmegaConf.create({"reward": "sparse", "success_bonus": 0.0}))
    # appending episodes recorded under other settings is refused too
    with pytest.raises(fmt.DatasetError, match="rewards follow"):
        LeRobotWriter(root, FPS, fmt.contract_features(4, {}, FPS), resume=True, reward={"reward": "sparse", "success_bonus": 0.0})
    # an older dataset (no bonus mark) takes episodes recorded under its settings, and keeps its info
    info = json.loads((root / "meta/info.json").read_text())
    del info[fmt.REWARD_INFO_KEY]["bonus_applied"]
    (root / "meta/info.json").write_text(json.dumps(info))
    check_demos(str(root), spec, dense)
    w = LeRobotWriter(root, FPS, fmt.contract_features(4, {}, FPS), resume=True, reward=fmt.reward_info(dense))
    record(w, 1, 5)
    w.close()
    assert "bonus_applied" not in json.loads((root / "meta/info.json").read_text())[fmt.REWARD_INFO_KEY]
