"""``rlinf-user hg-dagger``: the policy acts, a person gates in and corrects, the policy is
retrained on demonstrations + corrections while the robot keeps running."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os

from rich.table import Table

from rlinf_user.config.compose import ConfigError, compose_config, to_yaml, validate

log = logging.getLogger(__name__)


def run_hg_dagger(args, console) -> int:
    # the learner is behaviour cloning: the policy must be BC-trainable, whatever algo= says elsewhere
    cfg = compose_config(["algo=bc", *args.overrides], sim=args.sim, robot=args.robot)
    validate(cfg)
    h = cfg.hg_dagger
    if not cfg.demos and not h.synthetic_human:
        raise ConfigError("hg-dagger starts from demonstrations: give demos=<LeRobot dataset> (record them with `rlinf-user teleop`)")
    if h.rounds < 1 or h.episodes_per_round < 1:
        raise ConfigError("hg_dagger.rounds and hg_dagger.episodes_per_round must be >= 1")
    if h.updates_per_episode < 0:
        raise ConfigError(f"hg_dagger.updates_per_episode must be >= 0 (0: train in the background), got {h.updates_per_episode}")
    if h.synthetic_human and not (cfg.env.backend == "reach" or (cfg.env.backend == "gym_hil" and "PickCube" in str(cfg.env.task))):
        raise ConfigError("hg_dagger.synthetic_human=true drives gym_hil's PandaPickCube and the reach sim only")
    if args.dry_run:
        print(to_yaml(cfg), end="")
        return 0

    import ray
    import torch

    from rlinf_user.env.registry import make_recording_env
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.policies.base import build_policy
    from rlinf_user.rundir import attach_log_file, create_run_dir
    from rlinf_user.runtime.learning.bc_learner import BCLearner
    from rlinf_user.runtime.orchestration.placement import start_ray
    from rlinf_user.runtime.orchestration.trainer import check_demos
    from rlinf_user.runtime.weights.store import WeightStore, WeightSubscriber
    from rlinf_user.teleop.hg_dagger import HGDaggerSession, round_summary, version_summary

    device = None
    if not h.synthetic_human:  # a missing device stops here, before anything is created
        from rlinf_user.robots.teleop.factory import open_teleop

        device = open_teleop(cfg.teleop)
    run_dir = create_run_dir(cfg, folders=())  # writes policy.pt, hg_dagger.json, episodes.csv
    attach_log_file(run_dir)
    console.print(f"run directory: [bold]{run_dir}[/]")
    torch.set_num_threads(1)
    writer = human = env = sub = None
    started_ray = False
    try:
        from rlinf_user.data.lerobot_reader import LeRobotReader

        env = make_recording_env(cfg.env, seed=cfg.seed)
        spec = EnvSpec.of_env(env)
        demo_root = cfg.demos
        if h.synthetic_human:
            device, human, demo_root = _synthetic_setup(env, spec, cfg, console, run_dir)
        check_demos(str(demo_root), spec)
        demos = LeRobotReader(demo_root)
        if cfg.dataset.root:
            from rlinf_user.cli.teleop import open_dataset

            writer = open_dataset(cfg, env, args.robot or cfg.env.backend)
        started_ray = start_ray({"address": "local", "num_cpus": max(2, os.cpu_count() or 1),
                                 "include_dashboard": False, "log_to_driver": True})  # fmt: skip
        store = ray.remote(WeightStore).options(num_cpus=0).remote()
        learner = (
            ray.remote(BCLearner)
            .options(num_cpus=1)
            .remote(cfg.policy, spec, store, h.batch_size, h.lr, h.publish_every, cfg.seed)
        )
        n_demo = add_demos(learner, demos, spec)
        console.print(f"behaviour cloning on {n_demo} demonstration steps ({h.warmup_updates} updates)")
        ray.get(learner.train.remote(h.warmup_updates))
        ray.get(learner.publish.remote())
        policy = build_policy(cfg.policy, spec)
        sub = WeightSubscriber(store, policy)
        sub.sync()
        if not h.updates_per_episode:
            ray.get(learner.start.remote(h.updates_per_s))
        if not h.synthetic_human and not device.started:
            device.start()

        def on_episode(e) -> None:
            console.print(
                f"  round {e.round} {e.kind:<6} v{e.policy_version:<4} {e.steps:>4} steps  "
                f"intervened {e.intervention_rate:5.0%} ({e.takeovers} take-overs)  "
                f"{'success' if e.success else 'failure'}"
            )

        session = HGDaggerSession(
            env, device, policy, sub, learner, spec, writer=writer, task=cfg.dataset.task or str(cfg.env.task),
            ramp_steps=h.ramp_steps, rate_hz=cfg.teleop.rate_hz, human=human, on_episode=on_episode,
            updates_per_episode=h.updates_per_episode,
        )  # fmt: skip
        error = None
        try:
            session.run(h.rounds, h.episodes_per_round, h.eval_episodes, seed=cfg.seed)
        except Exception as exc:  # a lost device: what was recorded is kept, the summary still written
            from rlinf_user.robots.teleop.command import DeviceDisconnected

            if not isinstance(exc, DeviceDisconnected):
                raise
            error = f"teleop device lost: {exc}"
        learner_stats = ray.get(learner.stop.remote())
        state = ray.get(learner.state_dict.remote())
        torch.save(state, run_dir / "policy.pt")
    finally:
        if sub is not None:
            sub.close()
        if device is not None:
            device.close()
        if writer is not None:
            writer.close()
        if env is not None:
            env.close()
        if started_ray:
            ray.shutdown()
    rounds = round_summary(session.log)
    summary = {
        "rounds": rounds,
        "per_policy_version": version_summary(session.log),
        "learner": learner_stats,
        "error": error,
    }
    (run_dir / "hg_dagger.json").write_text(json.dumps(summary, indent=2, default=str))
    with open(run_dir / "episodes.csv", "w", newline="") as f:
        rows = [dataclasses.asdict(e) for e in session.log]
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["round"])
        w.writeheader()
        w.writerows(rows)
    table = Table(title="HG-DAgger session")
    for col in ("round", "episodes", "intervention rate", "take-overs", "autonomous success (95% interval)"):
        table.add_column(col)
    for r in rounds:
        auto = "-"
        if r["autonomous_success"] is not None:
            lo, hi = r["autonomous_ci95"]
            auto = f"{r['autonomous_success']:.0%} ({lo:.0%}-{hi:.0%}) of {r['autonomous_episodes']}"
        rate = "-" if r["intervention_rate"] is None else f"{r['intervention_rate']:.0%}"
        label = f"{r['round']} (demos only)" if r["round"] == 0 and not r["episodes"] else str(r["round"])
        table.add_row(label, str(r["episodes"]), rate, str(r["takeovers"]), auto)
    console.print(table)
    console.print(
        f"learner: {learner_stats['updates']} updates, {learner_stats['samples']} samples "
        f"({learner_stats['corrections']} corrections), last version {learner_stats['version']}; "
        f"policy saved to {run_dir / 'policy.pt'}"
    )
    if error:
        console.print(f"[bold red]error:[/] {error}")
        return 1
    return 0


def add_demos(learner, reader, spec) -> int:
    """Every demonstration episode to the learner (camera frames and the episode's task as
    its instruction when the env has them); every step is a label."""
    import numpy as np
    import ray

    from rlinf_user.data import lerobot_format as fmt
    from rlinf_user.env.spec import Col

    cams = list(spec.cameras)
    n = 0
    for ep in reader.episodes(images=bool(cams)):
        states = ep.columns[fmt.STATE_KEY].astype(np.float32)
        obs = {Col.STATE: states, Col.IMAGES: {c: ep.images[c] for c in cams}}
        if spec.instruction:
            obs[Col.INSTRUCTION] = np.array([ep.task] * len(states))
        actions = ep.columns[fmt.ACTION_KEY].astype(np.float32)
        n = ray.get(learner.add_episode.remote(obs, actions, np.ones(len(states), bool), 0))
    return n


def _synthetic_setup(env, spec, cfg, console, run_dir):
    """A scripted supervisor on a simulated SpaceMouse; it records the demonstrations
    first unless ``demos=`` gives some. Returns (device, supervisor, demos folder)."""
    from rlinf_user.data import lerobot_format as fmt
    from rlinf_user.data.lerobot_writer import LeRobotWriter
    from rlinf_user.robots.teleop.device import QueueSource
    from rlinf_user.robots.teleop.spacemouse import SpaceMouse
    from rlinf_user.seeds import DEMO_EPISODE_OFFSET
    from rlinf_user.teleop.record import Recorder
    from rlinf_user.teleop.synthetic import SpaceMouseHand, StallRule, SyntheticHuman, synthetic_expert

    device = SpaceMouse(QueueSource())
    hand = SpaceMouseHand(device)
    root = cfg.demos
    if not root:
        root = run_dir / "synthetic_demos"
        writer = LeRobotWriter(root, 10, fmt.contract_features(spec.state_dim, dict(spec.cameras), 10),
                               reward=fmt.reward_info(cfg.env))  # fmt: skip
        n = int(cfg.hg_dagger.synthetic_demos)
        recorder = Recorder(env, device, writer, str(cfg.env.task), rate_hz=0,
                            before_step=SyntheticHuman(hand, synthetic_expert(cfg.env, env)))  # fmt: skip
        recorder.run(n, seed=cfg.seed + DEMO_EPISODE_OFFSET)
        writer.close()
        console.print(f"synthetic human recorded {n} demonstrations in {root}")
    expert = synthetic_expert(cfg.env, env)
    return device, SyntheticHuman(hand, expert, StallRule(expert.progress)), root
