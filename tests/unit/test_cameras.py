"""Edge camera layer: image ops, the capture thread's failure handling, sim cameras, and the
ZED path against ``tests/fakes/pyzed_sl.py``, a test double that stands in for the ZED SDK
(``pyzed.sl`` needs Stereolabs' installer and a GPU, so it is injected into ``sys.modules``)."""

from __future__ import annotations

import io
import math
import pathlib
import sys
import threading
import time
import types

import numpy as np
import pytest
import yaml
from PIL import Image

from rlinf_user.robots.cameras.base import (
    Camera,
    CameraConfig,
    CameraError,
    CameraNotFoundError,
    CameraStaleError,
    CameraTimeoutError,
    EndOfStream,
    _cv2,
    crop_resize,
    encode_jpeg,
    make_camera,
    start_streams,
)
from rlinf_user.robots.cameras.capture import CaptureThread
from rlinf_user.robots.cameras.sim import SimCamera, SyntheticCamera, synthetic_frame

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = ["pil"] + (["cv2"] if _cv2() is not None else [])


def _cfg(**kw) -> CameraConfig:
    base = dict(name="cam", kind="synthetic", width=64, height=48, fps=0, stall_timeout_s=0.2)
    base["first_frame_timeout_s"] = kw.pop("first_frame_timeout_s", 0.2)
    base["reopen_backoff_s"] = kw.pop("reopen_backoff_s", 0.01)
    return CameraConfig(**{**base, **kw})


# ---- configuration --------------------------------------------------------------------


def test_config_validates_and_loads_presets():
    with pytest.raises(ValueError, match="crop"):
        _cfg(crop=(40, 0, 40, 48))
    with pytest.raises(ValueError, match="serial is required"):
        _cfg(serial="???")
    with pytest.raises(ValueError, match="unknown camera config keys"):
        CameraConfig.from_mapping({"name": "a", "exposure": 3})
    for preset in ("realsense_d435", "zed2"):
        data = yaml.safe_load((ROOT / "configs" / "camera" / f"{preset}.yaml").read_text())
        assert data["serial"] == "???"
        with pytest.raises(ValueError, match="serial is required"):
            CameraConfig.from_mapping(data)
        cfg = CameraConfig.from_mapping(data, serial=12345)
        assert cfg.serial == "12345" and cfg.resize == (128, 128) and cfg.jpeg_quality == 90
        assert cfg.crop is None and cfg.out_shape == (128, 128)
    d435 = yaml.safe_load((ROOT / "configs/camera/realsense_d435.yaml").read_text())
    assert (d435["width"], d435["height"], d435["fps"]) == (640, 480, 15)


# ---- image operations -----------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_crop_is_exact_and_area_resize_matches_block_mean(backend):
    img = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    cropped = crop_resize(img, (64, 0, 480, 480), None, backend)
    assert np.array_equal(cropped, img[:, 64:544]) and cropped.flags.c_contiguous
    out = crop_resize(img, (64, 0, 480, 480), (120, 120), backend)
    ref = img[:, 64:544].reshape(120, 4, 120, 4, 3).astype(np.float64).mean(axis=(1, 3))
    assert out.shape == (120, 120, 3) and out.dtype == np.uint8
    assert np.abs(out - ref).max() <= 1.0
    assert crop_resize(img[:10, :10], None, (20, 30), backend).shape == (20, 30, 3)
    with pytest.raises(CameraError, match="outside"):
        crop_resize(img[:100], (0, 0, 640, 480), None, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jpeg_decodes_close_to_the_image(backend):
    img = crop_resize(synthetic_frame(7, 480, 640), None, (128, 128), backend)
    data = encode_jpeg(img, 90, backend)
    assert data[:2] == b"\xff\xd8"
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int16)
    err = np.abs(decoded - img)
    assert decoded.shape == img.shape and err.mean() < 3.0
    assert len(encode_jpeg(img, 30, backend)) < len(data)


# ---- a camera scripted by the test ----------------------------------------------------


