"""Teleoperation devices (SpaceMouse over HID, keyboard and gamepad over evdev) mapped to
the env contract's 7-D end-effector action."""
