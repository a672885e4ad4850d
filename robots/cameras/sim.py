"""Cameras without hardware: a wrapped renderer (:class:`SimCamera`) and a deterministic
moving test pattern (:class:`SyntheticCamera`), both served through the same
:class:`~.capture.CaptureThread` path as the real cameras.

Both pace themselves at ``cfg.fps`` frames/s on ``time.monotonic()`` (``fps`` 0: as fast as the
consumer grabs), skipping slots rather than bursting after a delay. Stamps are the monotonic
time at which the frame is produced: for :class:`SimCamera` the moment just before ``render``
is called, i.e. the simulated state the image shows.

Threading: ``render`` is called from the capture thread. OpenGL/EGL contexts (MuJoCo's
``mujoco.Renderer``) are current in one thread only, and ``MjData`` must not be read while the
simulation steps it, so either create the renderer inside the callable on its first call and
synchronise with the simulation yourself, or, simpler, let the simulation render after each
step and pass a callable that returns a copy of its last image.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from rlinf_user.robots.cameras.base import (
    Camera,
    CameraConfig,
    CameraError,
    CameraTimeoutError,
    as_rgb8,
)


class _Pacer:
    """Releases calls on a fixed period (seconds) on the monotonic clock."""

    def __init__(self, fps: float):
        self.period = 1.0 / fps if fps > 0 else 0.0
        self._next: float | None = None
        self._wake = threading.Event()  # set by close() to cut a wait short

    def reset(self) -> None:
        self._next = None
        self._wake.clear()

    def cancel(self) -> None:
        self._wake.set()

    def wait(self, timeout: float | None) -> None:
        if self.period == 0.0:
            return
        now = time.monotonic()
        if self._next is None:
            self._next = now
        delay = self._next - now
        if timeout is not None and delay > timeout:
            self._wake.wait(timeout)
            raise CameraTimeoutError(f"next frame due in {delay:.3f} s, after the timeout")
        if delay > 0 and self._wake.wait(delay):
            raise CameraError("camera closed during grab")
        self._next += self.period
        if self._next < time.monotonic() - self.period:  # fell behind: skip missed slots
            self._next = time.monotonic()


class SimCamera(Camera):
    """Serves ``render()`` (an ``H x W x 3``/``x 4``/grey image, uint8 or float in [0, 1])."""

    def __init__(self, cfg: CameraConfig, render: Callable[[], np.ndarray] | None = None,
                 intrinsics: dict | None = None):  # fmt: skip
        super().__init__(cfg)
        if render is None:
            raise CameraError(f"camera {cfg.name!r}: a sim camera needs render=<callable>")
        self._render = render
        self._intrinsics = intrinsics  # the renderer's pinhole model, where it has one
        self._pacer = _Pacer(cfg.fps)
        self._open = False

    @property
    def serial(self) -> str | None:
        return self.cfg.serial or f"sim:{self.cfg.name}"

    def intrinsics(self) -> dict | None:
        return None if self._intrinsics is None else dict(self._intrinsics)

    def open(self) -> None:
        self._pacer.reset()
        self._open = True

    def grab(self, timeout: float | None = None) -> tuple[np.ndarray, float]:
        if not self._open:
            raise CameraError(f"camera {self.cfg.name!r} is not open")
        self._pacer.wait(timeout)
        stamp = time.monotonic()
        return as_rgb8(self._render()), stamp

    def close(self) -> None:
        self._open = False
        self._pacer.cancel()


def synthetic_frame(index: int, height: int, width: int) -> np.ndarray:
    """Frame ``index`` of the test pattern: red ramps left to right, green top to bottom,
    blue is ``(x + y + 4 * index) mod 256`` and a white square moves diagonally."""
    return _Pattern(height, width).frame(index)


class _Pattern:
    def __init__(self, height: int, width: int):
        y, x = np.mgrid[0:height, 0:width]
        self.base = np.empty((height, width, 3), np.uint8)
        self.base[:, :, 0] = x * 255 // max(width - 1, 1)
        self.base[:, :, 1] = y * 255 // max(height - 1, 1)
        self.base[:, :, 2] = (x + y) % 256
        self.side = max(2, min(height, width) // 8)

    def frame(self, index: int) -> np.ndarray:
        img = self.base.copy()
        img[:, :, 2] += np.uint8((4 * index) % 256)  # uint8 arithmetic wraps
        h, w = img.shape[:2]
        s = self.side
        cx = (3 * index) % max(w - s, 1)
        cy = (2 * index) % max(h - s, 1)
        img[cy : cy + s, cx : cx + s] = 255
        return img


class SyntheticCamera(Camera):
    """Deterministic moving pattern of ``cfg.width x cfg.height`` at ``cfg.fps`` (benchmarks,
    tests). Frame ``k`` after :meth:`open` equals ``synthetic_frame(k, height, width)``."""

    def __init__(self, cfg: CameraConfig):
        super().__init__(cfg)
        self._pattern: _Pattern | None = None
        self._pacer = _Pacer(cfg.fps)
        self._index = 0

    @property
    def serial(self) -> str | None:
        return self.cfg.serial or f"synthetic:{self.cfg.name}"

    def open(self) -> None:
        self._pattern = _Pattern(self.cfg.height, self.cfg.width)
        self._pacer.reset()
        self._index = 0

    def grab(self, timeout: float | None = None) -> tuple[np.ndarray, float]:
        pattern = self._pattern
        if pattern is None:
            raise CameraError(f"camera {self.cfg.name!r} is not open")
        self._pacer.wait(timeout)
        stamp = time.monotonic()
        img = pattern.frame(self._index)
        self._index += 1
        return img, stamp

    def close(self) -> None:
        self._pattern = None
        self._pacer.cancel()