class ScriptedCamera(Camera):
    """Follows ``script`` one grab per step: ``"frame"``, ``("frame", stamp)``, ``"raise"``,
    ``"timeout"`` (honours the limit), ``"hang"`` (ignores it until ``release``), ``"eof"``;
    then frames forever."""

    def __init__(self, cfg, script=(), hang_first_open=False):
        super().__init__(cfg)
        self.script = list(script)
        self.opens = self.closes = 0
        self.hang_first_open = hang_first_open
        self.release = threading.Event()
        self.lock = threading.Lock()

    def open(self):
        self.opens += 1
        if self.hang_first_open and self.opens == 1:
            self.release.wait()

    def grab(self, timeout=None):
        with self.lock:
            step = self.script.pop(0) if self.script else "frame"
        kind, stamp = (step if isinstance(step, tuple) else (step, None))
        if kind == "raise":
            raise OSError("USB transfer failed")
        if kind == "timeout":
            time.sleep(timeout)
            raise CameraTimeoutError("no frame")
        if kind == "hang":
            self.release.wait()
        if kind == "eof":
            raise EndOfStream("done")
        time.sleep(0.002)
        value = 99 if kind == "hang" else self.opens
        img = np.full((self.cfg.height, self.cfg.width, 3), value, np.uint8)
        return img, time.monotonic() if stamp is None else stamp

    def close(self):
        self.closes += 1


def _wait_for(predicate, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_capture_serves_processed_frames_in_order():
    cfg = _cfg(width=640, height=480, fps=200, crop=(80, 0, 480, 480), resize=(128, 128),
               jpeg_quality=90)
    with CaptureThread(SyntheticCamera(cfg)) as cap:
        frames = [cap.async_read(timeout=2.0) for _ in range(5)]
        t_read = time.monotonic()
    seqs = [f.seq for f in frames]
    assert seqs == sorted(set(seqs))
    assert all(b.stamp > a.stamp for a, b in zip(frames, frames[1:]))
    assert 0 <= t_read - frames[-1].stamp < 0.5
    for f in frames:
        expected = crop_resize(synthetic_frame(f.seq, 480, 640), cfg.crop, cfg.resize)
        assert np.array_equal(f.image, expected) and not f.image.flags.writeable
        decoded = np.asarray(Image.open(io.BytesIO(f.jpeg)).convert("RGB")).astype(np.int16)
        assert np.abs(decoded - f.image).mean() < 3.0


def test_read_latest_raises_on_stale_frames_and_async_read_waits_for_newer():
    cam = ScriptedCamera(_cfg(stall_timeout_s=5.0, first_frame_timeout_s=5.0), ["frame", "hang"])
    cap = CaptureThread(cam)
    with pytest.raises(CameraStaleError) as info:
        cap.read_latest(max_age=1.0)
    assert math.isinf(info.value.age)
    cap.start()
    try:
        first = cap.async_read(timeout=2.0)
        assert cap.read_latest(max_age=1.0) is first
        with pytest.raises(CameraTimeoutError):
            cap.async_read(timeout=0.05)  # nothing newer while the camera hangs
        time.sleep(0.06)
        with pytest.raises(CameraStaleError, match="'cam'") as info:
            cap.read_latest(max_age=0.05)
        assert info.value.name == "cam" and info.value.age > 0.05
    finally:
        cam.release.set()
        cap.stop()


def test_raising_camera_is_reopened():
    cam = ScriptedCamera(_cfg(), ["frame", "raise", "raise", "timeout", "frame"])
    with CaptureThread(cam) as cap:
        _wait_for(lambda: cap.stats().frames >= 3)
        stats = cap.stats()
    assert stats.reopens == 3 and cam.opens == 4 and stats.errors == 3 and stats.stalls == 1
    assert "no frame" in stats.last_error or "USB" in stats.last_error


def test_hung_camera_is_reopened_without_blocking_readers():
    cam = ScriptedCamera(_cfg(stall_timeout_s=0.15), ["frame", "hang"])
    cap = CaptureThread(cam).start()
    try:
        cap.async_read(timeout=2.0)
        worst, stale = 0.0, 0
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # the camera is hung for all of this
            t0 = time.perf_counter()
            try:
                cap.read_latest(max_age=0.1)
            except CameraStaleError:
                stale += 1
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.002)
        assert worst < 0.02 and stale > 0
        _wait_for(lambda: cap.stats().reopens >= 1)
        fresh = cap.async_read(timeout=2.0)  # the reopened camera delivers again
        assert fresh.image[0, 0, 0] == 2  # drawn after the second open
        stats = cap.stats()
        assert stats.stalls >= 1 and stats.hung_threads == 1
        assert "did not return" in stats.last_error
        cam.release.set()  # the abandoned grab returns a frame of 99s that must not be served
        served = [cap.async_read(timeout=1.0).image[0, 0, 0] for _ in range(20)]
        _wait_for(lambda: cap.stats().hung_threads == 0)
        assert 99 not in served and cap.read_latest(max_age=1.0).image[0, 0, 0] == 2
    finally:
        cam.release.set()
        cap.stop()


