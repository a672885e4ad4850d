"""``rlinf-user teleop``: drive a robot or a simulator with a teleop device and record
demonstrations as a LeRobotDataset v3.0."""

from __future__ import annotations

import logging

from rich.table import Table

from rlinf_user.config.compose import ConfigError, compose_config, to_yaml, validate
from rlinf_user.seeds import teleop_episode_seed

log = logging.getLogger(__name__)


def open_dataset(cfg, env, robot_type: str):
    from rlinf_user.data import lerobot_format as fmt
    from rlinf_user.data.lerobot_writer import LeRobotWriter
    from rlinf_user.env.spec import Col

    if not cfg.dataset.root:
        raise ConfigError("missing required config value: dataset.root (where episodes go, e.g. dataset.root=demos/pick)")
    space = env.observation_space
    cameras = {k: tuple(v.shape[:2]) for k, v in space[Col.IMAGES].spaces.items()}
    fps = int(round(cfg.teleop.rate_hz))
    features = fmt.contract_features(int(space[Col.STATE].shape[0]), cameras, fps)
    return LeRobotWriter(cfg.dataset.root, fps, features, robot_type=robot_type, resume=cfg.dataset.resume,
                         crf=cfg.dataset.crf, reward=fmt.reward_info(cfg.env))  # fmt: skip


def session_offset(cfg) -> int:
    """Where in its seed stream a session starts: 0 for a new dataset; a session appending to one
    that holds N episodes starts past every scene an earlier session could have used (N x the
    spread candidates per episode), so appended episodes are new scenes, not repeats. Past 1,000
    a stream runs into the next run seed's (``TELEOP_SEED_STRIDE``): a dataset appended that far
    can share scenes with one recorded from ``seed + 1``."""
    import json
    from pathlib import Path

    from rlinf_user.data.lerobot_format import INFO_PATH
    from rlinf_user.teleop.spread import CANDIDATES_PER_EPISODE

    info = Path(str(cfg.dataset.root or "")) / INFO_PATH
    if not (cfg.dataset.root and cfg.dataset.resume and info.is_file()):
        return 0
    try:
        had = int(json.loads(info.read_text()).get("total_episodes", 0))
    except (ValueError, OSError, TypeError):
        return 0  # the writer names what is wrong with it
    return had * CANDIDATES_PER_EPISODE


def scripted_hand(cfg, env):
    """``teleop=synthetic``: the task's scripted expert operating a simulated SpaceMouse
    (HID reports through the real parser), for demonstrations without a person; a sim
    with no scripted expert is refused by name."""
    from rlinf_user.robots.teleop.device import QueueSource
    from rlinf_user.robots.teleop.spacemouse import SpaceMouse
    from rlinf_user.teleop.synthetic import SpaceMouseHand, SyntheticHuman, synthetic_expert

    if cfg.env.kind != "sim":
        raise ConfigError("teleop=synthetic drives a simulator's scripted expert; a robot needs a person (teleop=spacemouse)")
    try:
        expert = synthetic_expert(cfg.env, env)
    except ValueError as err:
        raise ConfigError(f"teleop=synthetic: {err}") from err
    device = SpaceMouse(QueueSource())
    return device, SyntheticHuman(SpaceMouseHand(device), expert)


def run_teleop(args, console) -> int:
    cfg = compose_config(args.overrides, sim=args.sim, robot=args.robot)
    validate(cfg)
    if cfg.teleop.spread and cfg.env.kind != "sim":
        raise ConfigError("teleop.spread=true chooses a simulator's reset seeds; on a robot, place the objects "
                          "over the whole workspace yourself (docs/human-in-the-loop.md)")
    if args.dry_run:
        print(to_yaml(cfg), end="")
        return 0
    from rlinf_user.env.registry import make_recording_env
    from rlinf_user.robots.teleop.factory import open_teleop
    from rlinf_user.teleop.record import Recorder

    env = make_recording_env(cfg.env, seed=cfg.seed)
    writer = None
    device = None
    try:
        robot_type = args.robot or f"{cfg.env.backend}"
        if not cfg.dataset.root:
            open_dataset(cfg, env, robot_type)  # raises the missing-value error
        first = session_offset(cfg)
        seed_of = lambda n: teleop_episode_seed(cfg.seed, first + n)  # noqa: E731
        if cfg.teleop.spread:  # reset seeds whose object positions cover the workspace
            from rlinf_user.teleop.spread import CANDIDATES_PER_EPISODE, spread_seeds

            try:
                seed_of = spread_seeds(env, int(cfg.dataset.episodes), seed_of).__getitem__
            except ValueError as err:
                raise ConfigError(str(err)) from err
            console.print(f"spread {cfg.dataset.episodes} episodes over the workspace "
                          f"(from {CANDIDATES_PER_EPISODE * int(cfg.dataset.episodes)} candidate scenes)")
        before_step, rate = None, cfg.teleop.rate_hz
        if cfg.teleop.device == "synthetic":  # a scripted expert on a simulated SpaceMouse
            device, before_step = scripted_hand(cfg, env)
            rate = 0.0  # nobody to keep pace with: as fast as the simulator steps
        else:
            device = open_teleop(cfg.teleop)  # before the dataset: a missing device creates nothing
        writer = open_dataset(cfg, env, robot_type)
        task = cfg.dataset.task or str(cfg.env.task)
        console.print(
            f"recording [bold]{cfg.dataset.episodes}[/] episode(s) of {cfg.env.backend}:{cfg.env.task} "
            f"with the {cfg.teleop.device} into [bold]{writer.root}[/] ({writer.num_episodes} there already)"
        )

        def on_episode(r) -> None:
            where = f"saved as episode {r.index}" if r.index is not None else "discarded"
            console.print(f"  {r.outcome:<11} {r.steps:>4} steps  {r.seconds:6.1f} s  {where}")

        rec = Recorder(env, device, writer, task, rate_hz=rate, on_episode=on_episode, before_step=before_step)
        stats = rec.run(cfg.dataset.episodes, episode_seed=seed_of)
    finally:
        if device is not None:
            device.close()
        if writer is not None:
            writer.close()
        env.close()
    table = Table(title="teleop session", show_header=False)
    for k, v in stats.summary().items():
        if v is not None:
            table.add_row(k, str(v))
    table.add_row("dataset", f"{writer.root} ({writer.num_episodes} episodes, {writer.num_frames} frames)")
    console.print(table)
    if stats.error:
        console.print(f"[bold red]error:[/] {stats.error}")
        return 1
    return 0
