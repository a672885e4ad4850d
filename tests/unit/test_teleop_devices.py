"""Teleop devices parse their real wire formats: SpaceMouse HID input reports and Linux
input events (keyboard, gamepad), recorded as the devices send them."""

import logging
import time

import numpy as np
import pytest

from rlinf_user.robots.teleop.axes import axis_matrix, deadzone
from rlinf_user.robots.teleop.command import DeviceDisconnected, TeleopCommand
from rlinf_user.robots.teleop.device import QueueSource
from rlinf_user.robots.teleop.evdev_input import EV_ABS, EV_KEY, EV_SYN, pack_event, parse_events
from rlinf_user.robots.teleop.factory import ReplaySource, load_evdev_recording, load_hid_recording
from rlinf_user.robots.teleop.gamepad import Gamepad
from rlinf_user.robots.teleop.keyboard import KEY, Keyboard
from rlinf_user.robots.teleop.spacemouse import SpaceMouse, button_report, translation_report
from rlinf_user.teleop.gate import InterventionGate
from rlinf_user.teleop.synthetic import SpaceMouseHand

# Reports as a SpaceNavigator sends them (report id, then little-endian int16 x, y, z):
# cap pushed away from the user (device -y), then rotated, then released; button 1 pressed/released.
SPACENAV_SESSION = [
    "01 00 00 a2 fe 00 00",  # ty = -350: pushed fully away
    "02 00 00 00 00 00 00",
    "01 5e 01 00 00 00 00",  # tx = +350: pushed fully right
    "01 00 00 00 00 a2 fe",  # tz = -350: lifted
    "02 00 00 00 00 5e 01",  # rz = +350 (device z points down)
    "01 00 00 00 00 00 00",
    "02 00 00 00 00 00 00",
    "03 02 00",  # button 1 down
    "03 00 00",  # button 1 up
    "17 64",  # wireless battery report: ignored
]
# A SpaceMouse Wireless / Universal Receiver sends all six axes in report 1 (13 bytes).
WIRELESS_REPORT = "01 14 00 a2 fe 00 00 00 00 00 00 af 00"  # tx=20 (deadzone), ty=-350, rz=175


