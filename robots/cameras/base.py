"""Camera configuration, stamped frames, the :class:`Camera` interface and image operations.

Clocks and units
----------------
* Every ``stamp`` is seconds on this host's ``time.monotonic()`` clock, the clock the edge
  control loop stamps arm states with, so frame ages and camera-to-arm offsets are plain
  differences. Each :meth:`Camera.grab` stamps its frame as close to the exposure as its SDK
  allows: SDK timestamps on the host wall clock (RealSense ``system_time``/``global_time``
  domains, ZED ``TIME_REFERENCE.IMAGE``) are moved onto the monotonic clock by
  :func:`wall_to_monotonic`; a device-only clock or a recorded timestamp falls back to the
  monotonic time at which the frame reached the host.
* Sizes are pixels. ``crop`` is ``(x, y, w, h)`` in capture pixels and is applied first;
  ``resize`` is the output ``(height, width)``. Images are ``uint8`` ``H x W x 3`` RGB.
* Durations (``stall_timeout_s``, ``reopen_backoff_s``, ``max_age``, ``timeout``) are seconds.

The capture thread that serves frames lives in :mod:`.capture` (``CaptureThread`` and
``CaptureStats`` can be imported from here too); :func:`make_camera` builds a camera from its
configuration and imports the SDK module it needs only then; :func:`start_streams` starts one
capture thread per configured camera.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import io
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rlinf_user.registry import Registry

CAMERAS = Registry(
    "camera",
    {
        "realsense": "rlinf_user.robots.cameras.realsense:RealSenseCamera",
        "zed": "rlinf_user.robots.cameras.zed:ZedCamera",
        "sim": "rlinf_user.robots.cameras.sim:SimCamera",
        "synthetic": "rlinf_user.robots.cameras.sim:SyntheticCamera",
    },
    entry_points="rlinf_user.cameras",
)


class CameraError(RuntimeError):
    """A camera could not be opened or read."""


class CameraNotFoundError(CameraError):
    """The requested device (serial, file) is absent; the message lists what was found."""


class CameraTimeoutError(CameraError, TimeoutError):
    """No frame arrived within the allowed time."""


class EndOfStream(CameraError):
    """A recording being played back has no more frames."""


class CameraStaleError(CameraError):
    """The newest frame of camera ``name`` is ``age`` seconds old, more than allowed."""

    def __init__(self, name: str, age: float, max_age: float):
        self.name, self.age, self.max_age = name, age, max_age
        if math.isinf(age):
            super().__init__(f"camera {name!r} has delivered no frame yet")
        else:
            super().__init__(
                f"camera {name!r}: newest frame is {age * 1e3:.0f} ms old "
                f"(allowed {max_age * 1e3:.0f} ms)"
            )


@dataclasses.dataclass
class CameraConfig:
    """One camera. Sizes in pixels, rates in frames/s, durations in seconds.

    ``stall_timeout_s``: a camera that delivers nothing for this long is reported, closed and
    reopened; ``first_frame_timeout_s`` replaces it for the first frame after an open (sensors
    take a while to start). Reopens wait ``reopen_backoff_s``, doubling per consecutive
    failure up to ``max(5 s, reopen_backoff_s)``. ``playback`` replays a recording instead of
    a live device (RealSense ``.bag``/``.db3``, ZED ``.svo``/``.svo2``). ``fps`` 0 means
    unpaced for the sim/synthetic kinds.
    """

    name: str
    kind: str = "realsense"
    serial: str | None = None
    width: int = 640
    height: int = 480
    fps: int = 15
    crop: tuple[int, int, int, int] | None = None
    resize: tuple[int, int] | None = None
    jpeg_quality: int | None = None
    stall_timeout_s: float = 1.0
    reopen_backoff_s: float = 0.5
    first_frame_timeout_s: float = 5.0
    playback: str | None = None

    def __post_init__(self) -> None:
        where = f"camera {self.name!r}"
        if self.serial == "???":
            raise ValueError(f"{where}: serial is required (the preset leaves it as ???)")
        if self.serial is not None:
            self.serial = str(self.serial)
        if self.kind not in CAMERAS:
            raise ValueError(f"{where}: unknown kind {self.kind!r}; known: {', '.join(CAMERAS.names())}")
        if self.width <= 0 or self.height <= 0 or self.fps < 0:
            raise ValueError(f"{where}: width/height must be > 0 and fps >= 0")
        if self.crop is not None:
            self.crop = tuple(int(v) for v in self.crop)  # type: ignore[assignment]
            x, y, w, h = self.crop
            if x < 0 or y < 0 or w <= 0 or h <= 0 or x + w > self.width or y + h > self.height:
                raise ValueError(
                    f"{where}: crop {self.crop} (x, y, w, h) must lie inside the "
                    f"{self.width}x{self.height} capture"
                )
        if self.resize is not None:
            self.resize = tuple(int(v) for v in self.resize)  # type: ignore[assignment]
            if len(self.resize) != 2 or min(self.resize) <= 0:
                raise ValueError(f"{where}: resize must be (height, width) > 0")
        if self.jpeg_quality is not None and not 1 <= int(self.jpeg_quality) <= 100:
            raise ValueError(f"{where}: jpeg_quality must be in 1..100 or None (raw)")
        if self.stall_timeout_s <= 0 or self.reopen_backoff_s < 0:
            raise ValueError(f"{where}: stall_timeout_s must be > 0, reopen_backoff_s >= 0")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], **overrides: Any) -> CameraConfig:
        """Build from a plain mapping (YAML, ``OmegaConf.to_container``), naming unknown keys."""
        values = {**dict(data), **overrides}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown camera config keys {unknown}; known: {sorted(known)}")
        return cls(**values)

    @property
    def out_shape(self) -> tuple[int, int]:
        """(height, width) of the served image."""
        if self.resize is not None:
            return self.resize
        if self.crop is not None:
            return self.crop[3], self.crop[2]
        return self.height, self.width


@dataclasses.dataclass(frozen=True)
class Frame:
    """One served frame.

    ``image``: read-only ``uint8`` ``H x W x 3`` RGB after crop/resize. ``stamp``: capture time,
    seconds on ``time.monotonic()``. ``seq``: 0, 1, 2, ... per capture thread (gaps never
    occur; lost frames show up in the ``drops`` statistic). ``jpeg``: the image JPEG-encoded
    when the camera has a ``jpeg_quality``.
    """

    image: np.ndarray
    stamp: float
    seq: int
    jpeg: bytes | None = None


def wall_to_monotonic(wall_s: float, max_age_s: float = 1.0) -> float | None:
    """Move a host wall-clock time (seconds since the epoch) onto ``time.monotonic()``.

    The two clocks are read back to back now and the event keeps its age:
    ``monotonic_now - (wall_now - wall_s)``. Returns ``None`` when the age is implausible
    (in the future by more than 5 ms, or older than ``max_age_s``: a recorded or device-clock
    timestamp), in which case the caller uses its own arrival time.
    """
    mono_now = time.monotonic()
    age = time.time() - wall_s
    if age < -0.005 or age > max_age_s:
        return None
    return mono_now - max(age, 0.0)


class Camera(abc.ABC):
    """One camera device (or recording, or renderer). Not thread-safe except as stated.

    ``grab`` blocks for one new frame and returns ``(rgb, stamp)``: an owned ``uint8``
    ``H x W x 3`` RGB array and its capture time on ``time.monotonic()``. ``close`` must be
    idempotent and callable from another thread while ``grab`` blocks (the capture thread's
    watchdog does this to a hung camera), and ``open`` must work again after ``close``.
    """

    def __init__(self, cfg: CameraConfig):
        self.cfg = cfg

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def serial(self) -> str | None:
        """Serial of the opened device, else the configured one."""
        return self.cfg.serial

    def intrinsics(self) -> dict[str, Any] | None:
        """The sensor's pinhole model at the grabbed size, as the driver reports it
        (``width, height, fx, fy, cx, cy, dist``), or ``None`` when it has none (yet: real
        devices know theirs once open)."""
        return None

    @abc.abstractmethod
    def open(self) -> None:
        """Start streaming; raise :class:`CameraError` (or the SDK's error) if it cannot."""

    @abc.abstractmethod
    def grab(self, timeout: float | None = None) -> tuple[np.ndarray, float]:
        """Block for the next frame, at most ``timeout`` s where the SDK allows a limit."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop streaming and release the device."""

    def __enter__(self) -> Camera:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_camera(cfg: CameraConfig, **kwargs: Any) -> Camera:
    """The camera for ``cfg.kind`` (:data:`CAMERAS`); ``kwargs`` go to its constructor
    (e.g. ``render=`` for sim)."""
    return CAMERAS.get(cfg.kind)(cfg, **kwargs)


def start_streams(
    configs: Iterable[Mapping[str, Any] | CameraConfig],
    camera_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    wait_s: float | None = None,
) -> dict[str, Any]:
    """Build and start one :class:`~.capture.CaptureThread` per camera, keyed by name.

    ``configs``: :class:`CameraConfig` objects or plain mappings (``configs/camera/*.yaml``).
    ``camera_kwargs``: constructor arguments per camera name (e.g. ``{"scene": {"render": f}}``).
    ``wait_s``: if given, wait that long (seconds) for every camera's first frame and raise
    :class:`CameraError` naming the camera and its last error if one has none. Cameras
    started before a failure are stopped again.
    """
    from rlinf_user.robots.cameras.capture import CaptureThread

    streams: dict[str, Any] = {}
    try:
        for item in configs:
            cfg = item if isinstance(item, CameraConfig) else CameraConfig.from_mapping(item)
            if cfg.name in streams:
                raise ValueError(f"two cameras are named {cfg.name!r}")
            kwargs = dict((camera_kwargs or {}).get(cfg.name, {}))
            streams[cfg.name] = CaptureThread(make_camera(cfg, **kwargs)).start()
        if wait_s is not None:
            deadline = time.monotonic() + wait_s
            for name, stream in streams.items():
                while stream.latest() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                if stream.latest() is None:
                    raise CameraError(
                        f"camera {name!r}: no frame within {wait_s} s "
                        f"(last error: {stream.stats().last_error})"
                    )
    except BaseException:
        for stream in streams.values():
            stream.stop(timeout=1.0)
        raise
    return streams


# ---- image operations -------------------------------------------------------------------


@functools.cache
def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        return None
    return cv2


def image_backend(backend: str | None = None) -> str:
    """``"cv2"`` (OpenCV, preferred where installed) or ``"pil"`` (Pillow)."""
    if backend is None:
        return "cv2" if _cv2() is not None else "pil"
    if backend == "cv2" and _cv2() is None:
        raise CameraError("image backend 'cv2' requested but OpenCV is not installed")
    if backend not in ("cv2", "pil"):
        raise ValueError(f"unknown image backend {backend!r}; use 'cv2' or 'pil'")
    return backend


def adjust_intrinsics(
    intr: dict[str, Any] | None, crop: tuple[int, int, int, int] | None, resize: tuple[int, int] | None
) -> dict[str, Any] | None:
    """The pinhole model of the served image after ``crop`` (x, y, w, h) and ``resize``
    (height, width), as :func:`crop_resize` transforms the pixels (pixel centres aligned)."""
    if intr is None:
        return None
    out = dict(intr)
    if crop is not None:
        x, y, w, h = crop
        out.update(cx=out["cx"] - x, cy=out["cy"] - y, width=w, height=h)
    if resize is not None:
        out_h, out_w = resize
        sx, sy = out_w / out["width"], out_h / out["height"]
        out.update(fx=out["fx"] * sx, fy=out["fy"] * sy, cx=(out["cx"] + 0.5) * sx - 0.5,
                   cy=(out["cy"] + 0.5) * sy - 0.5, width=out_w, height=out_h)  # fmt: skip
    return out


def crop_resize(
    rgb: np.ndarray,
    crop: tuple[int, int, int, int] | None,
    resize: tuple[int, int] | None,
    backend: str | None = None,
) -> np.ndarray:
    """Crop ``(x, y, w, h)`` then resize to ``(height, width)``; returns a contiguous array.

    Shrinking averages pixel areas (OpenCV ``INTER_AREA`` / Pillow ``BOX``) so that fine texture
    does not alias; enlarging is bilinear.
    """
    img = rgb
    if crop is not None:
        x, y, w, h = crop
        height, width = img.shape[:2]
        if x + w > width or y + h > height:
            raise CameraError(f"crop {crop} (x, y, w, h) lies outside the {width}x{height} image")
        img = img[y : y + h, x : x + w]
    if resize is not None and img.shape[:2] != tuple(resize):
        out_h, out_w = resize
        shrink = out_h <= img.shape[0] and out_w <= img.shape[1]
        img = np.ascontiguousarray(img)
        if image_backend(backend) == "cv2":
            cv2 = _cv2()
            interp = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
            img = cv2.resize(img, (out_w, out_h), interpolation=interp)
        else:
            from PIL import Image

            resample = Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR
            img = np.asarray(Image.fromarray(img).resize((out_w, out_h), resample))
    return np.ascontiguousarray(img)


def encode_jpeg(rgb: np.ndarray, quality: int, backend: str | None = None) -> bytes:
    """JPEG bytes (baseline, 4:2:0) of an RGB ``uint8`` image."""
    if image_backend(backend) == "cv2":
        cv2 = _cv2()
        bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
        ok, buf = cv2.imencode(".jpg", bgr, [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
        if not ok:
            raise CameraError("OpenCV failed to encode a JPEG")
        return buf.tobytes()
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=int(quality))
    return out.getvalue()


def as_rgb8(image: np.ndarray) -> np.ndarray:
    """Coerce a rendered image (RGB/RGBA/grey, uint8 or float in [0, 1]) to owned RGB uint8."""
    img = np.asarray(image)
    if img.dtype != np.uint8:
        img = (np.clip(img.astype(np.float32), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    elif img.ndim != 3 or img.shape[2] not in (3, 4):
        raise CameraError(f"expected an H x W x 3 image, got shape {img.shape}")
    return np.array(img[:, :, :3], dtype=np.uint8, order="C", copy=True)


def __getattr__(name: str) -> Any:
    """``CaptureThread``/``CaptureStats`` live in :mod:`.capture`; re-exported here lazily."""
    if name in ("CaptureThread", "CaptureStats"):
        from rlinf_user.robots.cameras import capture

        return getattr(capture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
