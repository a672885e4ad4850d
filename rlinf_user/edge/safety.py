"""Safety on the edge: whatever the policy sends, only checked targets reach the arm.

The normalised contract action ``[dx, dy, dz, drx, dry, drz, gripper]`` becomes an
absolute TCP target here, on the robot PC:

* NaN/Inf or a wrong shape: refused (:class:`UnsafeCommand`), nothing is sent to the arm.
* Values outside [-1, 1]: clipped, and the breach is logged with the offending command.
* Translation: ``base + a[:3] * max_translation`` (metres, base frame). Rotation:
  ``R(a[3:6] * max_rotation) * base`` (axis-angle about base-frame axes, applied at the TCP).
* The base (``target_mode``):

  - ``commanded`` (default): the previous *target*. Deltas integrate, so the arm goes where
    the sum of the commands says even though the impedance controller has not covered a
    step by the next tick (a 10 cm square drawn at 0.1 m/s comes out 10 cm wide). The lead
    of the target over the measured pose is bounded (``max_lead`` metres,
    ``max_lead_rotation`` radians): beyond it the target is pulled back toward the measured
    pose, so a blocked arm never winds up. A hold (watchdog, ``hold``, reset) restarts the
    integration at the measured pose.
  - ``measured``: the measured pose, as before: what the controller has not covered by the
    next tick, and any sag, is dropped (at 0.1 m/s the arm covers about 57% of each step at
    10 Hz and 26% at 20 Hz on franky-sim).

* Workspace: the target is clipped into the box shrunk by ``workspace_margin`` (the
  controller's measured overshoot), and within ``brake_distance`` of a face its lead toward
  that face is at most ``brake_gain`` times the remaining distance, so the arm slows down as
  it nears a face instead of hitting it at speed. The measured pose is checked against the
  box itself every tick by :meth:`SafetyFilter.check_measured` (``box_tolerance``).
* Near a face, position comes before orientation: the orientation target may lead the
  measured orientation by ``max_lead_rotation`` only ``brake_distance`` inside the margin;
  closer it shrinks linearly to ``face_lead_rotation`` at the margin and to none at the face
  (both target modes). An impedance controller trades position error for orientation error
  when the orientation target runs ahead (most near a stretched arm's reach): without this
  bound, saturated rotation at a face dragged franky-sim's TCP up to 10.9 mm outside the box
  while its position target stayed 10 mm or more inside (``benchmarks/results/EDGE_BOX.md``).
* Orientation: limited to ``max_tilt`` radians from the home orientation.
* Gripper: closed when ``a[6] > gripper_threshold``, open when below ``-gripper_threshold``,
  unchanged in between (hysteresis, so noise does not chatter the fingers).

Every breach is counted and logged; the control loop reports them in its telemetry.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
from scipy.spatial.transform import Rotation

from rlinf_user.robots.arm import ArmCommand, ArmState

log = logging.getLogger(__name__)


TARGET_MODES = ("commanded", "measured")


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
    target_mode: str = "commanded"  # "commanded" (deltas integrate) | "measured"
    max_lead: float = 0.03  # m: commanded target at most this far from the measured TCP
    max_lead_rotation: float = 0.2  # rad
    workspace_margin: float = 0.01  # m: targets stay this far inside the box
    brake_distance: float = 0.05  # m from a face where the approach slows down
    brake_gain: float = 0.5  # lead toward a face <= gain x remaining distance
    box_tolerance: float = 0.002  # m: a measured TCP further outside the box is a safety event
    face_lead_rotation: float = 0.05  # rad: the rotational lead allowed at the inner box's faces

    def __post_init__(self) -> None:
        if self.target_mode not in TARGET_MODES:
            raise ValueError(f"target_mode must be one of {TARGET_MODES}, got {self.target_mode!r}")
        for name in ("max_lead", "max_lead_rotation", "workspace_margin", "brake_distance", "brake_gain",
                     "box_tolerance"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        lo, hi = np.asarray(self.workspace_low, float), np.asarray(self.workspace_high, float)
        if lo.shape != (3,) or hi.shape != (3,) or np.any(lo >= hi):
            raise ValueError(
                f"workspace box must be 3 lows below 3 highs, got {list(lo)} .. {list(hi)}"
            )
        if not 0 <= self.face_lead_rotation <= self.max_lead_rotation:
            raise ValueError(f"face_lead_rotation must be in [0, max_lead_rotation={self.max_lead_rotation}], "
                             f"got {self.face_lead_rotation}")  # fmt: skip
        if self.max_translation <= 0 or self.max_rotation < 0 or self.watchdog_periods < 1:
            raise ValueError("max_translation > 0, max_rotation >= 0, watchdog_periods >= 1")
        if np.any(hi - lo <= 2 * self.workspace_margin):
            raise ValueError(f"workspace_margin={self.workspace_margin} leaves no room in the box "
                             f"{list(lo)} .. {list(hi)}")  # fmt: skip


@dataclasses.dataclass
class Breach:
    kind: str  # "clip" | "workspace" | "tilt" | "refused" | "lead" | "box_exit"
    detail: str


class SafetyFilter:
    def __init__(self, cfg: SafetyConfig, home_quaternion: np.ndarray | None = None):
        self.cfg = cfg
        self.low = np.asarray(cfg.workspace_low, dtype=np.float64)
        self.high = np.asarray(cfg.workspace_high, dtype=np.float64)
        self.home = Rotation.from_quat(home_quaternion) if home_quaternion is not None else None
        self.inner_low = self.low + cfg.workspace_margin
        self.inner_high = self.high - cfg.workspace_margin
        self.gripper_closed = False
        self.counts: dict[str, int] = {"clip": 0, "workspace": 0, "tilt": 0, "refused": 0, "lead": 0,
                                       "box_exit": 0}  # fmt: skip
        self.worst_exit = 0.0  # m, the furthest the measured TCP has been outside the box
        self.target_pos: np.ndarray | None = None  # the last commanded target (commanded mode)
        self.target_rot: Rotation | None = None

    def set_home(self, quaternion: np.ndarray) -> None:
        self.home = Rotation.from_quat(quaternion)
        self.restart()

    def restart(self) -> None:
        """Integrate the next command from the measured pose (after a hold or a reset)."""
        self.target_pos = self.target_rot = None

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
        measured_pos = np.asarray(state.tcp_position, dtype=np.float64)
        measured_rot = Rotation.from_quat(state.tcp_quaternion)
        integrate = cfg.target_mode == "commanded" and self.target_pos is not None
        base_pos = self.target_pos if integrate else measured_pos
        base_rot = self.target_rot if integrate else measured_rot
        pos = base_pos + a[:3] * cfg.max_translation
        rot = Rotation.from_rotvec(a[3:6] * cfg.max_rotation) * base_rot
        if cfg.target_mode == "commanded":
            pos, rot = self._bound_lead(pos, rot, measured_pos, measured_rot, a, breaches)
        pos = self._brake(pos, measured_pos)
        clipped = np.clip(pos, self.inner_low, self.inner_high)
        if np.any(np.abs(clipped - pos) > 1e-9):
            breaches.append(
                Breach(
                    "workspace",
                    f"target {np.round(pos, 4).tolist()} outside the workspace box "
                    f"{self.low.tolist()}..{self.high.tolist()} (margin {cfg.workspace_margin} m), "
                    f"clipped to {np.round(clipped, 4).tolist()} (action {np.round(a, 3).tolist()})",
                )
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
        rot = self._position_first(rot, measured_pos, measured_rot)
        if a[6] > cfg.gripper_threshold:
            self.gripper_closed = True
        elif a[6] < -cfg.gripper_threshold:
            self.gripper_closed = False
        for b in breaches:
            self.counts[b.kind] += 1
            if b.kind != "lead":  # the lead bound acts on every step of a blocked arm: counted only
                log.warning("safety %s: %s", b.kind, b.detail)
        self.target_pos, self.target_rot = clipped, rot
        return ArmCommand(clipped, rot.as_quat(), self.gripper_closed), breaches

    def _bound_lead(self, pos, rot, measured_pos, measured_rot, a, breaches):
        """Pull a target that leads the measured pose too far back toward it."""
        cfg = self.cfg
        lead = pos - measured_pos
        dist = float(np.linalg.norm(lead))
        pulled = False
        if dist > cfg.max_lead:
            pos = measured_pos + lead * (cfg.max_lead / dist)
            pulled = True
        rel = (rot * measured_rot.inv()).as_rotvec()
        angle = float(np.linalg.norm(rel))
        if angle > cfg.max_lead_rotation:
            rot = Rotation.from_rotvec(rel * (cfg.max_lead_rotation / angle)) * measured_rot
            pulled = True
        if pulled:
            breaches.append(Breach("lead", f"target {dist * 1e3:.1f} mm / {angle:.3f} rad ahead of the "
                                   f"measured pose, pulled back (action {np.round(a, 3).tolist()})"))  # fmt: skip
        return pos, rot

    def _position_first(self, rot: Rotation, measured_pos: np.ndarray, measured_rot: Rotation) -> Rotation:
        """Near a face, position comes before orientation: the rotational lead (what the
        orientation target may be ahead of the measured orientation) shrinks with the room
        left to the nearest face of the box, from ``max_lead_rotation`` at ``brake_distance``
        inside the inner box to ``face_lead_rotation`` at the inner box and to none at the box."""
        cfg = self.cfg
        room = float(min(np.min(measured_pos - self.low), np.min(self.high - measured_pos)))  # to the box
        margin = cfg.workspace_margin
        if room >= margin + cfg.brake_distance:  # (also when brake_distance is 0)
            cap = cfg.max_lead_rotation
        elif room >= margin:
            frac = (room - margin) / cfg.brake_distance
            cap = cfg.face_lead_rotation + (cfg.max_lead_rotation - cfg.face_lead_rotation) * frac
        else:
            cap = cfg.face_lead_rotation * max(0.0, room) / margin if margin > 0 else 0.0
        rel = (rot * measured_rot.inv()).as_rotvec()
        angle = float(np.linalg.norm(rel))
        if angle > cap:
            rot = Rotation.from_rotvec(rel * (cap / angle)) * measured_rot
        return rot

    def _brake(self, pos: np.ndarray, measured: np.ndarray) -> np.ndarray:
        """Near a face, the target's lead toward it shrinks with the remaining distance."""
        cfg = self.cfg
        if cfg.brake_distance <= 0:
            return pos
        pos = pos.copy()
        to_high = self.inner_high - measured
        to_low = measured - self.inner_low
        up = (pos > measured) & (to_high < cfg.brake_distance)
        pos[up] = np.minimum(pos[up], measured[up] + cfg.brake_gain * np.maximum(to_high[up], 0.0))
        down = (pos < measured) & (to_low < cfg.brake_distance)
        pos[down] = np.maximum(pos[down], measured[down] - cfg.brake_gain * np.maximum(to_low[down], 0.0))
        return pos

    def hold_inside(self, state: ArmState) -> ArmCommand:
        """Hold at the measured pose pulled back toward the box (after a box exit), at most
        ``max_lead`` per call, so a large exit never commands a jump."""
        measured = np.asarray(state.tcp_position, dtype=np.float64)
        back = np.clip(measured, self.inner_low, self.inner_high) - measured
        dist = float(np.linalg.norm(back))
        pos = measured + (back * (self.cfg.max_lead / dist) if dist > self.cfg.max_lead else back)
        self.target_pos, self.target_rot = pos, Rotation.from_quat(state.tcp_quaternion)
        return ArmCommand(pos, self.target_rot.as_quat(), self.gripper_closed)

    def check_measured(self, state: ArmState) -> Breach | None:
        """A measured TCP outside the box by more than ``box_tolerance`` is a safety event."""
        pos = np.asarray(state.tcp_position, dtype=np.float64)
        outside = float(np.max(np.maximum(self.low - pos, 0.0) + np.maximum(pos - self.high, 0.0)))
        self.worst_exit = max(self.worst_exit, outside)
        if outside <= self.cfg.box_tolerance:
            return None
        self.counts["box_exit"] += 1
        return Breach("box_exit", f"measured TCP {np.round(pos, 4).tolist()} is {outside * 1e3:.1f} mm outside "
                      f"the workspace box {self.low.tolist()}..{self.high.tolist()}: arm held")  # fmt: skip

    def _refuse(self, why: str) -> None:
        self.counts["refused"] += 1
        log.error("safety refused a command: %s", why)
        raise UnsafeCommand(why)
