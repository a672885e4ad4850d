"""Run directories: resolved config, log file, TensorBoard events, checkpoints, eval."""

from __future__ import annotations

import datetime as _dt
import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def default_run_name(cfg) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    where = cfg.env.backend if cfg.env.kind == "robot" else f"{cfg.env.backend}-{cfg.env.task}"
    return f"{stamp}-{where}-{cfg.algo.name}-s{cfg.seed}"


def create_run_dir(cfg, folders: tuple[str, ...] = ("checkpoints", "tb", "eval", "buffer")) -> Path:
    """Make (or, on resume, reopen) the run directory with ``folders`` and save the
    resolved config."""
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if not (run_dir / "config.yaml").exists():
            raise FileNotFoundError(f"resume={cfg.resume}: not a run directory (no config.yaml)")
    else:
        run_dir = Path(cfg.run_root) / (cfg.run_name or default_run_name(cfg))
        if (run_dir / "config.yaml").exists():
            raise FileExistsError(
                f"{run_dir} already holds a run; pick another run_name or continue it with resume={run_dir}"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    for sub in folders:
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    name = "config.resumed.yaml" if cfg.resume else "config.yaml"
    OmegaConf.save(cfg, run_dir / name, resolve=True)
    return run_dir


def attach_log_file(run_dir: Path, level: int = logging.INFO) -> logging.Handler:
    handler = logging.FileHandler(run_dir / "train.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(level)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > level or root.level == logging.NOTSET:
        root.setLevel(level)
    return handler


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
