"""Intel RealSense colour camera on ``pyrealsense2``: a live device, a recording, or a device
handed in (``device=``, e.g. an ``rs.software_device`` in tests).

All three go through one sensor-level path: choose the sensor that offers a colour profile at
``width x height @ fps`` (RGB8 preferred; BGR8, RGBA8 and BGRA8 are converted), open it, start it
into a small ``rs.frame_queue`` (a full queue drops its oldest frame, so the newest survives)
and grab with ``frame_queue.try_wait_for_frame`` in 100 ms slices up to the grab timeout. The
sensor API is used rather than ``rs.pipeline`` because it is the path that live devices,
recordings and software devices share: librealsense 2.59 (and 2.55, as reported upstream) does
not list a software device added to a context, so a pipeline cannot select one, and tests would
otherwise exercise a different path from the robot.

Device selection: ``serial`` picks the device; without one, a single connected device is used.
A missing serial raises :class:`~.base.CameraNotFoundError` listing the serials found.

Playback: ``playback: path`` replays a recording (the rosbag2 ``.db3`` that ``rs.recorder``
writes in 2.59, or a legacy ROS1 ``.bag``) in real time, i.e. paced as recorded, like the live
camera. Non-real-time playback is not offered: with a small queue and a slower consumer,
librealsense 2.59 was seen to deadlock. The end of the recording raises
:class:`~.base.EndOfStream`. Stop a recorder about 0.5 s after the last frame: it writes
asynchronously and loses the tail otherwise.

Stamps (seconds, ``time.monotonic()``): for frames in the ``system_time`` or ``global_time``
domains (host wall-clock milliseconds; ``global_time`` is the device's hardware timestamp that
librealsense maps onto the host clock, the D400 default) the SDK timestamp is moved onto the
monotonic clock with :func:`~.base.wall_to_monotonic`. ``hardware_clock`` frames (device clock,
unrelated to the host) and played-back frames (recorded times) are stamped with the monotonic
time at which ``try_wait_for_frame`` returned them.
"""

from __future__ import annotations

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
    CameraTimeoutError,
    EndOfStream,
    wall_to_monotonic,
)

log = logging.getLogger(__name__)

# Colour formats accepted, best first, and how to turn each into RGB.
_FORMATS = ("rgb8", "bgr8", "rgba8", "bgra8")
_SLICE_S = 0.1


def _rs() -> Any:
    try:
        import pyrealsense2 as rs
    except ImportError as err:
        raise CameraError(
            "pyrealsense2 is not installed; install it with `pip install 'rlinf-user[realsense]'`"
        ) from err
    return rs


def _info(rs: Any, device: Any, key: Any) -> str | None:
    return device.get_info(key) if device.supports(key) else None


def list_serials(context: Any = None) -> list[str]:
    """Serial numbers of the RealSense devices in ``context`` (default: all connected)."""
    rs = _rs()
    ctx = context if context is not None else rs.context()
    return [_info(rs, d, rs.camera_info.serial_number) or "?" for d in ctx.query_devices()]


