"""``rlinf-user``: the command line. Trailing arguments are Hydra overrides."""

from __future__ import annotations

import argparse
import logging
import sys

from rich.console import Console
from rich.logging import RichHandler

EPILOG = (
    "Trailing KEY=VALUE arguments are Hydra overrides, e.g. "
    "`rlinf-user train --sim maniskill algo=rlpd env.task=PushCube-v1 seed=3`."
)


def _env_args(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--sim", metavar="NAME", help="simulator: maniskill | gym_hil | gym_hil_random | robosuite | reach | reach_color")
    where.add_argument("--robot", metavar="NAME", help="real robot behind the edge daemon: franka")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlinf-user",
        description="Real-robot-first embodied learning: teach robots online, in sim and on hardware.",
        epilog=EPILOG,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    train = sub.add_parser(
        "train", help="online RL (SAC/RLPD/CrossQ) in a simulator or on a robot", epilog=EPILOG
    )
    _env_args(train)

    plan = sub.add_parser("plan", help="profile the roles on this machine and rank placements (no training)",
                          epilog="Example: `rlinf-user plan --sim gym_hil_random algo=rlpd demos=...`")  # fmt: skip
    _env_args(plan)
    plan.add_argument("--budget", type=float, default=30.0, help="seconds the profile may take (default 30)")
    plan.add_argument("--top", type=int, default=8, help="placements shown (default 8)")
    plan.add_argument("--out", help="write the profile, the ranking and the choice as JSON here")

    ev = sub.add_parser("eval", help="run a checkpoint for N episodes: success rate + mp4", epilog=EPILOG)
    ev.add_argument("run", nargs="?", help="a run directory or a checkpoint file (.pt); "
                    "or none, with --sim/--robot and policy=... (a pretrained VLA folder, an openpi server)")  # fmt: skip
    where = ev.add_mutually_exclusive_group()
    where.add_argument("--sim", metavar="NAME", help="without a run: evaluate policy=... in this simulator")
    where.add_argument("--robot", metavar="NAME", help="without a run: evaluate policy=... on this robot")
    ev.add_argument("--episodes", type=int, default=20, help="episodes to run (default 20)")
    ev.add_argument("--video-episodes", type=int, default=3, help="episodes recorded to mp4 (default 3)")
    ev.add_argument("--out", help="where to write results (default <run>/eval/, or <run_root>/eval-<policy>)")
    ev.add_argument("--member", help="the fleet member whose env to evaluate on (default: the first)")
    ev.add_argument("--split", choices=["test", "validation"], default="test",
                    help="held-out initial states: test (default; nothing in training selects on them) or "
                         "validation (those training's evaluations and best.pt used)")  # fmt: skip
    ev.add_argument("--episode-offset", type=int, default=0,
                    help="start the episodes' reset seeds this far into the split")  # fmt: skip
    ev.add_argument(
        "--checkpoint", choices=["best", "latest"], default="best",
        help="given a run: the policy of its best evaluation (default; the latest if none scored) or the latest",
    )  # fmt: skip
    ev.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides on the run's config")

    edge = sub.add_parser(
        "edge",
        help="run the edge daemon on the robot PC (control loop, cameras, safety); "
        "`edge keygen DIR` creates its CURVE keys",
        epilog="Examples: `rlinf-user edge --robot franka robot.ip=172.16.0.2 bind=10.0.0.5 "
        "secret_key=keys/edge.key_secret authorized_keys=keys/authorized`; "
        "`rlinf-user edge --robot franka franky_sim=true` (MuJoCo Franka, no hardware); "
        "`rlinf-user edge --sim gym_hil`; `rlinf-user edge keygen keys/`.",
    )
    _env_args(edge)
    edge.add_argument("--duration", type=float, default=None, help="serve this many seconds, then exit")

    tele = sub.add_parser(
        "teleop",
        help="drive a robot or simulator with a SpaceMouse/keyboard/gamepad and record demonstrations "
        "(LeRobotDataset v3.0)",
        epilog="Examples: `rlinf-user teleop --sim gym_hil dataset.root=demos/pick dataset.episodes=20`; "
        "`rlinf-user teleop --robot franka env.edge.host=10.0.0.5 teleop=spacemouse dataset.root=demos/peg`; "
        "`... teleop=keyboard`; `... dataset.resume=true` appends to an existing dataset.",
    )
    _env_args(tele)

    hg = sub.add_parser(
        "hg-dagger",
        help="HG-DAgger: the policy acts, a person gates in with the teleop device and corrects; "
        "the policy is retrained on demonstrations + corrections while the robot runs",
        epilog="Examples: `rlinf-user hg-dagger --robot franka env.edge.host=10.0.0.5 demos=demos/pick "
        "dataset.root=sessions/pick-1`; `rlinf-user hg-dagger --sim gym_hil env.kwargs.random_block_position=true "
        "hg_dagger.synthetic_human=true` (a scripted supervisor, no device).",
    )
    _env_args(hg)

    rw = sub.add_parser(
        "train-reward",
        help="train a success classifier from recorded episodes (a learned reward: `train reward.classifier=PATH`)",
        epilog="Example: `rlinf-user train-reward demos/pick sessions/pick-1 --out rewards/pick.pt`. A frame is a "
        "success when its step succeeded or it is among the last --last-frames frames of an episode that did.",
    )
    rw.add_argument("datasets", nargs="+", help="LeRobot datasets (teleop demonstrations, HG-DAgger sessions)")
    rw.add_argument("--out", required=True, help="where to write the classifier (.pt)")
    rw.add_argument("--steps", type=int, default=2000, help="gradient steps (default 2000)")
    rw.add_argument(
        "--last-frames", type=int, default=3,
        help="final frames of a successful episode labelled success (covers a person's delay on the success "
        "control; 1 where the env flags the success frame itself, as simulators do)",
    )  # fmt: skip
    rw.add_argument("--threshold", type=float, default=0.5, help="probability above which a frame counts as success")
    rw.add_argument("--val-fraction", type=float, default=0.25, help="episodes held out for validation")
    rw.add_argument("--encoder", choices=["mlp", "cnn"], help="default: cnn when the datasets have cameras")
    rw.add_argument("--seed", type=int, default=0)

    cal = sub.add_parser(
        "calibrate",
        help="camera intrinsics, hand-eye (eye-in-hand / eye-to-hand), the workspace box, and a check picture, "
        "through the edge daemon",
        epilog="Examples: `rlinf-user calibrate hand-eye --robot franka env.edge.host=10.0.0.5 calibration.camera=wrist`; "
        "`... calibration.camera=front calibration.mode=eye_to_hand`; `rlinf-user calibrate workspace --robot franka "
        "teleop=spacemouse`; `rlinf-user calibrate check --robot franka calibration.camera=front "
        "calibration.workspace=workspace`. Results: calibration/<robot>/<name>.yaml.",
    )
    cal.add_argument("--robot", metavar="NAME", help="the arm behind the edge daemon: franka")
    # one positional list: argparse cannot split ACTION from overrides around --robot
    cal.add_argument("overrides", nargs="+", metavar="ACTION [KEY=VALUE ...]",
                     help="intrinsics | hand-eye | workspace | check, then Hydra overrides")

    doc = sub.add_parser("doctor", help="check versions, devices, simulators and drivers; say how to fix")
    doc.add_argument("--robot", metavar="NAME", help="also check the robot PC: robot link, versions, "
                     "real-time, cameras, keys (franka)")
    doc.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                     help="edge config overrides for --robot, e.g. robot.ip=172.16.0.2")
    return parser


