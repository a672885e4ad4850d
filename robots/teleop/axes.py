"""Axis maps from a device's own frame to the robot base frame, written as strings.

``["-y", "-x", "-z"]`` means base x = -device y, base y = -device x, base z = -device z.
The same map applies to rotations (a proper rotation keeps axial vectors' signs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

AXES = {"x": 0, "y": 1, "z": 2}


def axis_matrix(spec: Sequence[str]) -> np.ndarray:
    if len(spec) != 3:
        raise ValueError(f"an axis map needs 3 entries like ['-y', '-x', '-z'], got {list(spec)}")
    m = np.zeros((3, 3), np.float32)
    used = set()
    for row, s in enumerate(spec):
        s = str(s).strip()
        sign = -1.0 if s.startswith("-") else 1.0
        name = s.lstrip("+-")
        if name not in AXES:
            raise ValueError(f"axis map entry {s!r}: expected x, y or z with an optional sign")
        if name in used:
            raise ValueError(f"axis map {list(spec)} uses {name!r} twice")
        used.add(name)
        m[row, AXES[name]] = sign
    return m


def deadzone(v: np.ndarray, dz: float) -> np.ndarray:
    """Zero below ``dz`` and rescale the rest so output is continuous and reaches 1."""
    mag = np.abs(v)
    out = np.where(mag <= dz, 0.0, np.sign(v) * (mag - dz) / max(1e-9, 1.0 - dz))
    return np.clip(out, -1.0, 1.0).astype(np.float32)
