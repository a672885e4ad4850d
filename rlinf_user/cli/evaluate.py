"""``rlinf-user eval RUN|CKPT``."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rich.table import Table

from rlinf_user.policies.base import PolicyUnavailable


def run_eval(args, console) -> int:
    from omegaconf import OmegaConf

    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.evaluation import evaluate_policy, load_policy_from_checkpoint
    from rlinf_user.runtime.learning.learner import latest_checkpoint

    if getattr(args, "sim", None) or getattr(args, "robot", None):
        return _eval_configured_policy(args, console)
    if args.run is None or "=" in args.run:
        from rlinf_user.config.compose import ConfigError

        raise ConfigError("eval needs a run directory or checkpoint, or --sim/--robot with policy=... overrides")
    target = Path(args.run)
    if target.is_file():
        ckpt, run_dir = target, target.parent.parent
    else:
        run_dir = target
        best = target / "checkpoints" / "best.pt"
        ckpt = best if args.checkpoint == "best" and best.exists() else latest_checkpoint(target)
        if ckpt is None:
            raise FileNotFoundError(f"{target}: no checkpoint found under checkpoints/")
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found: is {run_dir} a run directory?")
    from rlinf_user.config.schema import RunConfig

    cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(cfg_path))
    if args.overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(args.overrides))
    from rlinf_user.evaluation import checkpoint_spec
    from rlinf_user.runtime.rollout.fleet import Adapter, members

    fleet = members(cfg)
    names = [m.name for m in fleet]
    name = args.member or names[0]
    if name not in names:
        from rlinf_user.config.compose import ConfigError

        raise ConfigError(f"--member {name}: this run's fleet members are {', '.join(names)}")
    member = fleet[names.index(name)]
    envs = _envs(member.env, cfg, args.episodes)
    env = envs[0]
    trained = checkpoint_spec(ckpt) or EnvSpec.of_env(env)
    adapter = Adapter(EnvSpec.of_env(env), trained, member.index)
    policy, version = load_policy_from_checkpoint(ckpt, cfg, trained)
    where = f" on member {name}" if len(fleet) > 1 else ""
    console.print(f"evaluating [bold]{ckpt}[/] (policy version {version}){where} for {args.episodes} episodes")
    from rlinf_user.seeds import episode_seed

    split = getattr(args, "split", "test") or "test"
    offset = int(getattr(args, "episode_offset", 0) or 0)
    out = Path(args.out) if args.out else run_dir / "eval"
    stem = f"eval-{ckpt.stem}" + (f"-{name}" if len(fleet) > 1 else "")
    extra = {"checkpoint": str(ckpt), "policy_version": version, "member": name}
    with _kept_if_stopped(out, stem, cfg.env.control_hz, args, console, ckpt.name, extra):
        try:
            result = evaluate_policy(envs, policy, args.episodes, args.video_episodes, seed=episode_seed(split) + offset,
                                     adapter=adapter, split=split)  # fmt: skip
        finally:
            for e in envs:
                e.close()
    result.update(extra)
    return _report(result, out, stem, cfg.env.control_hz, args, console, ckpt.name)


def _eval_configured_policy(args, console) -> int:
    """A policy that needs no run: built from ``policy=...`` overrides (a pretrained VLA
    folder, an openpi server, a fresh model) and evaluated in ``--sim``/``--robot``."""
    import time

    from rlinf_user.config.compose import ConfigError, compose_config
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.evaluation import evaluate_policy
    from rlinf_user.policies.base import build_policy

    overrides = ([args.run] if args.run else []) + list(args.overrides)
    if args.run and "=" not in args.run:
        raise ConfigError(f"give either a run ({args.run}) or --sim/--robot with policy=..., not both")
    cfg = compose_config(overrides, sim=args.sim, robot=args.robot)
    out = Path(args.out) if args.out else Path(cfg.run_root) / f"eval-{cfg.policy.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    envs = _envs(cfg.env, cfg, args.episodes)
    env = envs[0]
    what = f"policy={cfg.policy.name}" + (f" ({cfg.policy.checkpoint})" if cfg.policy.get("checkpoint") else "")
    extra = {"policy": str(cfg.policy.name), "checkpoint": cfg.policy.get("checkpoint")}
    policy = None
    try:
        try:
            policy = build_policy(cfg.policy, EnvSpec.of_env(env))
        except ValueError as err:  # a checkpoint or option that does not fit: said, not a traceback
            raise ConfigError(f"policy={cfg.policy.name}: {err}") from err
        except PolicyUnavailable as err:  # its server is not there, or not a policy server
            raise PolicyUnavailable(f"policy={cfg.policy.name}: {err}") from err
        policy.eval()
        console.print(f"evaluating [bold]{what}[/] for {args.episodes} episodes")
        with _kept_if_stopped(out, "eval", cfg.env.control_hz, args, console, what, extra):
            result = evaluate_policy(envs, policy, args.episodes, args.video_episodes, split=getattr(args, "split", "test"))
    finally:
        for e in envs:
            e.close()
        if policy is not None and hasattr(policy, "close"):
            policy.close()
    result.update(extra, horizon=int(policy.horizon))
    return _report(result, out, "eval", cfg.env.control_hz, args, console, what)


@contextlib.contextmanager
def _kept_if_stopped(out: Path, stem: str, fps: float, args, console, title: str, extra: dict):
    """An evaluation the policy stopped (its server failed or went away) still writes the
    episodes it finished, marked incomplete, and the server's traceback beside them; the
    error then reaches the CLI's one line."""
    from rlinf_user.evaluation import EvaluationStopped

    try:
        yield
    except EvaluationStopped as stop:
        result = {**stop.result, **extra}
        _report(result, out, stem, fps, args, console, f"{title} (stopped)")
        where = out / f"{stem}.json"
        if stop.details:
            (out / f"{stem}.log").write_text(f"{stop}\n\n{stop.details}\n")
            where = f"{where}; the server's traceback: {out / f'{stem}.log'}"
        raise EvaluationStopped(f"{stop} ({result['episodes']} finished episodes kept in {where})", result) from stop


