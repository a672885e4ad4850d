"""RealSenseCamera on real librealsense code paths without hardware.

Frames are injected into an ``rs.software_device`` (a colour sensor and stream built here) and
read back through :class:`RealSenseCamera` (``device=``), its serial lookup (a recording loaded
into an ``rs.context`` is listed like a connected device) and ``rs.recorder`` + playback
(``playback=``). pyrealsense2 is not faked. librealsense 2.59 records only rosbag2 ``.db3``
files, so ``.bag`` playback is not exercised here.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlinf_user.robots.cameras.base import (
    CameraConfig,
    CameraError,
    CameraNotFoundError,
    EndOfStream,
    crop_resize,
)
from rlinf_user.robots.cameras.capture import CaptureThread
from rlinf_user.robots.cameras.realsense import RealSenseCamera

rs = pytest.importorskip("pyrealsense2")
pytestmark = pytest.mark.timeout(60)

W, H, FPS = 64, 48, 30
SERIAL = "SW0001"


class SoftwareColourDevice:
    """An ``rs.software_device`` with one colour sensor streaming ``W x H @ FPS`` in ``fmt``."""

    def __init__(self, fmt: str = "rgb8", serial: str = SERIAL):
        self.device = rs.software_device()
        self.device.register_info(rs.camera_info.serial_number, serial)
        self.device.register_info(rs.camera_info.name, "software colour camera")
        self.sensor = self.device.add_sensor("RGB Camera")
        stream = rs.video_stream()
        stream.type, stream.index, stream.uid = rs.stream.color, 0, 1
        stream.width, stream.height, stream.fps, stream.bpp = W, H, FPS, 3
        stream.fmt = getattr(rs.format, fmt)
        intrinsics = rs.intrinsics()
        intrinsics.width, intrinsics.height = W, H
        intrinsics.fx = intrinsics.fy = 50.0
        intrinsics.ppx, intrinsics.ppy = W / 2, H / 2
        stream.intrinsics = intrinsics
        self.profile = self.sensor.add_video_stream(stream).as_video_stream_profile()

    def inject(self, pixels: np.ndarray, number: int, stamp_ms: float, domain=None) -> None:
        frame = rs.software_video_frame()
        frame.pixels = np.ascontiguousarray(pixels)
        frame.bpp, frame.stride = 3, W * 3
        frame.timestamp = stamp_ms
        frame.domain = domain if domain is not None else rs.timestamp_domain.system_time
        frame.frame_number = number
        frame.profile = self.profile
        self.sensor.on_video_frame(frame)


def _images(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(42)
    return [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(n)]


def _cfg(**kw) -> CameraConfig:
    return CameraConfig(name="sw", width=W, height=H, fps=FPS, stall_timeout_s=0.5, **kw)


@pytest.mark.parametrize("fmt", ["rgb8", "bgr8"])
def test_frames_round_trip_byte_exact_with_converted_stamps(fmt):
    sw = SoftwareColourDevice(fmt)
    cam = RealSenseCamera(_cfg(), device=sw.device)
    cam.open()
    try:
        assert cam.serial == SERIAL
        for k, img in enumerate(_images(4)):
            injected = time.monotonic()
            sw.inject(img, k, time.time() * 1e3 - 20.0)  # exposed 20 ms before injection
            rgb, stamp = cam.grab(1.0)
            expected = img if fmt == "rgb8" else img[:, :, ::-1]
            assert rgb.dtype == np.uint8 and np.array_equal(rgb, expected)
            assert abs(stamp - (injected - 0.020)) < 0.003
        before = time.monotonic()  # device clock: stamped at arrival instead
        sw.inject(_images(1)[0], 9, 12345.0, rs.timestamp_domain.hardware_clock)
        _, stamp = cam.grab(1.0)
        assert before <= stamp <= time.monotonic()
        cam.close()
        cam.open()  # as the capture thread does after a failure
        sw.inject(_images(1)[0], 10, time.time() * 1e3)
        rgb, _ = cam.grab(1.0)
        assert np.array_equal(rgb, _images(1)[0] if fmt == "rgb8" else _images(1)[0][:, :, ::-1])
    finally:
        cam.close()


def test_capture_thread_over_software_device():
    sw = SoftwareColourDevice()
    cfg = _cfg(crop=(8, 0, 48, 48), resize=(24, 24))
    images = _images(5)
    with CaptureThread(RealSenseCamera(cfg, device=sw.device)) as cap:
        time.sleep(0.05)  # let the capture thread open the sensor
        for k, img in enumerate(images):
            sw.inject(img, k, time.time() * 1e3)
            frame = cap.async_read(timeout=2.0)
            assert np.array_equal(frame.image, crop_resize(img, cfg.crop, cfg.resize))
        assert cap.stats().frames == 5 and cap.stats().errors == 0
        # the driver's intrinsics (fx 50, centre W/2, H/2), moved by the crop and scaled by the resize
        info = cap.camera_info()
        intr = info["intrinsics"]
        assert info["serial"] == SERIAL and intr["source"] == "realsense"
        assert (intr["width"], intr["height"]) == (24, 24) and intr["fx"] == pytest.approx(50.0 * 24 / 48)
        assert intr["cx"] == pytest.approx((W / 2 - 8 + 0.5) * 24 / 48 - 0.5)


def test_unavailable_mode_lists_the_offered_ones():
    sw = SoftwareColourDevice()
    cfg = CameraConfig(name="sw", width=1280, height=720, fps=30)
    with pytest.raises(CameraError, match="offered: 64x48@30 rgb8"):
        RealSenseCamera(cfg, device=sw.device).open()


def _record(path, images) -> None:
    sw = SoftwareColourDevice()
    recorder = rs.recorder(str(path), sw.device)
    sensor = recorder.query_sensors()[0]
    queue = rs.frame_queue(len(images) + 1)
    sensor.open(sensor.get_stream_profiles()[0])
    sensor.start(queue)
    for k, img in enumerate(images):  # at the stream's rate: playback replays arrival times
        sw.inject(img, k, 1000.0 + k * 1e3 / FPS, rs.timestamp_domain.hardware_clock)
        time.sleep(1.0 / FPS)
    time.sleep(0.5)  # the recorder writes asynchronously; stopping earlier loses frames
    sensor.stop()
    sensor.close()
    del recorder, sensor


def test_record_then_playback_through_the_same_path(tmp_path):
    path = tmp_path / "session.db3"
    images = _images(6)
    _record(path, images)
    frames = []
    with CaptureThread(RealSenseCamera(_cfg(playback=str(path)))) as cap:
        with pytest.raises(EndOfStream):
            while True:
                frames.append(cap.async_read(timeout=2.0))
        assert cap.stats().eof and cap.camera.serial == SERIAL
    assert len(frames) == len(images)  # real-time playback at 30 fps: nothing skipped
    for frame, img in zip(frames, images):
        assert np.array_equal(frame.image, img)
    assert all(b.stamp - a.stamp > 0.02 for a, b in zip(frames, frames[1:]))  # paced


def test_serial_lookup_selects_and_lists_devices(tmp_path):
    path = tmp_path / "session.db3"
    images = _images(2)
    _record(path, images)
    ctx = rs.context()
    recording = ctx.load_device(str(path))  # listed like a connected camera while alive
    with pytest.raises(CameraNotFoundError, match=f"serial 0000; found: .*{SERIAL}"):
        RealSenseCamera(_cfg(serial="0000"), context=ctx).open()
    cam = RealSenseCamera(_cfg(serial=SERIAL), context=ctx)
    cam.open()
    try:
        rgb, _ = cam.grab(2.0)
        assert np.array_equal(rgb, images[0])
    finally:
        cam.close()
    del recording
    with pytest.raises(CameraNotFoundError, match="serial 0000; found: "):
        RealSenseCamera(_cfg(serial="0000")).open()  # the machine's real devices, if any
