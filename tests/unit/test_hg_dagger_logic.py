"""The supervisor rule and the per-round/per-version statistics of HG-DAgger."""

import numpy as np
import pytest

from rlinf_user.teleop.hg_dagger import EpisodeLog, round_summary, version_summary
from rlinf_user.teleop.synthetic import StallRule


def test_supervisor_takes_over_when_the_task_stalls_and_hands_back():
    progress = iter([-0.10, -0.09, -0.08,  # getting closer by 1 cm a step
                     -0.079, -0.078, -0.077, -0.0765, -0.076,  # dithering: no new best by 5 mm
                     -0.07, -0.06, -0.05, -0.04,  # the human drives
                     -0.045, -0.03])  # fmt: skip
    rule = StallRule(lambda obs: next(progress), patience=5, min_gain=0.005, min_control=4)
    decisions = [rule({}, None, None) for _ in range(14)]
    assert decisions[:7] == [False] * 7
    assert decisions[7] is True  # the fifth step without progress: take over
    assert decisions[8:11] == [True] * 3  # kept min_control steps
    assert decisions[11:] == [False] * 3  # handed back; progress is measured from there
    rule.reset()
    assert not rule.engaged and rule.best is None


def test_pick_progress_follows_the_path_to_the_grasp_then_the_lift():
    from rlinf_user.teleop.synthetic import PickCubeExpert

    expert = PickCubeExpert()
    state = np.zeros(21, np.float32)

    def at(tcp, block=(0.3, 0.0, 0.02), grip=0.0):
        state[15:18], state[18:21], state[14] = tcp, block, grip
        return expert.progress({"state": state})

    far = at([0.2, 0.0, 0.2])
    above = at([0.3, 0.0, 0.08])  # lined up 6 cm above the block
    assert far < above and abs(above + 0.06) < 1e-6  # 6 cm of descent left
    assert at([0.3, 0.0, 0.04]) > above  # going down once lined up is progress
    assert at([0.29, 0.0, 0.03]) < above  # low but not lined up: not progress
    assert at([0.3, 0.0, 0.02], grip=1.0) > at([0.3, 0.0, 0.02])  # closing at the block is
    assert at([0.3, 0.0, 0.2], grip=1.0) == at([0.3, 0.0, 0.2])  # closing in the air is not
    assert at([0.3, 0.0, 0.05], block=(0.3, 0.0, 0.05)) > 1.0  # lifted beats any approach


def log(round_, kind, version, steps, iv, success):
    return EpisodeLog(round_, 0, kind, version, steps, iv, int(iv > 0), success, 1.0)


def test_round_and_version_statistics():
    entries = [
        log(0, "eval", 0, 20, 0, False), log(0, "eval", 0, 20, 0, True),  # demos-only baseline
        log(1, "dagger", 0, 20, 10, True), log(1, "dagger", 1, 20, 0, False),
        log(1, "eval", 1, 20, 0, False), log(1, "eval", 2, 20, 0, True),
        log(2, "dagger", 3, 10, 1, True), log(2, "dagger", 3, 10, 0, True),
    ]  # fmt: skip
    rounds = round_summary(entries)
    assert rounds[0]["intervention_rate"] is None and rounds[0]["autonomous_success"] == 0.5
    assert rounds[1]["intervention_rate"] == 0.25 and rounds[1]["autonomous_success"] == 0.5
    assert rounds[1]["autonomous_episodes"] == 2  # eval episodes when there are some
    assert rounds[2]["intervention_rate"] == 0.05 and rounds[2]["autonomous_episodes"] == 1  # else untouched ones
    per_version = version_summary(entries)
    assert per_version[0] == {"episodes": 2, "successes": 1, "success_rate": 0.5}  # dagger v0 was touched
    assert per_version[1] == {"episodes": 2, "successes": 0, "success_rate": 0.0}
    assert per_version[3]["success_rate"] == 1.0


def test_the_bc_learner_builds_chunk_targets_only_from_labels():
    """A chunk policy's sample at a labelled step: the next H executed actions, valid only
    where they are labels too and inside the episode; frames and instructions kept."""
    import torch

    from rlinf_user.config.compose import compose_config
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.runtime.learning.bc_learner import BCLearner

    spec = EnvSpec(state_dim=3, cameras={"top": (8, 8)}, instruction=True, active_dims=(0, 1, 2))
    cfg = compose_config(["policy=pi0", "policy.horizon=3"]).policy
    learner = BCLearner(cfg, spec, weight_store=None, batch_size=64)
    t = 6
    actions = np.zeros((t, 7), np.float32)
    actions[:, 0] = np.arange(t) / 10  # action k moves x by k/10
    labelled = np.array([0, 1, 1, 0, 1, 1], bool)  # the person took over twice
    obs = {"state": np.arange(t * 3, dtype=np.float32).reshape(t, 3),
           "images": {"top": np.full((t, 8, 8, 3), 7, np.uint8)}, "instruction": np.array(["go"] * t)}  # fmt: skip
    assert learner.add_episode(obs, actions, labelled, 1) == 4
    d = learner._merged()
    assert d["state"][:, 0].tolist() == [3.0, 6.0, 12.0, 15.0]  # steps 1, 2, 4, 5
    assert np.allclose(d["target"][0, :, 0], [0.1, 0.2, 0.3]) and d["valid"][0].tolist() == [True, True, False]
    assert np.allclose(d["target"][3, :, 0], [0.5, 0.5, 0.5]) and d["valid"][3].tolist() == [True, False, False]
    assert d["images/top"].shape == (4, 8, 8, 3) and set(d["instruction"]) == {"go"}
    obs_b, target, valid = learner._batch()
    assert obs_b["images"]["top"].dtype == torch.uint8 and obs_b["instruction"][0] == "go" and target.shape[1:] == (3, 3)
    with pytest.raises(ValueError, match="lack the frames of camera"):
        learner.add_episode({"state": obs["state"], "images": {}}, actions, labelled)
    assert learner.size() == 4  # nothing was added
    loss = learner.train(3)["loss"]
    assert np.isfinite(loss) and learner.bc.num_updates == 3
