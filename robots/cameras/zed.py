"""Stereolabs ZED camera (left view, colour) on the ZED SDK's Python API ``pyzed.sl``.

``pyzed.sl`` ships with the ZED SDK: run Stereolabs' installer for your CUDA/JetPack, then the
SDK's ``get_python_api.py`` for this interpreter. The package named ``pyzed`` on PyPI is
unrelated and has no ``sl.Camera``; both cases raise :class:`ZedSdkMissingError` when a
camera is opened (nothing is imported before that).

SDK calls used: ``sl.InitParameters`` (``camera_resolution``, ``camera_fps``, ``depth_mode =
DEPTH_MODE.NONE`` since only images are needed, ``set_from_serial_number`` or
``set_from_svo_file`` for playback with ``svo_real_time_mode``), ``sl.Camera.open`` returning
``sl.ERROR_CODE.SUCCESS``, ``grab(sl.RuntimeParameters())``, ``retrieve_image(mat,
sl.VIEW.LEFT)``, ``mat.get_data()`` (``H x W x 4`` BGRA uint8, converted to RGB) and
``get_timestamp(sl.TIME_REFERENCE.IMAGE)``. ``sl.Camera.get_device_list()`` lists the serials
for the not-found error.

Stamps (seconds, ``time.monotonic()``): the SDK's image timestamp is the capture time in
nanoseconds on the host wall clock (Unix epoch); it is moved onto the monotonic clock with
:func:`~.base.wall_to_monotonic`. SVO playback (recorded times) and implausible timestamps
fall back to the monotonic time at which ``grab`` returned. ``grab`` has no timeout in the SDK;
the capture thread's watchdog covers a grab that hangs. ``close`` from another thread waits up
to ``_CLOSE_WAIT_S`` for a grab in progress (the SDK is not documented as safe against a
concurrent close) and closes regardless after that, as a last resort for a hung grab.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from typing import Any

import numpy as np

from rlinf_user.robots.cameras.base import (
    Camera,
    CameraConfig,
    CameraError,
    CameraNotFoundError,
    EndOfStream,
    wall_to_monotonic,
)

log = logging.getLogger(__name__)

# (sl.RESOLUTION member, width, height) of the ZED capture modes, per eye.
_RESOLUTIONS = (
    ("HD4K", 3840, 2160),
    ("QHDPLUS", 3200, 1800),
    ("HD2K", 2208, 1242),
    ("HD1080", 1920, 1080),
    ("HD1200", 1920, 1200),
    ("HD1536", 1920, 1536),
    ("HD720", 1280, 720),
    ("SVGA", 960, 600),
    ("VGA", 672, 376),
)

_CLOSE_WAIT_S = 1.0

_MISSING = (
    "the ZED SDK's Python API (pyzed.sl) is not available{detail}. Install the ZED SDK with "
    "Stereolabs' installer (https://www.stereolabs.com/developers/release), then run its "
    "get_python_api.py with this Python; the PyPI package named 'pyzed' is unrelated and does "
    "not provide it"
)


class ZedSdkMissingError(CameraError):
    """``pyzed.sl`` cannot be imported, or is not the Stereolabs SDK module."""


def load_sdk() -> Any:
    """Import ``pyzed.sl`` (the Stereolabs module) or raise :class:`ZedSdkMissingError`."""
    try:
        sl = importlib.import_module("pyzed.sl")
    except (ImportError, OSError) as err:
        raise ZedSdkMissingError(_MISSING.format(detail=f" ({err})")) from err
    if not all(hasattr(sl, attr) for attr in ("Camera", "InitParameters", "ERROR_CODE")):
        where = getattr(sl, "__file__", None) or "?"
        raise ZedSdkMissingError(_MISSING.format(detail=f" ({where} has no sl.Camera)"))
    return sl


def zed_resolution(sl: Any, width: int, height: int) -> Any:
    """The ``sl.RESOLUTION`` member for a ``width x height`` (per eye) capture mode."""
    for name, w, h in _RESOLUTIONS:
        if (w, h) == (width, height) and hasattr(sl.RESOLUTION, name):
            return getattr(sl.RESOLUTION, name)
    modes = ", ".join(f"{w}x{h}" for name, w, h in _RESOLUTIONS if hasattr(sl.RESOLUTION, name))
    raise CameraError(f"the ZED SDK has no {width}x{height} capture mode; modes: {modes}")


class ZedCamera(Camera):
    """See the module docstring. Serves the left image, ``cfg.width x cfg.height``."""

    def __init__(self, cfg: CameraConfig):
        super().__init__(cfg)
        self._lock = threading.Lock()  # open/close
        self._grabbing = threading.Lock()  # held for the duration of one grab
        self._sl: Any = None
        self._cam: Any = None
        self._mat: Any = None
        self._runtime: Any = None
        self._serial: str | None = None

    @property
    def serial(self) -> str | None:
        return self._serial or self.cfg.serial

    def open(self) -> None:
        sl = load_sdk()
        cfg = self.cfg
        with self._lock:
            self._close_locked()
            init = sl.InitParameters()
            init.depth_mode = sl.DEPTH_MODE.NONE
            init.camera_fps = int(cfg.fps)
            if cfg.playback:
                path = os.fspath(cfg.playback)
                if not os.path.isfile(path):
                    raise CameraNotFoundError(f"camera {cfg.name!r}: SVO file {path!r} not found")
                init.set_from_svo_file(path)
                init.svo_real_time_mode = True
            else:
                init.camera_resolution = zed_resolution(sl, cfg.width, cfg.height)
                if cfg.serial is not None:
                    found = [str(d.serial_number) for d in sl.Camera.get_device_list()]
                    if cfg.serial not in found:
                        raise CameraNotFoundError(
                            f"camera {cfg.name!r}: no ZED with serial {cfg.serial}; "
                            f"found: {', '.join(found) or 'none'}"
                        )
                    init.set_from_serial_number(int(cfg.serial))
            cam = sl.Camera()
            status = cam.open(init)
            if status != sl.ERROR_CODE.SUCCESS:
                cam.close()
                raise CameraError(f"camera {cfg.name!r}: ZED open failed: {status!r}")
            self._sl, self._cam = sl, cam
            self._mat, self._runtime = sl.Mat(), sl.RuntimeParameters()
            self._serial = str(cam.get_camera_information().serial_number)

    def intrinsics(self) -> dict | None:
        """The left sensor's factory calibration at the opened resolution (ZED SDK
        ``CalibrationParameters.left_cam``; the served image is the left view)."""
        if self._cam is None:
            return None
        info = self._cam.get_camera_information()
        left = info.camera_configuration.calibration_parameters.left_cam
        res = info.camera_configuration.resolution
        return {"width": int(res.width), "height": int(res.height), "fx": float(left.fx), "fy": float(left.fy),
                "cx": float(left.cx), "cy": float(left.cy), "dist": [float(v) for v in left.disto][:5],
                "source": "zed"}  # fmt: skip

    def grab(self, timeout: float | None = None) -> tuple[np.ndarray, float]:
        with self._grabbing:
            return self._grab()

    def _grab(self) -> tuple[np.ndarray, float]:
        sl, cam, mat, runtime = self._sl, self._cam, self._mat, self._runtime
        if cam is None:
            raise CameraError(f"camera {self.cfg.name!r} is not open")
        status = cam.grab(runtime)
        arrival = time.monotonic()
        if status == sl.ERROR_CODE.END_OF_SVOFILE_REACHED:
            raise EndOfStream(f"camera {self.cfg.name!r}: SVO {self.cfg.playback} ended")
        if status != sl.ERROR_CODE.SUCCESS:
            raise CameraError(f"camera {self.cfg.name!r}: ZED grab failed: {status!r}")
        status = cam.retrieve_image(mat, sl.VIEW.LEFT)
        if status != sl.ERROR_CODE.SUCCESS:
            raise CameraError(f"camera {self.cfg.name!r}: retrieve_image failed: {status!r}")
        bgra = mat.get_data()
        if bgra.ndim != 3 or bgra.shape[2] != 4:
            raise CameraError(f"camera {self.cfg.name!r}: expected BGRA, got {bgra.shape}")
        rgb = np.ascontiguousarray(bgra[:, :, 2::-1])  # B,G,R,A -> R,G,B (copies)
        stamp = arrival
        if not self.cfg.playback:
            ns = cam.get_timestamp(sl.TIME_REFERENCE.IMAGE).get_nanoseconds()
            converted = wall_to_monotonic(ns / 1e9)
            stamp = converted if converted is not None else arrival
        return rgb, stamp

    def close(self) -> None:
        idle = self._grabbing.acquire(timeout=_CLOSE_WAIT_S)
        if not idle:
            log.warning("camera %r: closing while a grab is still running", self.cfg.name)
        try:
            with self._lock:
                self._close_locked()
        finally:
            if idle:
                self._grabbing.release()

    def _close_locked(self) -> None:
        cam, self._cam = self._cam, None
        self._mat = self._runtime = None
        if cam is not None:
            try:
                cam.close()
            except Exception as err:  # noqa: BLE001 - closing a vanished camera may fail
                log.debug("camera %r: close failed: %s", self.cfg.name, err)
