"""HIL-SERL style training: a supervisor gates in on env worker 0 during ``rlinf-user
train``; the steps they control are flagged in the online buffer and also drawn on the
demo side of the learner's batches. The supervisor here is the scripted one operating a
simulated SpaceMouse (HID reports through the real parser) on gym_hil's pick task."""

import json

import numpy as np
import pytest

from rlinf_user.cli.main import main
from rlinf_user.config.compose import ConfigError, compose_config, validate
from rlinf_user.data.replay import ReplayBuffer


@pytest.mark.timeout(600)
def test_train_with_a_supervisor_feeds_interventions_to_both_buffers(tmp_path, capsys):
    argv = [
        "train", "--sim", "gym_hil", "env.kwargs.random_block_position=true", "env.max_episode_steps=40",
        "intervention.enabled=true", "intervention.synthetic_human=true", "algo.demo_ratio=0.5",
        "total_env_steps=1200", "algo.learning_starts=300", "algo.batch_size=64", "policy.hidden=[64,64]",
        "eval_every_steps=100000", "eval_episodes=2", "buffer.chunk_steps=20", "placement.num_env_workers=2",
        f"run_root={tmp_path}", "run_name=hil", "progress=false",
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    run = tmp_path / "hil"
    summary = json.loads((run / "eval" / "summary.json").read_text())
    replay = summary["replay"]
    assert summary["interventions"] > 0 and summary["teleop_device_lost"] is None
    assert 0 < replay["interventions"] < replay["size"]  # the human acted on some steps only
    assert replay["intervention_samples"] > 0  # and the learner drew them as demonstrations

    buf = ReplayBuffer(10_000, run / "buffer")
    buf.restore()
    flags = buf.storage["intervention"][: buf.size]
    assert int(flags.sum()) == replay["interventions"]
    env_ids = buf.storage["env_id"][: buf.size]
    assert not flags[env_ids >= 1000].any()  # worker 1 is unsupervised: never flagged
    assert flags[env_ids == 0].any()
    actions = buf.storage["action"][: buf.size]
    assert np.isfinite(actions).all() and (np.abs(actions) <= 1.0 + 1e-6).all()


def test_intervention_config_errors_name_the_fix():
    cfg = compose_config(["intervention.enabled=true"], sim="gym_hil")
    with pytest.raises(ConfigError, match="algo.demo_ratio"):
        validate(cfg)  # interventions as demos need a demo share in each batch
    validate(compose_config(["intervention.enabled=true", "intervention.to_demos=false"], sim="gym_hil"))
    cfg = compose_config(["intervention.enabled=true", "intervention.synthetic_human=true", "algo=rlpd"], sim="maniskill")
    with pytest.raises(ConfigError, match="PandaPickCube"):
        validate(cfg)
    sup = ["intervention.enabled=true", "intervention.synthetic_human=true", "algo=rlpd"]
    for bad in ("intervention.patience=0", "intervention.min_control=-2"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
            validate(compose_config([*sup, bad], sim="gym_hil"))


def test_the_scripted_supervisors_temper_comes_from_the_config():
    from rlinf_user.teleop.supervisor import Supervisor

    cfg = compose_config(["intervention.enabled=true", "intervention.synthetic_human=true", "algo=rlpd",
                          "intervention.patience=20", "intervention.min_control=3"], sim="gym_hil")  # fmt: skip
    stall = Supervisor.from_config(cfg).human.gate
    assert (stall.patience, stall.min_control) == (20, 3)
