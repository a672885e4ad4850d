"""Live teleop devices (run by hand with the device plugged in: pytest -m hardware)."""

import time

import pytest

pytestmark = pytest.mark.hardware


def test_spacemouse_reports_over_hid():
    from rlinf_user.robots.teleop.spacemouse import HidapiSource, SpaceMouse

    dev = SpaceMouse(HidapiSource()).start()
    try:
        print("move the SpaceMouse cap for 3 s")
        time.sleep(3)
        assert dev.reports > 0 and dev.connected
    finally:
        dev.close()


@pytest.mark.parametrize("kind", ["keyboard", "gamepad"])
def test_evdev_device_reports(kind):
    from rlinf_user.robots.teleop.evdev_input import EvdevSource
    from rlinf_user.robots.teleop.gamepad import Gamepad
    from rlinf_user.robots.teleop.keyboard import Keyboard

    cls = Keyboard if kind == "keyboard" else Gamepad
    dev = cls(EvdevSource(kind=kind)).start()
    try:
        print(f"press keys / move sticks on the {kind} for 3 s")
        time.sleep(3)
        assert dev.reports > 0 and dev.connected
    finally:
        dev.close()
