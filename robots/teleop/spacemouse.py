"""3Dconnexion SpaceMouse over raw HID (hidapi), wired and wireless.

Input reports as the device sends them (first byte = report id, little-endian int16)::

    0x01  tx ty tz              translation (older devices: 7 bytes)
    0x01  tx ty tz rx ry rz     translation + rotation in one report (newer wireless
                                devices and the Universal Receiver: 13 bytes)
    0x02  rx ry rz              rotation (devices that split the axes)
    0x03  bitmask               buttons, bit i = button i (length varies by model)
    0x17  battery               wireless battery level (ignored)

Device axes: x to the right, y towards the user, z down, rotations about the same axes;
full deflection is about +-350 counts. ``translation_map``/``rotation_map`` take them to
the robot base frame (default: a user facing the robot across its workspace, so pushing
the cap away moves the tool away from them, i.e. base +x).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence

import numpy as np

from rlinf_user.robots.teleop.axes import axis_matrix, deadzone
from rlinf_user.robots.teleop.command import DeviceDisconnected
from rlinf_user.robots.teleop.device import Source, TeleopDevice

log = logging.getLogger(__name__)

VENDOR_IDS = (0x256F, 0x046D)
PRODUCTS = {
    0xC626: "SpaceNavigator",
    0xC627: "SpaceExplorer",
    0xC628: "SpaceNavigator for Notebooks",
    0xC62B: "SpaceMouse Pro",
    0xC62E: "SpaceMouse Wireless (cable)",
    0xC62F: "SpaceMouse Wireless (receiver)",
    0xC631: "SpaceMouse Pro Wireless (cable)",
    0xC632: "SpaceMouse Pro Wireless (receiver)",
    0xC633: "SpaceMouse Enterprise",
    0xC635: "SpaceMouse Compact",
    0xC652: "Universal Receiver",
}
FULL_SCALE = 350.0

REPORT_TRANSLATION = 0x01
REPORT_ROTATION = 0x02
REPORT_BUTTONS = 0x03
REPORT_BATTERY = 0x17


def translation_report(t: Sequence[int], r: Sequence[int] | None = None) -> bytes:
    """Encode a report as the device does (used to replay and generate device input)."""
    if r is None:
        return struct.pack("<B3h", REPORT_TRANSLATION, *map(int, t))
    return struct.pack("<B6h", REPORT_TRANSLATION, *map(int, t), *map(int, r))


def rotation_report(r: Sequence[int]) -> bytes:
    return struct.pack("<B3h", REPORT_ROTATION, *map(int, r))


def button_report(mask: int, nbytes: int = 2) -> bytes:
    return bytes([REPORT_BUTTONS]) + int(mask).to_bytes(nbytes, "little")


class SpaceMouse(TeleopDevice):
    kind = "spacemouse"

    def __init__(
        self,
        source: Source,
        translation_map: Sequence[str] = ("-y", "-x", "-z"),
        rotation_map: Sequence[str] = ("-y", "-x", "-z"),
        full_scale: float = FULL_SCALE,
        deadzone: float = 0.08,
        translation_gain: float = 1.0,
        rotation_gain: float = 1.0,
        buttons: Mapping[int, str | None] | None = None,
        name: str | None = None,
    ):
        super().__init__(source, name)
        self._tmap = axis_matrix(translation_map)
        self._rmap = axis_matrix(rotation_map)
        self.full_scale = float(full_scale)
        self.deadzone = float(deadzone)
        self.gains = (float(translation_gain), float(rotation_gain))
        self.buttons = {int(k): v for k, v in (buttons if buttons is not None else {0: "gripper", 1: "intervene"}).items()}
        self._raw = np.zeros(6, np.float32)
        self._mask = 0

    def _apply(self, report) -> None:
        data = bytes(report)
        if not data:
            raise ValueError("empty HID report")
        rid = data[0]
        if rid == REPORT_TRANSLATION:
            if len(data) >= 13:
                self._raw[:] = struct.unpack_from("<6h", data, 1)
            elif len(data) >= 7:
                self._raw[:3] = struct.unpack_from("<3h", data, 1)
            else:
                raise ValueError(f"translation report of {len(data)} bytes")
        elif rid == REPORT_ROTATION:
            if len(data) < 7:
                raise ValueError(f"rotation report of {len(data)} bytes")
            self._raw[3:] = struct.unpack_from("<3h", data, 1)
        elif rid == REPORT_BUTTONS:
            mask = int.from_bytes(data[1:], "little")
            changed = mask ^ self._mask
            self._mask = mask
            for bit in range(8 * (len(data) - 1)):
                if changed >> bit & 1:
                    self._button(self.buttons.get(bit), bool(mask >> bit & 1))
            return
        else:
            return  # battery, LEDs and vendor reports carry no motion
        v = self._raw / self.full_scale
        t = deadzone(self._tmap @ v[:3], self.deadzone) * self.gains[0]
        r = deadzone(self._rmap @ v[3:], self.deadzone) * self.gains[1]
        self._motion = np.clip(np.concatenate([t, r]), -1.0, 1.0).astype(np.float32)


class HidapiSource(Source):
    """A live SpaceMouse through hidapi (``pip install hidapi``; needs read access to the
    hidraw node, e.g. a udev rule for vendor 256f/046d)."""

    name = "hidapi"

    def __init__(self, path: bytes | None = None, vendor_id: int | None = None, product_id: int | None = None):
        try:
            import hid
        except ImportError as exc:
            raise DeviceDisconnected("hidapi is not installed: pip install hidapi") from exc
        info = None
        for d in hid.enumerate():
            if path is not None and d["path"] != path:
                continue
            if vendor_id is not None and d["vendor_id"] != vendor_id:
                continue
            if product_id is not None and d["product_id"] != product_id:
                continue
            if path is None and vendor_id is None and (d["vendor_id"] not in VENDOR_IDS or d["product_id"] not in PRODUCTS):
                continue
            info = d
            break
        if info is None:
            raise DeviceDisconnected(
                "no SpaceMouse found over HID (is it plugged in / the receiver paired, and is its hidraw node "
                "readable? `rlinf-user doctor` checks both)"
            )
        self.product = PRODUCTS.get(info["product_id"], f"{info['vendor_id']:04x}:{info['product_id']:04x}")
        self._dev = hid.device()
        try:
            self._dev.open_path(info["path"])
        except OSError as exc:
            raise DeviceDisconnected(f"cannot open {self.product} ({info['path']!r}): {exc} (permissions?)") from exc
        log.info("SpaceMouse: %s", self.product)

    def read(self, timeout: float):
        try:
            data = self._dev.read(64, int(timeout * 1000))
        except (OSError, ValueError) as exc:
            raise DeviceDisconnected(f"{self.product}: {exc}") from exc
        return bytes(data) if data else None

    def close(self) -> None:
        try:
            self._dev.close()
        except Exception:  # noqa: BLE001
            pass


def list_spacemice() -> list[dict]:
    try:
        import hid
    except ImportError:
        return []
    return [
        {"product": PRODUCTS[d["product_id"]], "path": d["path"], "vendor_id": d["vendor_id"], "product_id": d["product_id"]}
        for d in hid.enumerate()
        if d["vendor_id"] in VENDOR_IDS and d["product_id"] in PRODUCTS
    ]
