"""Franka driver pieces that need neither a robot nor franky: config checks, lazy imports,
and the Robotiq 2F-85 register encoding (checked against the manual's example frames)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlinf_user.robots.franka.driver import FrankaDriverConfig
from rlinf_user.robots.franka.grippers import (
    ROBOTIQ_OUTPUT_REGISTER,
    robotiq_command_registers,
    robotiq_decode_status,
)


def _crc16_modbus(frame: bytes) -> bytes:
    crc = 0xFFFF
    for byte in frame:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return bytes([crc & 0xFF, crc >> 8])


def _fc16_frame(unit: int, address: int, registers: list[int]) -> bytes:
    """A Modbus RTU 'write multiple registers' request, as pymodbus puts it on the wire."""
    body = bytes([unit, 0x10]) + address.to_bytes(2, "big") + len(registers).to_bytes(2, "big")
    body += bytes([2 * len(registers)]) + b"".join(r.to_bytes(2, "big") for r in registers)
    return body + _crc16_modbus(body)


@pytest.mark.parametrize(
    ("registers", "manual_frame"),
    [
        # Robotiq 2F-85 manual, Modbus RTU example: clear rACT (reset) ...
        (robotiq_command_registers(0, 0, 0, activate=False, go=False),
         "09 10 03 E8 00 03 06 00 00 00 00 00 00 73 30"),
        # ... activate ...
        (robotiq_command_registers(0, 0, 0, activate=True, go=False),
         "09 10 03 E8 00 03 06 01 00 00 00 00 00 72 E1"),
        # ... close at full speed and force ...
        (robotiq_command_registers(255, 255, 255), "09 10 03 E8 00 03 06 09 00 00 FF FF FF 42 29"),
        # ... open at full speed and force.
        (robotiq_command_registers(0, 255, 255), "09 10 03 E8 00 03 06 09 00 00 00 FF FF 72 19"),
    ],
)  # fmt: skip
def test_robotiq_requests_match_the_manual(registers: list[int], manual_frame: str) -> None:
    assert _fc16_frame(9, ROBOTIQ_OUTPUT_REGISTER, registers) == bytes.fromhex(manual_frame)


def test_robotiq_status_decoding() -> None:
    # 0xF9: activated, go-to set, activation complete, stopped at the requested position.
    status = robotiq_decode_status([0xF900, 0x00FF, 0xBD00])
    assert status == {
        "gACT": 1, "gGTO": 1, "gSTA": 3, "gOBJ": 3, "gFLT": 0, "gPR": 0xFF, "gPO": 0xBD, "gCU": 0,
    }  # fmt: skip


def test_robotiq_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match="position"):
        robotiq_command_registers(256, 0, 0)


def test_config_validation() -> None:
    assert len(FrankaDriverConfig().reset_joints) == 7
    with pytest.raises(ValueError, match="reset_joints"):
        FrankaDriverConfig(reset_joints=[0.0] * 6)
    with pytest.raises(ValueError, match="gripper"):
        FrankaDriverConfig(gripper="suction")
    with pytest.raises(ValueError, match="damping"):
        FrankaDriverConfig(damping=[1.0, 2.0])


def test_driver_imports_without_franky() -> None:
    code = (
        "import sys; sys.modules['franky'] = None\n"  # make `import franky` fail
        "from rlinf_user.robots.franka.driver import FrankyArm, FrankaDriverConfig\n"
        "from rlinf_user.robots.arm import ArmError\n"
        "try:\n"
        "    FrankyArm(FrankaDriverConfig()).connect()\n"
        "except ArmError as exc:\n"
        "    assert 'franky' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('connect() without franky did not raise')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