def test_hung_open_is_abandoned_too():
    cam = ScriptedCamera(_cfg(first_frame_timeout_s=0.1), hang_first_open=True)
    with CaptureThread(cam) as cap:
        frame = cap.async_read(timeout=2.0)
        assert frame.image[0, 0, 0] == 2 and "open did not return" in cap.stats().last_error
        cam.release.set()


def test_stop_is_bounded_while_the_camera_hangs():
    cam = ScriptedCamera(_cfg(stall_timeout_s=5.0, first_frame_timeout_s=5.0), ["hang"])
    cap = CaptureThread(cam).start()
    _wait_for(lambda: cam.opens == 1)
    t0 = time.monotonic()
    cap.stop(timeout=0.1)
    assert time.monotonic() - t0 < 1.0 and cam.closes >= 1
    cam.release.set()


def test_drops_from_stamp_gaps_and_strictly_increasing_stamps():
    t0 = time.monotonic()
    script = [("frame", t0), ("frame", t0 + 0.05), ("frame", t0 + 0.20), ("frame", t0 + 0.19)]
    cfg = _cfg(fps=20, stall_timeout_s=5.0, first_frame_timeout_s=5.0)
    cam = ScriptedCamera(cfg, script + ["hang"])
    cap = CaptureThread(cam).start()
    try:
        _wait_for(lambda: cap.stats().frames == 4)
        assert cap.stats().drops == 2  # 0.15 s gap at 20 fps: two frames missing
        last = cap.read_latest(max_age=1.0)  # stamped t0 + 0.19, after t0 + 0.20
        assert last.seq == 3 and t0 + 0.2 < last.stamp < t0 + 0.2001
    finally:
        cam.release.set()
        cap.stop()


def test_end_of_recording_ends_async_read():
    with CaptureThread(ScriptedCamera(_cfg(), ["frame", "frame", "eof"])) as cap:
        cap.async_read(timeout=2.0)
        with pytest.raises(EndOfStream):
            for _ in range(3):
                cap.async_read(timeout=2.0)
        assert cap.stats().eof


def test_start_streams_builds_named_capture_threads():
    configs = [dict(name="a", kind="synthetic", width=64, height=48, fps=100, resize=[16, 16]),
               _cfg(name="b", kind="sim", fps=100)]
    render = {"b": {"render": lambda: np.zeros((48, 64, 3), np.uint8)}}
    streams = start_streams(configs, camera_kwargs=render, wait_s=2.0)
    try:
        assert set(streams) == {"a", "b"} and streams["a"].output_shape == (16, 16, 3)
        assert streams["a"].latest().image.shape == (16, 16, 3)
        stats = dict(streams["a"].stats())  # a mapping too, for telemetry
        assert stats["frames"] >= 1 and stats["name"] == "a"
    finally:
        for stream in streams.values():
            stream.stop()
    with pytest.raises(CameraError, match="no frame within"):
        start_streams([_cfg(kind="sim", fps=1)], {"cam": {"render": lambda: 1 / 0}}, wait_s=0.2)


