"""The arm driver interface the edge control loop drives (a Franka via franky, ...).

Poses are in the robot base frame: positions in metres, orientations as unit quaternions
``[x, y, z, w]``. The driver tracks targets with its own high-rate controller (franky's
1 kHz Cartesian impedance loop runs in C++); the edge loop only states targets at the
policy rate, after the safety layer has checked them.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class ArmState:
    """One reading of the arm, stamped with ``time.monotonic()`` when it was read."""

    stamp: float
    tcp_position: np.ndarray  # (3,) metres, base frame
    tcp_quaternion: np.ndarray  # (4,) [x, y, z, w], base frame
    tcp_velocity: np.ndarray  # (6,) linear m/s + angular rad/s, base frame
    joint_positions: np.ndarray  # (7,) radians
    gripper: float  # 0 fully open .. 1 fully closed (normalised width)
    error: str | None = None  # the driver's current error, None when healthy

    def proprio(self) -> np.ndarray:
        """The proprioceptive vector the env contract exposes (14 floats, see PROPRIO_NAMES)."""
        return np.concatenate(
            [self.tcp_position, self.tcp_quaternion, self.tcp_velocity, [self.gripper]]
        ).astype(np.float32)


PROPRIO_NAMES = (
    "tcp_x", "tcp_y", "tcp_z", "tcp_qx", "tcp_qy", "tcp_qz", "tcp_qw",
    "tcp_vx", "tcp_vy", "tcp_vz", "tcp_wx", "tcp_wy", "tcp_wz", "gripper",
)  # fmt: skip


@dataclasses.dataclass
class ArmCommand:
    """A checked target: where the TCP should be and what the gripper should do."""

    tcp_position: np.ndarray  # (3,)
    tcp_quaternion: np.ndarray  # (4,) [x, y, z, w]
    gripper_closed: bool


class ArmError(RuntimeError):
    """The arm refused or lost a command (reflex, network, limits)."""


class ArmDriver(abc.ABC):
    """What the edge control loop needs from an arm. Implementations own the hardware."""

    @abc.abstractmethod
    def connect(self) -> None:
        """Open the connection; raise :class:`ArmError` with the reason if it cannot."""

    @abc.abstractmethod
    def home(self) -> ArmState:
        """Blocking move to the configured reset pose, open the gripper, start tracking."""

    @abc.abstractmethod
    def track(self, command: ArmCommand) -> None:
        """Non-blocking: make ``command`` the impedance target (returns immediately)."""

    @abc.abstractmethod
    def read(self) -> ArmState:
        """The latest state (non-blocking, cheap)."""

    @abc.abstractmethod
    def hold(self) -> None:
        """Stop where the arm is now: target := current measured pose. Never moves the gripper."""

    @abc.abstractmethod
    def recover(self) -> bool:
        """Try automatic error recovery; True when the arm accepts commands again."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop all motion now (explicit stop command)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop and release the hardware."""

    def versions(self) -> dict[str, Any]:
        """Library / server versions for ``doctor`` and the protocol handshake."""
        return {}
