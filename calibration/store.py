"""Calibration results on disk: ``<root>/<robot>/<name>.yaml``, one file per result, with
the date, the residuals and the camera serial it belongs to.

Writes are atomic (a temporary file in the same folder, fsynced, then renamed), so a
failed or interrupted calibration never leaves a half-written file in place of a good
one. Loading checks the camera serial: a calibration made for another camera is refused.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import yaml


class CalibrationMismatch(ValueError):
    """A calibration file that does not belong to this camera or robot."""


def calibration_path(root: str | os.PathLike, robot: str, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"calibration name {name!r}: a plain file name such as wrist or workspace")
    return Path(root) / robot / f"{name}.yaml"


def resolve(ref: str, root: str | os.PathLike, robot: str) -> Path:
    """A config's reference to a calibration: a path to a ``.yaml`` file, or a name under
    ``<root>/<robot>/``."""
    return Path(ref) if ref.endswith((".yaml", ".yml")) else calibration_path(root, robot, ref)


def save(path: str | os.PathLike, kind: str, data: dict[str, Any], camera_serial: str | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"kind": kind, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "camera_serial": camera_serial, **data}  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load(path: str | os.PathLike, kind: str | None = None, camera_serial: str | None = None) -> dict[str, Any]:
    """The calibration in ``path``; refuses another kind or another camera's serial."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no calibration at {path}: run `rlinf-user calibrate` to make it")
    doc = yaml.safe_load(path.read_text()) or {}
    if kind is not None and doc.get("kind") != kind:
        raise CalibrationMismatch(f"{path} holds a {doc.get('kind')!r} calibration, not {kind!r}")
    have = doc.get("camera_serial")
    if camera_serial is not None and have is not None and str(have) != str(camera_serial):
        raise CalibrationMismatch(
            f"{path} was made for camera serial {have}, but this camera is {camera_serial}: "
            "calibrate this camera (rlinf-user calibrate ...) or point the config at its own file"
        )
    return doc