def _envs(env_cfg, cfg, episodes: int) -> list:
    """The env episodes run on, and ``eval_envs - 1`` more beside it (a sim's only)."""
    from rlinf_user.env.registry import make_env
    from rlinf_user.evaluation import eval_env_count
    from rlinf_user.seeds import EVAL_ENV_OFFSET

    n = eval_env_count(env_cfg, cfg.get("eval_envs", 1), episodes)
    return [make_env(env_cfg, seed=cfg.seed + EVAL_ENV_OFFSET + i) for i in range(n)]


def _report(result, out: Path, stem: str, fps: float, args, console, title: str) -> int:
    from rlinf_user.evaluation import describe_eval, write_video
    from rlinf_user.rundir import write_json

    out.mkdir(parents=True, exist_ok=True)
    video = out / f"{stem}.mp4"
    wrote = write_video(result.pop("frames"), video, fps=fps)
    result["video"] = str(video) if wrote else None
    write_json(out / f"{stem}.json", result)
    table = Table(title=f"evaluation of {title}", show_header=False)
    table.add_row("episodes", str(result["episodes"]) + ("" if result.get("complete", True) else " (stopped early)"))
    if result.get("interrupted"):
        table.add_row("interrupted and run again", f"{len(result['interrupted'])} (the policy server restarted)")
    table.add_row(f"success rate (95% interval, {result.get('split', 'test')} initial states)", describe_eval(result))
    table.add_row("mean return", f"{result['mean_return']:.3f}")
    if args.video_episodes > 0:
        table.add_row("video", result["video"] or "(no frames: backend cannot render)")
    console.print(table)
    return 0