def hx(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


def test_spacemouse_axes_map_to_the_base_frame():
    dev = SpaceMouse(QueueSource())
    dev.feed(hx(SPACENAV_SESSION[0]))
    np.testing.assert_allclose(dev.read().motion, [1, 0, 0, 0, 0, 0], atol=1e-6)  # away from user -> +x
    dev.feed(hx(SPACENAV_SESSION[1]))
    dev.feed(hx(SPACENAV_SESSION[2]))
    np.testing.assert_allclose(dev.read().motion, [0, -1, 0, 0, 0, 0], atol=1e-6)  # right -> -y (base y is left)
    dev.feed(hx(SPACENAV_SESSION[3]))
    np.testing.assert_allclose(dev.read().motion, [0, 0, 1, 0, 0, 0], atol=1e-6)  # lift -> +z
    dev.feed(hx(SPACENAV_SESSION[4]))
    np.testing.assert_allclose(dev.read().motion, [0, 0, 1, 0, 0, -1], atol=1e-6)
    for r in SPACENAV_SESSION[5:7]:
        dev.feed(hx(r))
    assert not dev.read().moving()


def test_wireless_six_axis_report_deadzone_and_scaling():
    dev = SpaceMouse(QueueSource(), deadzone=0.1)
    dev.feed(hx(WIRELESS_REPORT))
    m = dev.read().motion
    assert m[1] == 0.0  # 20/350 = 0.057 is inside the deadzone
    assert m[0] == pytest.approx(1.0)
    assert m[5] == pytest.approx(-(0.5 - 0.1) / 0.9, abs=1e-3)  # rescaled past the deadzone


def test_spacemouse_buttons_latch_gripper_and_toggle_intervention():
    dev = SpaceMouse(QueueSource())
    assert dev.read().gripper == -1.0 and not dev.read().engaged
    dev.feed(button_report(0b01))
    dev.feed(button_report(0b00))
    assert dev.read().gripper == 1.0  # toggled closed on press, release does nothing
    for r in SPACENAV_SESSION[7:]:
        dev.feed(hx(r))
    cmd = dev.read()
    assert cmd.engaged and cmd.events == {"intervene"}
    assert dev.read().events == frozenset()  # one-shot
    dev.feed(button_report(0b10))
    assert not dev.read().engaged


def test_malformed_reports_are_dropped_and_unplugging_is_reported(caplog):
    src = QueueSource()
    dev = SpaceMouse(src).start()
    try:
        with caplog.at_level(logging.WARNING):
            src.push(b"\x01\x00")  # truncated translation report
            src.push(b"")
            src.push(translation_report([0, -350, 0]))
            deadline = time.monotonic() + 2
            while dev.reports < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert "malformed" in caplog.text
        assert dev.read().motion[0] == pytest.approx(1.0)
        src.unplug()
        deadline = time.monotonic() + 2
        while dev.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(DeviceDisconnected, match="unplugged"):
            dev.read()
    finally:
        dev.close()


def test_synthetic_hand_produces_reports_the_parser_reads_back():
    dev = SpaceMouse(QueueSource(), translation_map=["x", "-z", "y"], deadzone=0.08)
    hand = SpaceMouseHand(dev)
    for motion in ([0.5, -0.2, 0.9, 0.0, 0.3, -1.0], [0.0] * 6, [-1, 1, 0.1, 0.09, 0, 0]):
        hand.move(np.array(motion))
        np.testing.assert_allclose(dev.read().motion, motion, atol=4e-3)  # int16 quantisation
    hand.set_gripper(True)
    hand.set_engaged(True)
    cmd = dev.read()
    assert cmd.gripper == 1.0 and cmd.engaged


def test_axis_maps_are_validated():
    np.testing.assert_array_equal(axis_matrix(["-y", "-x", "-z"]) @ [1, 2, 3], [-2, -1, -3])
    with pytest.raises(ValueError, match="twice"):
        axis_matrix(["x", "x", "z"])
    with pytest.raises(ValueError, match="expected x, y or z"):
        axis_matrix(["x", "w", "z"])
    np.testing.assert_allclose(deadzone(np.array([0.05, 0.55, -1.0]), 0.1), [0, 0.5, -1.0])


def key(code: str, value: int, t: float) -> bytes:
    return pack_event(EV_KEY, KEY[code], value, t) + pack_event(EV_SYN, 0, 0, t)


def test_keyboard_events_in_kernel_format():
    raw = key("W", 1, 0.0) + key("A", 1, 0.1) + key("W", 2, 0.2)  # W held (autorepeat), A held
    assert [e.code for e in parse_events(raw) if e.type == EV_KEY] == [17, 30, 17]
    dev = Keyboard(QueueSource(), speed=0.5)
    dev.feed(raw)
    np.testing.assert_allclose(dev.read().motion, [0.5, 0.5, 0, 0, 0, 0])
    dev.feed(key("W", 0, 0.3) + key("ENTER", 1, 0.3) + key("ENTER", 0, 0.4))
    cmd = dev.read()
    np.testing.assert_allclose(cmd.motion, [0, 0.5, 0, 0, 0, 0])
    assert cmd.events == {"success"}
    dev.feed(key("LEFTSHIFT", 1, 0.5))
    assert dev.read().engaged
    dev.feed(key("LEFTSHIFT", 0, 0.6) + key("SPACE", 1, 0.6))
    cmd = dev.read()
    assert not cmd.engaged and cmd.gripper == 1.0
    with pytest.raises(ValueError, match="whole number"):
        dev.feed(raw[:30])


def test_gamepad_sticks_triggers_and_buttons():
    dev = Gamepad(QueueSource(), stick_range=(-32768, 32767), trigger_range=(0, 1023))
    ev = (
        pack_event(EV_ABS, 1, -32768)  # left stick fully up -> +x
        + pack_event(EV_ABS, 0, 32767)  # fully right -> -y
        + pack_event(EV_ABS, 5, 1023)  # RT -> +z
        + pack_event(EV_KEY, 310, 1)  # LB held: deadman
        + pack_event(EV_SYN, 0, 0)
    )
    dev.feed(ev)
    cmd = dev.read()
    np.testing.assert_allclose(cmd.motion[:3], [1, -1, 1], atol=1e-3)
    assert cmd.engaged
    dev.feed(pack_event(EV_ABS, 1, 300) + pack_event(EV_KEY, 304, 1) + pack_event(EV_KEY, 310, 0))
    cmd = dev.read()
    assert abs(cmd.motion[0]) == 0.0 and cmd.events == {"success"} and not cmd.engaged  # 300 is in the deadzone


def test_recordings_load_and_replay_in_time(tmp_path):
    raw = key("W", 1, 100.0) + key("W", 0, 100.2)
    (tmp_path / "keys.bin").write_bytes(raw)
    packets = load_evdev_recording(tmp_path / "keys.bin")
    assert [round(t, 3) for t, _ in packets] == [100.0, 100.2]
    (tmp_path / "sm.txt").write_text("# t report\n0.00 01 00 00 a2 fe 00 00\n0.05 03 01 00\n")
    hid = load_hid_recording(tmp_path / "sm.txt")
    assert hid[1] == (0.05, b"\x03\x01\x00")
    src = ReplaySource(hid, hold_open=False)
    t0 = time.monotonic()
    got = []
    while len(got) < 2:
        r = src.read(0.2)
        if r is not None:
            got.append((time.monotonic() - t0, r))
    assert got[1][0] >= 0.045  # paced by the recording's timestamps
    with pytest.raises(DeviceDisconnected):
        src.read(0.01)
    (tmp_path / "bad.txt").write_text("0.1 zz\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        load_hid_recording(tmp_path / "bad.txt")


def cmd(motion=(0, 0, 0, 0, 0, 0), engaged=False, gripper=-1.0) -> TeleopCommand:
    return TeleopCommand(np.array(motion, np.float32), gripper, engaged)


def test_gate_ignores_stray_motion_and_ramps_both_ways():
    gate = InterventionGate(ramp_steps=3)
    policy = np.array([0.9, 0, 0, 0, 0, 0, 1.0], np.float32)
    d = gate.step(policy, cmd((-1, 0, 0, 0, 0, 0)))  # the cap moved, nobody pressed the gate
    assert not d.intervention and d.action[0] == pytest.approx(0.9)
    xs = []
    for _ in range(4):
        d = gate.step(policy, cmd((-0.9, 0, 0, 0, 0, 0), engaged=True))
        xs.append(d.action[0])
        assert d.intervention
    np.testing.assert_allclose(xs, [0.3, -0.3, -0.9, -0.9], atol=1e-6)  # no step change
    assert gate.takeovers == 1
    back = [gate.step(policy, cmd((-0.9, 0, 0, 0, 0, 0))).action[0] for _ in range(4)]
    np.testing.assert_allclose(back, [-0.3, 0.3, 0.9, 0.9], atol=1e-6)
    assert max(abs(np.diff([0.9, *xs, *back]))) <= 0.6 + 1e-6


def test_gate_aligns_the_device_gripper_at_takeover():
    dev = SpaceMouse(QueueSource())
    gate = InterventionGate(ramp_steps=2)
    policy = np.array([0, 0, 0, 0, 0, 0, 1.0], np.float32)  # policy is holding the gripper closed
    hand = SpaceMouseHand(dev)
    hand.set_engaged(True)
    d = gate.step(policy, dev.read(), device=dev)
    assert d.took_over and d.action[6] == 1.0 and dev.read_gripper() == 1.0  # no drop at hand-over


def test_spacemouse_with_keyboard_episode_controls(caplog):
    from rlinf_user.robots.teleop.factory import CombinedDevice

    mouse, kb_source = SpaceMouse(QueueSource()), QueueSource()
    keyboard = Keyboard(kb_source)
    dev = CombinedDevice(mouse, keyboard)
    mouse.feed(hx(SPACENAV_SESSION[0]))  # motion from the SpaceMouse
    keyboard.feed(key("W", 1, 0.0) + key("ENTER", 1, 0.0) + key("ENTER", 0, 0.1))
    cmd = dev.read()
    assert cmd.motion[0] > 0.9 and cmd.events == {"success"}  # keyboard motion is ignored
    keyboard.feed(key("TAB", 1, 0.2) + key("TAB", 0, 0.3))  # intervene from the keyboard
    cmd = dev.read()
    assert cmd.engaged and dev.engaged and "intervene" not in cmd.events
    dev.release()
    assert not dev.engaged
    keyboard.start()
    kb_source.unplug()
    deadline = time.monotonic() + 2
    while keyboard._error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with caplog.at_level(logging.WARNING):
        assert dev.read().motion[0] > 0.9  # controls lost: the SpaceMouse goes on alone
    assert "episode-control device lost" in caplog.text
    dev.close()