# A command's refusals, each printed as one line instead of a traceback: (module, exception
# class, label, exit code), first match wins. They are looked up when an error arrives, in
# the modules already imported: an exception whose module was never imported cannot have
# been raised, and so `rlinf-user edge` and `doctor` on the robot PC never import torch
# (the trainer's and the policies' modules do) just to name an error.
REFUSALS = (
    ("builtins", "FileNotFoundError", "error:", 2),
    ("builtins", "FileExistsError", "error:", 2),
    ("rlinf_user.config.compose", "ConfigError", "error:", 2),
    ("rlinf_user.data.lerobot_format", "DatasetError", "error:", 2),
    ("rlinf_user.robots.teleop.command", "DeviceDisconnected", "error: teleop device:", 1),
    ("rlinf_user.edge.daemon", "EdgeStartError", "error:", 1),
    ("rlinf_user.edge.security", "AuthError", "error:", 1),
    ("rlinf_user.runtime.orchestration.run_record", "RunError", "error:", 1),
    ("rlinf_user.policies.base", "PolicyUnavailable", "error:", 1),
    ("rlinf_user.evaluation", "EvaluationStopped", "error:", 1),
    ("rlinf_user.runtime.planning.profile", "ProfileError", "error:", 1),
    ("rlinf_user.calibration.solve", "PoorPoseSet", "calibration refused:", 1),
    ("rlinf_user.calibration.board", "BoardNotFound", "calibration refused:", 1),
    ("rlinf_user.calibration.store", "CalibrationMismatch", "calibration refused:", 1),
)


def _refusal(err: BaseException) -> tuple[str, int] | None:
    """(label, exit code) for an error a command refuses with, None for a bug."""
    for module, name, label, code in REFUSALS:
        mod = sys.modules.get(module)
        if mod is not None and isinstance(err, getattr(mod, name)):
            return label, code
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "overrides", None), list):
        # overrides after an option (`eval --out DIR key=value`): argparse ends a positional
        # list at the first option and leaves the rest over
        late = [e for e in extra if not e.startswith("-") and ("=" in e or args.command == "calibrate")]
        args.overrides += late
        extra = [e for e in extra if e not in late]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    console = Console(stderr=True)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=console, show_path=False, rich_tracebacks=False)],
    )
    try:
        if args.command == "train":
            from rlinf_user.cli.train import run_train

            return run_train(args, console)
        if args.command == "plan":
            from rlinf_user.cli.plan import run_plan

            return run_plan(args, console)
        if args.command == "eval":
            from rlinf_user.cli.evaluate import run_eval

            return run_eval(args, console)
        if args.command == "edge":
            from rlinf_user.cli.edge import run_edge

            return run_edge(args, console)
        if args.command == "teleop":
            from rlinf_user.cli.teleop import run_teleop

            return run_teleop(args, console)
        if args.command == "hg-dagger":
            from rlinf_user.cli.hg_dagger import run_hg_dagger

            return run_hg_dagger(args, console)
        if args.command == "train-reward":
            from rlinf_user.cli.train_reward import run_train_reward

            return run_train_reward(args, console)
        if args.command == "calibrate":
            from rlinf_user.cli.calibrate import run_calibrate

            return run_calibrate(args, console)
        if args.command == "doctor":
            from rlinf_user.cli.doctor import run_doctor

            return run_doctor(args, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130
    except Exception as err:
        refusal = _refusal(err)
        if refusal is None:
            raise
        label, code = refusal
        console.print(f"[bold red]{label}[/] {err}")
        return code
    return 1


if __name__ == "__main__":
    sys.exit(main())