def test_synthetic_camera_paces_at_fps():
    with CaptureThread(SyntheticCamera(_cfg(fps=50))) as cap:
        frames = [cap.async_read(timeout=1.0) for _ in range(12)]
        stats = cap.stats()
    gaps = np.diff([f.stamp for f in frames])
    assert 35 < stats.fps < 65 and abs(np.median(gaps) - 0.02) < 0.005


def test_sim_camera_serves_a_render_callable():
    calls = []

    def render():
        calls.append(time.monotonic())
        img = np.zeros((48, 64, 4), np.float32)
        img[:, :, 0] = 1.0  # RGBA float
        return img

    cam = make_camera(_cfg(kind="sim", fps=100), render=render)
    assert isinstance(cam, SimCamera)
    with CaptureThread(cam) as cap:
        frame = cap.async_read(timeout=1.0)
    assert frame.image.shape == (48, 64, 3) and (frame.image[:, :, 0] == 255).all()
    assert frame.image[:, :, 1:].max() == 0
    assert any(abs(c - frame.stamp) < 0.005 for c in calls)
    with pytest.raises(CameraError, match="render"):
        make_camera(_cfg(kind="sim"))


# ---- ZED through the SDK double -------------------------------------------------------


@pytest.fixture
def sl(fake_pyzed):
    return fake_pyzed


def _scene(index, height, width):
    return synthetic_frame(index, height, width)


def _zed_cfg(**kw):
    return _cfg(kind="zed", width=672, height=376, fps=100, **kw)


def test_zed_serves_rgb_left_images_with_converted_stamps(sl, monkeypatch):
    sl._plug(1111, lambda i, h, w: np.zeros((h, w, 3), np.uint8))
    sl._plug(2222, _scene)
    inits = []
    real_open = sl.Camera.open

    def spy_open(self, init):
        inits.append(init)
        return real_open(self, init)

    monkeypatch.setattr(sl.Camera, "open", spy_open)
    cam = make_camera(_zed_cfg(serial="2222"))
    cam.open()
    try:
        assert cam.serial == "2222"
        assert inits[0].depth_mode == sl.DEPTH_MODE.NONE
        assert inits[0].camera_resolution == sl.RESOLUTION.VGA and inits[0].camera_fps == 100
        for k in range(3):
            before = time.monotonic()
            rgb, stamp = cam.grab()
            after = time.monotonic()
            assert np.array_equal(rgb, synthetic_frame(k, 376, 672)) and rgb.flags.c_contiguous
            assert before - 0.002 <= stamp <= after  # exposure time on the monotonic clock
    finally:
        cam.close()


def test_zed_errors_name_serials_and_the_sdk_installer(sl, monkeypatch):
    sl._plug(1111, _scene)
    sl._plug(3333, _scene)
    with pytest.raises(CameraNotFoundError, match="1111, 3333"):
        make_camera(_zed_cfg(serial="9999")).open()
    with pytest.raises(CameraError, match="672x376"):
        make_camera(_cfg(kind="zed", width=640, height=480)).open()
    impostor = types.ModuleType("pyzed.sl")  # e.g. the unrelated PyPI package
    monkeypatch.setitem(sys.modules, "pyzed.sl", impostor)
    with pytest.raises(CameraError, match="Stereolabs' installer"):
        make_camera(_zed_cfg()).open()
    monkeypatch.setitem(sys.modules, "pyzed.sl", None)  # import fails
    with pytest.raises(CameraError, match="get_python_api.py"):
        make_camera(_zed_cfg()).open()


def test_zed_svo_playback_ends_with_end_of_stream(sl, tmp_path):
    svo = tmp_path / "session.svo2"
    svo.write_bytes(b"")
    sl._add_svo(str(svo), 4444, 3, 672, 376, _scene)
    frames = []
    with CaptureThread(make_camera(_zed_cfg(playback=str(svo)))) as cap:
        with pytest.raises(EndOfStream):
            while True:
                frames.append(cap.async_read(timeout=2.0))
        assert cap.stats().frames == 3 and cap.stats().eof
    assert frames[-1].seq == 2
    assert np.array_equal(frames[-1].image, synthetic_frame(2, 376, 672))