class RealSenseCamera(Camera):
    """See the module docstring. ``device``: an already-created ``rs.device`` to stream from
    (skips the serial lookup); ``context``: the ``rs.context`` to look serials up in."""

    def __init__(
        self, cfg: CameraConfig, *, device: Any = None, context: Any = None, queue_size: int = 2
    ):
        super().__init__(cfg)
        self._given_device = device
        self._given_context = context
        self._queue_size = queue_size
        self._lock = threading.Lock()  # open/close may come from different threads
        self._device: Any = None
        self._sensor: Any = None
        self._queue: Any = None
        self._playback: Any = None
        self._format: str | None = None
        self._delivered = False
        self._serial: str | None = None

    @property
    def serial(self) -> str | None:
        return self._serial or self.cfg.serial

    def intrinsics(self) -> dict | None:
        """The colour profile's factory intrinsics (librealsense ``rs2_intrinsics``)."""
        profile = getattr(self, "_profile", None)
        if profile is None:
            return None
        i = profile.as_video_stream_profile().get_intrinsics()
        return {"width": int(i.width), "height": int(i.height), "fx": float(i.fx), "fy": float(i.fy),
                "cx": float(i.ppx), "cy": float(i.ppy), "dist": [float(c) for c in i.coeffs],
                "model": str(i.model), "source": "realsense"}  # fmt: skip

    def open(self) -> None:
        rs = _rs()
        with self._lock:
            self._close_locked()
            device = self._resolve_device(rs)
            sensor, profile, fmt = self._select_colour(rs, device)
            queue = rs.frame_queue(self._queue_size)
            sensor.open(profile)
            try:
                sensor.start(queue)
            except Exception:
                sensor.close()
                raise
            self._device, self._sensor, self._queue, self._format = device, sensor, queue, fmt
            self._profile = profile
            self._playback = device.as_playback() if device.is_playback() else None
            self._delivered = False
            self._serial = _info(rs, device, rs.camera_info.serial_number)

    def _resolve_device(self, rs: Any) -> Any:
        cfg = self.cfg
        if self._given_device is not None:
            return self._given_device
        if cfg.playback:
            path = os.fspath(cfg.playback)
            if not os.path.isfile(path):
                raise CameraNotFoundError(f"camera {cfg.name!r}: recording {path!r} not found")
            device = rs.context().load_device(path)  # a fresh context per open
            device.as_playback().set_real_time(True)
            recorded = _info(rs, device, rs.camera_info.serial_number)
            if cfg.serial and recorded != cfg.serial:
                log.warning(
                    "camera %r: recording %s is from serial %s, config says %s",
                    cfg.name, path, recorded, cfg.serial,
                )  # fmt: skip
            return device
        ctx = self._given_context if self._given_context is not None else rs.context()
        devices = list(ctx.query_devices())
        serials = [_info(rs, d, rs.camera_info.serial_number) or "?" for d in devices]
        found = ", ".join(serials) or "none"
        if cfg.serial is None:
            if len(devices) == 1:
                return devices[0]
            raise CameraNotFoundError(
                f"camera {cfg.name!r}: set a serial to choose a RealSense device; found: {found}"
            )
        for device, serial in zip(devices, serials):
            if serial == cfg.serial:
                return device
        raise CameraNotFoundError(
            f"camera {cfg.name!r}: no RealSense device with serial {cfg.serial}; found: {found}"
        )

    def _select_colour(self, rs: Any, device: Any) -> tuple[Any, Any, str]:
        cfg = self.cfg
        want = (cfg.width, cfg.height, cfg.fps)
        offered: set[str] = set()
        best: tuple[int, Any, Any, str] | None = None
        for sensor in device.query_sensors():
            for profile in sensor.get_stream_profiles():
                if profile.stream_type() != rs.stream.color:
                    continue
                if not profile.is_video_stream_profile():
                    continue
                video = profile.as_video_stream_profile()
                fmt = profile.format().name
                have = (video.width(), video.height(), profile.fps())
                offered.add(f"{have[0]}x{have[1]}@{have[2]} {fmt}")
                if have == want and fmt in _FORMATS:
                    rank = _FORMATS.index(fmt)
                    if best is None or rank < best[0]:
                        best = (rank, sensor, video, fmt)
        if best is None:
            raise CameraError(
                f"camera {cfg.name!r}: no colour stream {cfg.width}x{cfg.height}@{cfg.fps} "
                f"in {'/'.join(_FORMATS)}; offered: {', '.join(sorted(offered)) or 'none'}"
            )
        return best[1], best[2], best[3]

    def grab(self, timeout: float | None = None) -> tuple[np.ndarray, float]:
        rs = _rs()
        queue, fmt, playback = self._queue, self._format, self._playback
        if queue is None:
            raise CameraError(f"camera {self.cfg.name!r} is not open")
        limit = self.cfg.stall_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CameraTimeoutError(f"camera {self.cfg.name!r}: no frame within {limit} s")
            ok, frame = queue.try_wait_for_frame(max(1, int(min(remaining, _SLICE_S) * 1e3)))
            if ok:
                break
            if self._queue is not queue:
                raise CameraError(f"camera {self.cfg.name!r} was closed during grab")
            if (
                playback is not None
                and self._delivered
                and playback.current_status() == rs.playback_status.stopped
            ):
                raise EndOfStream(f"camera {self.cfg.name!r}: recording {self.cfg.playback} ended")
        while True:  # more queued: serve the newest
            newer = queue.poll_for_frame()
            if not newer:
                break
            frame = newer
        arrival = time.monotonic()
        self._delivered = True
        rgb = _to_rgb(frame.as_video_frame(), fmt)
        stamp = arrival
        if playback is None and frame.get_frame_timestamp_domain() in (
            rs.timestamp_domain.system_time,
            rs.timestamp_domain.global_time,
        ):
            converted = wall_to_monotonic(frame.get_timestamp() / 1e3)
            stamp = converted if converted is not None else arrival
        return rgb, stamp

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        sensor = self._sensor
        self._sensor = self._queue = self._device = self._playback = None
        if sensor is None:
            return
        for step in (sensor.stop, sensor.close):
            try:
                step()
            except Exception as err:  # noqa: BLE001 - a vanished device cannot be stopped
                log.debug("camera %r: %s failed: %s", self.cfg.name, step.__name__, err)


def _to_rgb(video: Any, fmt: str | None) -> np.ndarray:
    """Copy a colour frame out of the SDK's buffer (which returns to its pool) as RGB."""
    height, width = video.get_height(), video.get_width()
    channels = 4 if fmt in ("rgba8", "bgra8") else 3
    stride = video.get_stride_in_bytes()
    raw = np.frombuffer(video.get_data(), dtype=np.uint8)
    rows = raw[: height * stride].reshape(height, stride)[:, : width * channels]
    pixels = rows.reshape(height, width, channels)
    if fmt == "rgb8":
        return pixels.copy()
    if fmt == "bgr8":
        return np.ascontiguousarray(pixels[:, :, ::-1])
    if fmt == "rgba8":
        return np.ascontiguousarray(pixels[:, :, :3])
    return np.ascontiguousarray(pixels[:, :, 2::-1])
