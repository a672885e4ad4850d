"""The Franka arm driver on franky (libfranka): Cartesian impedance tracking at 1 kHz in C++.

Frames and units: every pose is the end effector (``O_T_EE``: flange + the EE transform set in
Desk) in the robot base frame ``O``; positions in metres, orientations as unit quaternions
``[x, y, z, w]``, twists as ``[vx, vy, vz, wx, wy, wz]`` in m/s and rad/s (base frame), joint
angles in radians, stiffness in N/m and Nm/rad, damping in Ns/m and Nms/rad, forces in N,
torques in Nm.

After :meth:`FrankyArm.home` the arm runs franky's ``CartesianImpedanceTracker``: a client-side
Cartesian impedance law computed by franky's 1 kHz real-time loop (C++, no Python in the loop)
that reads the latest reference every cycle. :meth:`FrankyArm.track` only publishes a new
reference (a few microseconds). franky is imported lazily, so this module imports without it.

Use one thread per driver: the methods are not synchronised with each other.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import re
import time
from typing import Any

import numpy as np

from rlinf_user.registry import Registry
from rlinf_user.robots.arm import ArmCommand, ArmDriver, ArmError, ArmState

from .grippers import Gripper, call_with_timeout

logger = logging.getLogger(__name__)

#: grippers by ``robot.gripper`` (``none``: no gripper): a builder ``(driver config) -> Gripper``
GRIPPERS = Registry("gripper", {
    "franka_hand": "rlinf_user.robots.franka.grippers:FrankaHand.from_driver_config",
    "robotiq": "rlinf_user.robots.franka.grippers:RobotiqGripper.from_driver_config",
}, entry_points="rlinf_user.grippers")  # fmt: skip


@dataclasses.dataclass
class FrankaDriverConfig:
    """Everything :class:`FrankyArm` needs; YAML overrides these defaults field by field."""

    ip: str = "172.16.0.2"  # the robot's FCI address (Franka's factory default)
    realtime: bool = True  # False -> RealtimeConfig.Ignore (no PREEMPT_RT kernel, simulators)
    connect_timeout_s: float = 10.0  # give up on an unresponsive robot after this long
    relative_dynamics_factor: float = 0.2  # scales velocity/acceleration/jerk limits of motions
    # Cartesian impedance of the tracking controller.
    translational_stiffness: float = 2000.0  # N/m
    rotational_stiffness: float = 150.0  # Nm/rad
    # Damping as a multiple of franky's "critical" 2*sqrt(stiffness), which is critical only
    # for a unit mass: the arm's task-space mass is a few kg, so 1.0 under-damps it.
    damping_ratio: float = 1.5
    damping: list[float] | None = None  # explicit [x, y, z, rx, ry, rz] damping; wins over ratio
    # Error clips bound the spring force when the target jumps away (stiffness x clip).
    translational_error_clip: float = 0.03  # m, per axis
    rotational_error_clip: float = 0.2  # rad, per axis
    posture_stiffness: float = 5.0  # Nm/rad, nullspace pull towards reset_joints; 0 disables
    max_delta_tau: float = 1.0  # Nm per 1 ms cycle: torque rate limit of the tracker
    # libfranka collision reflex thresholds (contact above lower, reflex above upper).
    collision_lower_torque: float = 20.0  # Nm, all joints
    collision_upper_torque: float = 40.0  # Nm
    collision_lower_force: float = 20.0  # N / Nm, all Cartesian axes
    collision_upper_force: float = 40.0  # N / Nm
    reset_joints: list[float] = dataclasses.field(
        default_factory=lambda: [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]
    )  # rad, homing target
    home_timeout_s: float = 30.0  # a homing motion that has not finished by then is stopped
    home_gripper_timeout_s: float = 5.0  # how long home() waits for the gripper to open
    stop_timeout_s: float = 3.0  # how long stop() waits for the preempted motion to end
    gripper: str = "franka_hand"  # "franka_hand" | "robotiq" | "none"
    gripper_speed: float = 0.1  # m/s finger speed
    gripper_force: float = 40.0  # N grasp force
    gripper_grasp_epsilon_inner: float = 0.005  # m (Franka Hand grasp tolerance inwards)
    gripper_max_width: float = 0.08  # m, used until the Franka Hand reports its homed width
    gripper_poll_hz: float = 50.0  # finger state polling rate behind read()
    robotiq_port: str = ""  # serial device of the Robotiq RS485 adapter
    robotiq_unit_id: int = 9
    robotiq_baudrate: int = 115200
    robotiq_timeout_s: float = 5.0  # activation / single move timeout

    def __post_init__(self) -> None:
        if len(self.reset_joints) != 7:
            raise ValueError(f"reset_joints needs 7 values, got {len(self.reset_joints)}")
        if self.gripper != "none" and self.gripper not in GRIPPERS:
            raise ValueError(f"gripper must be one of {', '.join([*GRIPPERS.names(), 'none'])}, got {self.gripper!r}")
        if self.damping is not None and len(self.damping) != 6:
            raise ValueError("damping needs 6 values [x, y, z, rx, ry, rz]")


def _franky() -> Any:
    try:
        import franky
    except ImportError as exc:
        raise ArmError("the Franka driver needs franky: pip install 'rlinf-user[franka]'") from exc
    return franky


def libfranka_version() -> str | None:
    """The libfranka bundled with the installed franky wheel (from its shared-library name)."""
    try:
        files = importlib.metadata.files("franky-control") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for path in files:
        match = re.search(r"libfranka[^/]*\.so\.(\d+\.\d+\.\d+)$", str(path))
        if match:
            return match.group(1)
    return None


class FrankyArm(ArmDriver):
    """A Franka Panda / FR3 through franky. See the module docstring for frames and units."""

    def __init__(self, config: FrankaDriverConfig) -> None:
        self.config = config
        self._robot: Any = None
        self._gripper: Gripper | None = None
        self._tracker: Any = None
        self._gripper_closed: bool | None = None
        self._error: str | None = None
        self._last_quat: np.ndarray | None = None
        self._fk: Any = None  # the franky module, once connected

    # ------------------------------------------------------------------ connection

    def connect(self) -> None:
        cfg = self.config
        franky = self._fk = _franky()
        if self._robot is not None:
            self.close()
        realtime = franky.RealtimeConfig.Enforce if cfg.realtime else franky.RealtimeConfig.Ignore
        try:
            self._robot = call_with_timeout(
                lambda: franky.Robot(
                    cfg.ip,
                    relative_dynamics_factor=cfg.relative_dynamics_factor,
                    realtime_config=realtime,
                ),
                cfg.connect_timeout_s,
                f"connecting to the Franka at {cfg.ip}",
            )
        except TimeoutError as exc:
            raise ArmError(
                f"Franka at {cfg.ip} is unreachable: {exc} (is FCI enabled and the brakes open?)"
            ) from exc
        except Exception as exc:  # franky.NetworkException, IncompatibleVersionException, ...
            raise ArmError(
                f"cannot connect to the Franka at {cfg.ip}: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            if self._robot.has_errors:
                logger.warning("Franka at %s reports errors on connect; recovering", cfg.ip)
            self._robot.recover_from_errors()
            self._robot.set_collision_behavior(
                cfg.collision_lower_torque,
                cfg.collision_upper_torque,
                cfg.collision_lower_force,
                cfg.collision_upper_force,
            )
            self._gripper = self._make_gripper()
        except Exception as exc:
            self._robot = None
            reason = f"{type(exc).__name__}: {exc}"
            raise ArmError(f"Franka at {cfg.ip}: setup failed: {reason}") from exc
        self._error = None
        logger.info("connected to the Franka at %s (gripper: %s)", cfg.ip, cfg.gripper)

    def _make_gripper(self) -> Gripper | None:
        cfg = self.config
        return None if cfg.gripper == "none" else GRIPPERS.get(cfg.gripper)(cfg)

    def _require_robot(self) -> Any:
        if self._robot is None:
            raise ArmError("the Franka driver is not connected: call connect() first")
        return self._robot

    # ------------------------------------------------------------------ motions

    def home(self) -> ArmState:
        robot = self._require_robot()
        cfg = self.config
        self._end_tracking()
        if self._gripper is not None:
            self._gripper.open()  # opens while the arm moves
            self._gripper_closed = False
        try:
            robot.move(self._fk.JointMotion(list(cfg.reset_joints)), asynchronous=True)
            finished = robot.join_motion(timeout=cfg.home_timeout_s)
        except Exception as exc:  # ControlException (reflex, limits), network loss
            self._error = f"{type(exc).__name__}: {exc}"
            raise ArmError(f"homing failed: {self._error}") from exc
        if not finished:
            self.stop()
            raise ArmError(f"homing did not finish within {cfg.home_timeout_s:g} s")
        if self._gripper is not None and not self._gripper.wait(cfg.home_gripper_timeout_s):
            logger.warning("gripper still opening after %.1f s", cfg.home_gripper_timeout_s)
        self._start_tracking()
        return self.read()

    def _start_tracking(self) -> None:
        cfg = self.config
        franky = self._fk
        damping = None
        if cfg.damping is not None:
            damping = np.asarray(cfg.damping, dtype=float)
        elif cfg.damping_ratio != 1.0:
            k = np.repeat([cfg.translational_stiffness, cfg.rotational_stiffness], 3)
            damping = cfg.damping_ratio * 2.0 * np.sqrt(k)
        posture = None
        if cfg.posture_stiffness > 0.0:
            posture = franky.PostureTask(
                np.asarray(cfg.reset_joints, dtype=float), float(cfg.posture_stiffness)
            )
        try:
            self._tracker = franky.CartesianImpedanceTracker(
                self._robot,
                translational_stiffness=cfg.translational_stiffness,
                rotational_stiffness=cfg.rotational_stiffness,
                damping=damping,
                translational_error_clip=np.full(3, cfg.translational_error_clip),
                rotational_error_clip=np.full(3, cfg.rotational_error_clip),
                max_delta_tau=cfg.max_delta_tau,
                posture_task=posture,
            )
        except Exception as exc:
            self._tracker = None
            reason = f"{type(exc).__name__}: {exc}"
            raise ArmError(f"cannot start impedance tracking: {reason}") from exc
        self._error = None

    def _end_tracking(self) -> None:
        """Stop the tracker gracefully (torque ramp to a damped stop), swallowing its fault."""
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        try:
            tracker.stop()
        except Exception as exc:  # it may have faulted already; the next motion recovers
            logger.info("tracker ended with: %s", exc)

    def _tracking_lost(self) -> str:
        """Why the tracker is no longer in control (reads and clears franky's stored fault)."""
        try:
            self._robot.poll_motion()
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"
        return self._error or "tracking motion ended"

    def track(self, command: ArmCommand) -> None:
        tracker = self._tracker
        if tracker is None or not self._robot.is_in_control:
            reason = "stopped or never homed" if tracker is None else self._tracking_lost()
            raise ArmError(f"the arm is not tracking ({reason}); call home() or recover()")
        position = np.asarray(command.tcp_position, dtype=float)
        quat = np.asarray(command.tcp_quaternion, dtype=float)
        norm = float(np.linalg.norm(quat))
        if position.shape != (3,) or quat.shape != (4,) or not np.isfinite(norm) or norm < 1e-6:
            raise ArmError(f"invalid target {position} / {quat}")
        if not np.all(np.isfinite(position)):
            raise ArmError(f"non-finite target position {position}")
        tracker.set_target(self._fk.Affine(position, quat / norm))
        closed = bool(command.gripper_closed)
        if self._gripper is not None and closed != self._gripper_closed:
            self._gripper_closed = closed
            (self._gripper.close if closed else self._gripper.open)()

    def hold(self) -> None:
        robot = self._require_robot()
        if self._tracker is None or not robot.is_in_control:
            logger.info("hold(): no tracking motion running; nothing to hold")
            return
        self._tracker.set_target(robot.current_pose.end_effector_pose)

    def stop(self) -> None:
        robot = self._require_robot()
        self._tracker = None
        try:
            robot.stop()  # preempts the running motion; the robot holds its joints
            robot.join_motion(timeout=self.config.stop_timeout_s)
        except Exception as exc:  # the preemption surfaces as a ControlException
            logger.debug("stop(): %s", exc)

    def recover(self) -> bool:
        robot = self._require_robot()
        if self._tracker is not None and robot.is_in_control and not robot.has_errors:
            return True
        self._end_tracking()
        try:
            if not robot.recover_from_errors():
                logger.warning("automatic error recovery failed")
                return False
            self._start_tracking()
        except Exception as exc:
            logger.warning("recovery failed: %s: %s", type(exc).__name__, exc)
            return False
        return bool(robot.is_in_control)

    def close(self) -> None:
        if self._robot is not None:
            self._end_tracking()
        if self._gripper is not None:
            self._gripper.close_device()
        self._gripper = None
        self._robot = None  # franky disconnects when the Robot is destroyed
        self._gripper_closed = None

    # ------------------------------------------------------------------ state

    def read(self) -> ArmState:
        """Latest state; the quaternion's sign is kept continuous with the previous reading.

        Microseconds while tracking (franky caches the 1 kHz state); about one control period
        (1 ms) when no motion runs, as franky then waits for the next state packet.
        """
        robot = self._require_robot()
        try:
            state = robot.state
        except Exception as exc:
            raise ArmError(f"cannot read the Franka state: {type(exc).__name__}: {exc}") from exc
        stamp = time.monotonic()
        pose = state.O_T_EE
        quat = np.asarray(pose.quaternion, dtype=float)
        if self._last_quat is not None and float(quat @ self._last_quat) < 0.0:
            quat = -quat
        self._last_quat = quat
        twist = state.O_dP_EE_est  # franky's Kalman estimate from measured q, dq
        if twist is None:
            twist = robot.current_cartesian_velocity.end_effector_twist
        velocity = np.concatenate([twist.linear, twist.angular]).astype(float)
        error = self._error
        if robot.has_errors:
            error = f"robot errors: {state.current_errors}"
        elif self._tracker is not None and not robot.is_in_control:
            error = self._tracking_lost()
        if error is None and self._gripper is not None and self._gripper.last_error:
            error = f"gripper: {self._gripper.last_error}"
        gripper = 0.0 if self._gripper is None else 1.0 - self._gripper.width()
        return ArmState(
            stamp=stamp,
            tcp_position=np.asarray(pose.translation, dtype=float).copy(),
            tcp_quaternion=quat,
            tcp_velocity=velocity,
            joint_positions=np.asarray(state.q, dtype=float).copy(),
            gripper=float(gripper),
            error=error,
        )

    def versions(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": "franky"}
        try:
            out["franky"] = importlib.metadata.version("franky-control")
        except importlib.metadata.PackageNotFoundError:
            out["franky"] = None
        out["libfranka"] = libfranka_version()
        if self._gripper is not None:
            out.update(self._gripper.versions())
        return out
