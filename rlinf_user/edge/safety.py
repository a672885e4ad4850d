"""Safety on the edge: whatever the policy sends, only checked targets reach the arm.

The normalised contract action ``[dx, dy, dz, drx, dry, drz, gripper]`` becomes an
absolute TCP target here, on the robot PC:

* NaN/Inf or a wrong shape: refused (:class:`UnsafeCommand`), nothing is sent to the arm.
* Values outside [-1, 1]: clipped, and the breach is logged with the offending command.
* Translation: ``measured position + a[:3] * max_translation`` (metres, base frame), then
  clipped into the workspace box ``[workspace_low, workspace_high]``.
* Rotation: ``R(a[3:6] * max_rotation) * measured orientation`` (axis-angle in the base
  frame), then limited to ``max_tilt`` radians from the home orientation.
* Gripper: closed when ``a[6] > gripper_threshold``, open when below ``-gripper_threshold``,
  unchanged in between (hysteresis, so noise does not chatter the fingers).

Targets are built from the *measured* pose, so a blocked arm never accumulates a target
far from where it is. Every breach is counted and logged; the control loop reports them
in its telemetry.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
from scipy.spatial.transform import Rotation

from rlinf_user.edge.arm import ArmCommand, ArmState

log = logging.getLogger(__name__)


class UnsafeCommand(ValueError):
    """A command refused outright (nothing was sent to the robot)."""


@dataclasses.dataclass
class SafetyConfig:
    workspace_low: Sequence[float] = (0.25, -0.35, 0.02)  # metres, base frame
    workspace_high: Sequence[float] = (0.75, 0.35, 0.60)
    max_translation: float = 0.02  # metres per policy step at |a| = 1
    max_rotation: float = 0.1  # radians per policy step at |a| = 1
    max_tilt: float = 0.8  # radians from the home orientation
    gripper_threshold: float = 0.5
    watchdog_periods: int = 2  # hold the arm after this many periods without a command

    def __post_init__(self) -> None:
        lo, hi = np.asarray(self.workspace_low, float), np.asarray(self.workspace_high, float)
        if lo.shape != (3,) or hi.shape != (3,) or np.any(lo >= hi):
            raise ValueError(
                f"workspace box must be 3 lows below 3 highs, got {list(lo)} .. {list(hi)}"
            )
        if self.max_translation <= 0 or self.max_rotation < 0 or self.watchdog_periods < 1:
            raise ValueError("max_translation > 0, max_rotation >= 0, watchdog_periods >= 1")


@dataclasses.dataclass
class Breach:
    kind: str  # "clip" | "workspace" | "tilt" | "refused"
    detail: str


class SafetyFilter:
    def __init__(self, cfg: SafetyConfig, home_quaternion: np.ndarray | None = None):
        self.cfg = cfg
        self.low = np.asarray(cfg.workspace_low, dtype=np.float64)
        self.high = np.asarray(cfg.workspace_high, dtype=np.float64)
        self.home = Rotation.from_quat(home_quaternion) if home_quaternion is not None else None
        self.gripper_closed = False
        self.counts: dict[str, int] = {"clip": 0, "workspace": 0, "tilt": 0, "refused": 0}

    def set_home(self, quaternion: np.ndarray) -> None:
        self.home = Rotation.from_quat(quaternion)

    def check_action(self, action: object) -> tuple[np.ndarray, list[Breach]]:
        """Refuse non-finite / mis-shaped actions, clip the rest into [-1, 1]."""
        try:
            a = np.asarray(action, dtype=np.float64)
        except (TypeError, ValueError) as err:
            self._refuse(f"action is not numeric: {err}")
        if a.shape != (7,):
            self._refuse(f"action must have shape (7,), got {a.shape}")
        if not np.all(np.isfinite(a)):
            self._refuse(f"action contains NaN/Inf: {a.tolist()}")
        breaches = []
        if np.any(np.abs(a) > 1.0):
            breaches.append(Breach("clip", f"action {np.round(a, 4).tolist()} outside [-1, 1]"))
            a = np.clip(a, -1.0, 1.0)
        return a, breaches

    def command(self, action: object, state: ArmState) -> tuple[ArmCommand, list[Breach]]:
        """The checked absolute target for ``action`` applied at the measured ``state``."""
        a, breaches = self.check_action(action)
        cfg = self.cfg
        pos = np.asarray(state.tcp_position, dtype=np.float64) + a[:3] * cfg.max_translation
        clipped = np.clip(pos, self.low, self.high)
        if np.any(np.abs(clipped - pos) > 1e-9):
            breaches.append(
                Breach(
                    "workspace",
                    f"target {np.round(pos, 4).tolist()} outside the workspace box "
                    f"{self.low.tolist()}..{self.high.tolist()}, clipped to "
                    f"{np.round(clipped, 4).tolist()} (action {np.round(a, 3).tolist()})",
                )
            )
        rot = Rotation.from_rotvec(a[3:6] * cfg.max_rotation) * Rotation.from_quat(
            state.tcp_quaternion
        )
        if self.home is not None:
            rel = (self.home.inv() * rot).as_rotvec()
            tilt = float(np.linalg.norm(rel))
            if tilt > cfg.max_tilt:
                breaches.append(
                    Breach("tilt", f"orientation {tilt:.3f} rad from home > max_tilt "
                           f"{cfg.max_tilt} (action {np.round(a, 3).tolist()})")  # fmt: skip
                )
                rot = self.home * Rotation.from_rotvec(rel * (cfg.max_tilt / tilt))
        if a[6] > cfg.gripper_threshold:
            self.gripper_closed = True
        elif a[6] < -cfg.gripper_threshold:
            self.gripper_closed = False
        for b in breaches:
            self.counts[b.kind] += 1
            log.warning("safety %s: %s", b.kind, b.detail)
        return ArmCommand(clipped, rot.as_quat(), self.gripper_closed), breaches

    def _refuse(self, why: str) -> None:
        self.counts["refused"] += 1
        log.error("safety refused a command: %s", why)
        raise UnsafeCommand(why)
