"""Grippers for the Franka driver: the Franka Hand (over franky) and a Robotiq 2F-85 (Modbus RTU).

Every gripper here is driven the same way: :meth:`Gripper.open` / :meth:`Gripper.close` only
record the wish and return at once; a worker thread owns the device, runs one command at a
time (the latest wish wins) and a second thread polls the finger state so that
:meth:`Gripper.width` is a cached read. Widths are normalised: 1.0 fully open, 0.0 fully closed.
"""

from __future__ import annotations

import abc
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

_JOIN_TIMEOUT_S = 2.0  # how long close_device() waits for a worker thread
_ERROR_BACKOFF_S = 1.0  # pause of a state poller after a failed read
_MODBUS_TIMEOUT_S = 0.2  # per Modbus RTU transaction (a 3-register exchange takes ~3 ms)


def call_with_timeout(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run a blocking call in a daemon thread; raise :class:`TimeoutError` after ``timeout_s``.

    libfranka's constructors block for minutes when a host accepts TCP but never answers;
    the abandoned thread ends by itself once the socket fails.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"timeout:{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what}: no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Gripper(abc.ABC):
    """A parallel gripper commanded open/closed, with a cheap normalised width read."""

    def __init__(self) -> None:
        self._wish: bool | None = None  # True closed, False open, None nothing asked yet
        self._wish_seq = 0
        self._done_seq = 0
        self._cond = threading.Condition()
        self._closing = False
        self.last_error: str | None = None
        self._worker: threading.Thread | None = None

    # -- public API --------------------------------------------------------------

    def open(self) -> None:
        """Open fully. Non-blocking."""
        self._request(False)

    def close(self) -> None:
        """Close (grasp whatever is between the fingers). Non-blocking."""
        self._request(True)

    @abc.abstractmethod
    def width(self) -> float:
        """Latest opening width, normalised: 1.0 fully open .. 0.0 fully closed. Cheap."""

    def wait(self, timeout_s: float) -> bool:
        """Block until every command asked so far has finished; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._done_seq < self._wish_seq:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    return self._done_seq >= self._wish_seq
        return True

    def close_device(self) -> None:
        """Stop the worker threads and release the device (idempotent)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=_JOIN_TIMEOUT_S)

    def versions(self) -> dict[str, Any]:
        return {}

    # -- worker machinery ----------------------------------------------------------

    def _request(self, closed: bool) -> None:
        with self._cond:
            self._wish = closed
            self._wish_seq += 1
            self._cond.notify_all()

    def _start_worker(self) -> None:
        self._worker = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._worker.start()

    def _run(self) -> None:
        executed: bool | None = None
        while True:
            with self._cond:
                while not self._closing and (self._wish == executed or self._wish is None):
                    self._done_seq = self._wish_seq
                    self._cond.notify_all()
                    self._cond.wait()
                if self._closing:
                    return
                wish, seq = self._wish, self._wish_seq
            try:
                self._execute(bool(wish))
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - a gripper fault must not kill the thread
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("%s command failed: %s", type(self).__name__, self.last_error)
            executed = wish
            with self._cond:
                self._done_seq = max(self._done_seq, seq)
                self._cond.notify_all()

    @abc.abstractmethod
    def _execute(self, closed: bool) -> None:
        """Blocking: drive the fingers open (False) or closed (True). Worker thread only."""


