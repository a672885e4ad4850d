"""Build teleop devices from ``teleop`` config; replay recorded sessions as devices."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rlinf_user.registry import Registry
from rlinf_user.robots.teleop.command import DeviceDisconnected
from rlinf_user.robots.teleop.device import Source, Teleop, TeleopDevice
from rlinf_user.robots.teleop.evdev_input import EV_SYN, EVENT, parse_events

log = logging.getLogger(__name__)

#: teleop devices by ``teleop.device``: a builder ``(cfg, kind, replay) -> TeleopDevice``,
#: ``replay`` a recording to play instead of the device (or None)
DEVICES = Registry("teleop device", {
    "spacemouse": "rlinf_user.robots.teleop.factory:spacemouse",
    "keyboard": "rlinf_user.robots.teleop.factory:keyboard",
    "gamepad": "rlinf_user.robots.teleop.factory:gamepad",
}, entry_points="rlinf_user.teleop_devices")  # fmt: skip


class ReplaySource(Source):
    """Plays ``(t, report)`` pairs in real time from when it is first read; ends like an
    unplugged device unless ``hold_open`` (then it idles after the last report)."""

    name = "replay"

    def __init__(self, reports: list[tuple[float, bytes]], hold_open: bool = True):
        self.reports = sorted(reports, key=lambda r: r[0])
        self.hold_open = hold_open
        self._i = 0
        self._t0: float | None = None

    def read(self, timeout: float):
        if self._t0 is None:
            self._t0 = time.monotonic() - (self.reports[0][0] if self.reports else 0.0)
        if self._i >= len(self.reports):
            if self.hold_open:
                time.sleep(timeout)
                return None
            raise DeviceDisconnected("end of the recorded session")
        t, report = self.reports[self._i]
        wait = self._t0 + t - time.monotonic()
        if wait > timeout:
            time.sleep(timeout)
            return None
        if wait > 0:
            time.sleep(wait)
        self._i += 1
        return report


def load_evdev_recording(path: str | Path) -> list[tuple[float, bytes]]:
    """A raw event-device recording (e.g. ``cat /dev/input/eventN > keys.bin``) split into
    SYN_REPORT-terminated packets stamped with their kernel time."""
    data = Path(path).read_bytes()
    packets, current, stamp = [], b"", None
    for i, ev in enumerate(parse_events(data)):
        raw = data[i * EVENT.size : (i + 1) * EVENT.size]
        current += raw
        if stamp is None:
            stamp = ev.sec + ev.usec * 1e-6
        if ev.type == EV_SYN and ev.code == 0:
            packets.append((stamp, current))
            current, stamp = b"", None
    if current:
        packets.append((stamp or 0.0, current))
    return packets


def load_hid_recording(path: str | Path) -> list[tuple[float, bytes]]:
    """A recorded HID session: one report per line, ``<seconds> <hex bytes>``."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            t, hexed = line.split(None, 1)
            out.append((float(t), bytes.fromhex(hexed.replace(" ", ""))))
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: expected '<seconds> <hex report>', got {line!r}") from exc
    return out


def make_device(cfg: Any, kind: str | None = None) -> TeleopDevice:
    """A started-ready (not yet started) device for ``cfg.device`` (or ``kind``)."""
    kind = kind or cfg.device
    if kind == "synthetic":
        raise ValueError("teleop.device=synthetic records demonstrations with `rlinf-user teleop --sim ...`; "
                         "a scripted supervisor in train or hg-dagger is intervention.synthetic_human=true "
                         "or hg_dagger.synthetic_human=true")
    if kind not in DEVICES:
        raise ValueError(f"teleop.device={kind!r}: available {', '.join(DEVICES.names())}")
    return DEVICES.get(kind)(cfg, kind, cfg.replay if kind == cfg.device else None)


def spacemouse(cfg: Any, kind: str, replay: str | None) -> TeleopDevice:
    from rlinf_user.robots.teleop.spacemouse import HidapiSource, SpaceMouse

    source = ReplaySource(load_hid_recording(replay)) if replay else HidapiSource(path=cfg.path)
    buttons = {int(k): (None if v in (None, "null", "none") else str(v)) for k, v in dict(cfg.buttons or {}).items()}
    return SpaceMouse(
        source,
        translation_map=list(cfg.translation_map),
        rotation_map=list(cfg.rotation_map),
        full_scale=cfg.full_scale,
        deadzone=cfg.deadzone,
        translation_gain=cfg.translation_gain,
        rotation_gain=cfg.rotation_gain,
        buttons=buttons or None,
    )


def _evdev(cfg: Any, kind: str, replay: str | None):
    from rlinf_user.robots.teleop.evdev_input import EvdevSource

    path = cfg.path if kind == cfg.device else None
    return ReplaySource(load_evdev_recording(replay)) if replay else EvdevSource(path, kind=kind)


def keyboard(cfg: Any, kind: str, replay: str | None) -> TeleopDevice:
    from rlinf_user.robots.teleop.keyboard import Keyboard

    return Keyboard(_evdev(cfg, kind, replay), speed=cfg.speed)


def gamepad(cfg: Any, kind: str, replay: str | None) -> TeleopDevice:
    from rlinf_user.robots.teleop.gamepad import Gamepad

    return Gamepad(_evdev(cfg, kind, replay), stick_range=tuple(cfg.stick_range), trigger_range=tuple(cfg.trigger_range),
                   deadzone=cfg.deadzone)  # fmt: skip


class CombinedDevice:
    """Motion from one device, episode controls from both (e.g. SpaceMouse + keyboard).
    A :class:`Teleop` like each of its parts."""

    def __init__(self, main: TeleopDevice, controls: TeleopDevice):
        self.main, self.controls = main, controls
        self.name, self.kind = main.name, main.kind

    @property
    def started(self) -> bool:
        return self.main.started

    def start(self) -> CombinedDevice:
        self.main.start()
        self.controls.start()
        return self

    def close(self) -> None:
        self.main.close()
        self.controls.close()

    def read(self):
        cmd = self.main.read()
        try:
            extra = self.controls.read()
        except DeviceDisconnected as exc:
            log.warning("episode-control device lost (%s); continuing with %s alone", exc, self.main.name)
            return cmd
        cmd.events = cmd.events | (extra.events - {"intervene"})
        cmd.engaged = cmd.engaged or extra.engaged
        return cmd

    def set_gripper(self, closed: bool) -> None:
        self.main.set_gripper(closed)

    def release(self) -> None:
        self.main.release()
        self.controls.release()

    @property
    def engaged(self) -> bool:
        return self.main.engaged or self.controls.engaged

    def read_gripper(self) -> float:
        return self.main.read_gripper()


def open_teleop(cfg: Any) -> Teleop:
    """The configured device, plus its episode-control device when one is set and found."""
    main = make_device(cfg)
    if not cfg.controls or cfg.controls == cfg.device:
        return main
    try:
        controls = make_device(cfg, cfg.controls)
    except DeviceDisconnected as exc:
        log.warning("no %s for episode controls (%s): use the %s's buttons", cfg.controls, exc, cfg.device)
        return main
    return CombinedDevice(main, controls)