class FrankaHand(Gripper):
    """The Franka Hand through ``franky.Gripper`` (TCP 1338 on the robot's FCI address).

    Closing is a grasp at ``force`` newtons with a wide outer tolerance, so it succeeds (and
    keeps squeezing) whether or not an object is held; opening moves to the maximum width.
    Commands run strictly one at a time: libfranka cannot have two gripper commands in flight.
    Widths are in metres internally, normalised by the hand's maximum width.
    """

    @classmethod
    def from_driver_config(cls, cfg) -> FrankaHand:
        """The hand of the arm ``cfg`` (:class:`rlinf_user.robots.franka.driver.FrankaDriverConfig`) drives."""
        return cls(cfg.ip, cfg.gripper_speed, cfg.gripper_force, cfg.gripper_grasp_epsilon_inner,
                   cfg.gripper_max_width, cfg.gripper_poll_hz, cfg.connect_timeout_s)  # fmt: skip

    def __init__(
        self,
        hostname: str,
        speed: float,
        force: float,
        grasp_epsilon_inner: float,
        nominal_max_width: float,
        state_poll_hz: float,
        connect_timeout_s: float,
    ) -> None:
        super().__init__()
        import franky

        self.hostname = hostname
        self._speed, self._force, self._eps_inner = speed, force, grasp_epsilon_inner
        self._poll_period = 1.0 / state_poll_hz
        self._gripper = call_with_timeout(
            lambda: franky.Gripper(hostname), connect_timeout_s, f"Franka Hand at {hostname}"
        )
        state = self._gripper.state
        # max_width is 0 until the hand has been homed once after power-on.
        self._max_width = state.max_width if state.max_width > 1e-3 else nominal_max_width
        self._width_m = float(state.width)
        self._poller = threading.Thread(target=self._poll, name="FrankaHandState", daemon=True)
        self._poller.start()
        self._start_worker()

    def width(self) -> float:
        return min(max(self._width_m / self._max_width, 0.0), 1.0)

    def versions(self) -> dict[str, Any]:
        return {"franka_hand_server": int(self._gripper.server_version)}

    def close_device(self) -> None:
        super().close_device()
        self._poller.join(timeout=_JOIN_TIMEOUT_S)

    def _poll(self) -> None:
        # gripper.state waits for the next UDP state packet; keep that wait off the caller.
        while not self._closing:
            try:
                self._width_m = float(self._gripper.state.width)
            except Exception as exc:  # noqa: BLE001
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("Franka Hand state read failed: %s", exc)
                time.sleep(_ERROR_BACKOFF_S)
            time.sleep(self._poll_period)

    def _execute(self, closed: bool) -> None:
        if closed:
            ok = self._gripper.grasp(
                0.0, self._speed, self._force,
                epsilon_inner=self._eps_inner, epsilon_outer=self._max_width,
            )  # fmt: skip
        else:
            ok = self._gripper.move(self._max_width, self._speed)
        if not ok:
            logger.info("Franka Hand %s reported no success", "grasp" if closed else "open")


# --------------------------------------------------------------------------- Robotiq 2F-85

# Register map of the Robotiq 2F-85 Modbus RTU interface (instruction manual, section 4).
ROBOTIQ_OUTPUT_REGISTER = 0x03E8  # 1000: action request .. force (3 registers, write FC16)
ROBOTIQ_INPUT_REGISTER = 0x07D0  # 2000: gripper status .. current (3 registers, read FC04)
ROBOTIQ_SPEED_RANGE_M_S = (0.020, 0.150)  # rSP 0..255 spans this finger speed
ROBOTIQ_FORCE_RANGE_N = (20.0, 235.0)  # rFR 0..255 spans this grip force
_ACT, _GTO = 0x01, 0x08  # rACT (activate), rGTO (go to requested position)


def robotiq_command_registers(
    position: int, speed: int, force: int, activate: bool = True, go: bool = True
) -> list[int]:
    """The three output registers (big-endian byte pairs) for one request.

    Bytes: [action request, reserved, reserved, position, speed, force]; position 0 is fully
    open and 255 fully closed.
    """
    for name, value in (("position", position), ("speed", speed), ("force", force)):
        if not 0 <= value <= 255:
            raise ValueError(f"{name} must be in 0..255, got {value}")
    action = (_ACT if activate else 0) | (_GTO if go else 0)
    return [action << 8, position & 0xFF, (speed << 8) | force]


def robotiq_decode_status(registers: list[int]) -> dict[str, int]:
    """Decode the three input registers: status bits, fault, position echo, position, current."""
    status, fault_byte = registers[0] >> 8, registers[1] >> 8
    return {
        "gACT": status & 0x01,
        "gGTO": (status >> 3) & 0x01,
        "gSTA": (status >> 4) & 0x03,  # 3: activation complete
        "gOBJ": (status >> 6) & 0x03,  # 0 moving, 1/2 object contact, 3 at requested position
        "gFLT": fault_byte & 0x0F,
        "gPR": registers[1] & 0xFF,
        "gPO": registers[2] >> 8,  # finger position, 0 open .. 255 closed
        "gCU": registers[2] & 0xFF,  # motor current, ~10 mA per count
    }


def _scale(value: float, lo: float, hi: float) -> int:
    return int(round(255 * min(max((value - lo) / (hi - lo), 0.0), 1.0)))


class RobotiqGripper(Gripper):
    """A Robotiq 2F-85 on a USB-RS485 adapter, Modbus RTU (115200 8N1, unit id 9 by default).

    Needs ``pymodbus[serial]>=3`` (imported here, lazily). Register-level implementation of the
    manual's protocol: activation (rACT 0 then 1, wait for gSTA == 3), go-to requests on the
    output registers, status polling on the input registers. Activation (on construction)
    runs the gripper's calibration stroke: the fingers open and close once, so keep them
    clear. Speed and force are mapped linearly onto the 2F-85's ranges (20-150 mm/s,
    20-235 N). Width is normalised by the 0..255 position scale. **Untested against hardware in
    this repository** (no gripper or serial adapter available); only the register encoding is
    unit-tested, against the example frames of the manual.
    """

    @classmethod
    def from_driver_config(cls, cfg) -> RobotiqGripper:
        """The Robotiq on the serial port ``cfg.robotiq_port`` names."""
        return cls(cfg.robotiq_port, cfg.gripper_speed, cfg.gripper_force, cfg.robotiq_unit_id,
                   cfg.robotiq_baudrate, cfg.gripper_poll_hz, cfg.robotiq_timeout_s)  # fmt: skip

    def __init__(
        self,
        port: str,
        speed: float,
        force: float,
        unit_id: int,
        baudrate: int,
        state_poll_hz: float,
        command_timeout_s: float,
    ) -> None:
        super().__init__()
        if not port:
            raise ValueError("RobotiqGripper needs the serial port of its RS485 adapter")
        from pymodbus.client import ModbusSerialClient

        self.port = port
        self._speed = _scale(speed, *ROBOTIQ_SPEED_RANGE_M_S)
        self._force = _scale(force, *ROBOTIQ_FORCE_RANGE_N)
        self._poll_period = 1.0 / state_poll_hz
        self._timeout_s = command_timeout_s
        self._io = threading.Lock()  # one Modbus transaction on the bus at a time
        self._client = ModbusSerialClient(
            port=port, baudrate=baudrate, bytesize=8, parity="N", stopbits=1,
            timeout=_MODBUS_TIMEOUT_S,
        )  # fmt: skip
        # pymodbus renamed the unit keyword slave= to device_id= in 3.10.
        params = inspect.signature(self._client.read_input_registers).parameters
        self._unit_kw = {"device_id" if "device_id" in params else "slave": unit_id}
        if not self._client.connect():
            raise ConnectionError(f"cannot open Robotiq serial port {port}")
        self._position = 0
        self._activate(command_timeout_s)
        self._poller = threading.Thread(target=self._poll, name="RobotiqState", daemon=True)
        self._poller.start()
        self._start_worker()

    def _write(self, registers: list[int]) -> None:
        with self._io:
            reply = self._client.write_registers(
                ROBOTIQ_OUTPUT_REGISTER, registers, **self._unit_kw
            )
        if reply.isError():
            raise OSError(f"Robotiq write failed: {reply}")

    def _read_status(self) -> dict[str, int]:
        with self._io:
            reply = self._client.read_input_registers(
                ROBOTIQ_INPUT_REGISTER, count=3, **self._unit_kw
            )
        if reply.isError():
            raise OSError(f"Robotiq read failed: {reply}")
        return robotiq_decode_status(list(reply.registers))

    def _activate(self, timeout_s: float) -> None:
        self._write(robotiq_command_registers(0, 0, 0, activate=False, go=False))
        self._write(robotiq_command_registers(0, 0, 0, activate=True, go=False))
        deadline = time.monotonic() + timeout_s
        while (status := self._read_status())["gSTA"] != 3:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Robotiq activation did not complete: {status}")
            time.sleep(self._poll_period)
        self._position = status["gPO"]

    def width(self) -> float:
        return 1.0 - self._position / 255.0

    def close_device(self) -> None:
        super().close_device()
        self._poller.join(timeout=_JOIN_TIMEOUT_S)
        self._client.close()

    def _poll(self) -> None:
        while not self._closing:
            try:
                status = self._read_status()
                self._position = status["gPO"]
                if status["gFLT"]:
                    self.last_error = f"Robotiq fault 0x{status['gFLT']:X}"
            except Exception as exc:  # noqa: BLE001
                self.last_error = f"{type(exc).__name__}: {exc}"
                time.sleep(_ERROR_BACKOFF_S)
            time.sleep(self._poll_period)

    def _execute(self, closed: bool) -> None:
        target = 255 if closed else 0
        self._write(robotiq_command_registers(target, self._speed, self._force))
        deadline = time.monotonic() + self._timeout_s
        while not self._closing and time.monotonic() < deadline:
            status = self._read_status()
            if status["gFLT"]:
                raise OSError(f"Robotiq fault 0x{status['gFLT']:X}")
            # Done once this request is echoed and the fingers stopped (arrived or contact).
            if status["gPR"] == target and status["gOBJ"] != 0:
                return
            time.sleep(self._poll_period)
        if not self._closing:
            raise TimeoutError(f"Robotiq did not reach position {target} in {self._timeout_s} s")
