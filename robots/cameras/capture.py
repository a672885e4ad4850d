"""The per-camera capture thread: grab continuously, keep the latest frame, never block readers.

One daemon thread per camera grabs, crops/resizes, optionally JPEG-encodes and publishes the
newest :class:`~.base.Frame`; a light watchdog thread per camera wakes every
``min(0.1, stall_timeout_s / 4)`` s. Readers (the robot control loop) take the newest frame
under a lock that is only ever held for a few assignments, so a stalled or hung camera can
make frames stale but can never block a reader.

Failure handling. A ``grab`` that raises (SDK error, its own timeout) makes the capture thread
log it, close the camera and reopen it after a backoff (``reopen_backoff_s``, doubling per
consecutive failure up to ``max(5 s, reopen_backoff_s)``). A ``grab`` that does not return
within its limit (``stall_timeout_s``, or ``first_frame_timeout_s`` right after an open; an
``open`` gets ``first_frame_timeout_s``) plus a grace of ``0.25 * limit + 50 ms`` is declared
hung by the watchdog: that thread is abandoned
(it exits quietly if the SDK ever returns), the camera is closed from a helper thread and a
fresh capture thread reopens it. Meanwhile readers keep getting the last frame and see that it
is stale through :meth:`CaptureThread.read_latest`.

All times are seconds; stamps are on ``time.monotonic()`` (see :mod:`.base`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from rlinf_user.robots.cameras.base import (
    Camera,
    CameraError,
    CameraStaleError,
    CameraTimeoutError,
    EndOfStream,
    Frame,
    crop_resize,
    encode_jpeg,
    image_backend,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CaptureStats(Mapping):
    """Counters since :meth:`CaptureThread.start`. Times in seconds unless ``_ms``. Read as
    attributes or as a read-only mapping (``dict(stats)``, e.g. for telemetry)."""

    name: str
    frames: int  # frames published
    drops: int  # frames lost, estimated from stamp gaps at the configured fps
    reopens: int  # open attempts after a failure
    errors: int  # failed opens, grabs and processing
    stalls: int  # grabs that timed out or hung
    last_error: str | None
    fps: float  # measured over the last 30 frames
    age: float  # age of the newest frame now (inf before the first)
    is_open: bool
    eof: bool  # a played-back recording has ended
    hung_threads: int  # abandoned capture threads still stuck inside the SDK
    process_ms: float  # mean crop + resize time per frame (exponential average)
    encode_ms: float  # mean JPEG encode time per frame (exponential average)

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dataclass_fields__)

    def __len__(self) -> int:
        return len(self.__dataclass_fields__)


class CaptureThread:
    """Owns one :class:`Camera` and serves its newest frame. See the module docstring."""

    def __init__(self, camera: Camera, backend: str | None = None):
        self.camera = camera
        self.cfg = camera.cfg
        self.name = camera.cfg.name
        self._backend = image_backend(backend)
        self._cond = threading.Condition()
        self._stop_evt = threading.Event()
        self._gen = 0  # bumped to retire the current capture thread
        self._worker: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._abandoned: list[threading.Thread] = []
        self._latest: Frame | None = None
        self._returned_seq = -1
        self._busy: tuple[float, float, str] | None = None  # (monotonic start, limit, call)
        self._is_open = False
        self._eof = False
        self._frames = self._drops = self._reopens = self._errors = self._stalls = 0
        self._last_error: str | None = None
        self._info: dict[str, Any] | None = None  # camera_info, once the driver has intrinsics
        self._stamps: collections.deque[float] = collections.deque(maxlen=30)
        self._process_ms = self._encode_ms = 0.0

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> CaptureThread:
        """Start capturing (returns at once; the first frame follows the camera's open)."""
        with self._cond:
            if self._worker is not None:
                raise CameraError(f"camera {self.name!r}: capture already started")
            self._stop_evt.clear()
            self._eof, self._busy = False, None
            self._spawn(after=None, reopening=False)
        self._watchdog = threading.Thread(
            target=self._watch, name=f"camera-{self.name}-watchdog", daemon=True
        )
        self._watchdog.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop and close the camera, waiting at most about ``timeout`` s (default: the stall
        timeout + 0.5 s) for a grab in progress; a thread still stuck is left behind."""
        self._stop_evt.set()
        with self._cond:
            self._gen += 1
            worker, self._worker = self._worker, None
            self._cond.notify_all()
        limit = self.cfg.stall_timeout_s + 0.5 if timeout is None else timeout
        # Close first (allowed while grab blocks): most SDK waits then end within one slice.
        closer = threading.Thread(target=self._safe_close, name=f"camera-{self.name}-close")
        closer.daemon = True
        closer.start()
        deadline = time.monotonic() + limit
        if worker is not None:
            worker.join(limit)
            if worker.is_alive():
                log.warning("camera %r: capture thread still inside the SDK at stop", self.name)
                self._abandoned.append(worker)
        if self._watchdog is not None:
            self._watchdog.join(1.0)
            self._watchdog = None
        closer.join(max(deadline - time.monotonic(), 0.0))
        if not closer.is_alive():
            self._safe_close()  # in case the capture thread opened it again meanwhile
        with self._cond:
            self._is_open = False

    def __enter__(self) -> CaptureThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- readers -----------------------------------------------------------------------

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """``(height, width, 3)`` of the served images."""
        return (*self.cfg.out_shape, 3)

    def camera_info(self) -> dict[str, Any]:
        """What calibration needs to know of this camera: the opened device's serial and
        its intrinsics for the served image (after crop and resize; None if unknown). Asked
        once per open of the device, so telemetry requests never reach the driver again."""
        from rlinf_user.robots.cameras.base import adjust_intrinsics

        if self._info is not None:
            return self._info
        try:
            intr = self.camera.intrinsics()
        except Exception as err:  # noqa: BLE001 - a driver query must not take the stream down
            log.warning("camera %r: intrinsics unavailable (%s)", self.name, err)
            intr = None
        info = {"serial": self.camera.serial, "kind": self.cfg.kind, "crop": list(self.cfg.crop) if self.cfg.crop else None,
                "intrinsics": adjust_intrinsics(intr, self.cfg.crop, self.cfg.resize)}  # fmt: skip
        if intr is not None:
            self._info = info
        return info

    def latest(self) -> Frame | None:
        """The newest frame whatever its age (``None`` before the first); never waits."""
        with self._cond:
            return self._latest

    def read_latest(self, max_age: float) -> Frame:
        """The newest frame; :class:`CameraStaleError` if it is older than ``max_age`` s
        (or there is none yet). Never waits for the camera."""
        with self._cond:  # held by others only for a few assignments
            frame = self._latest
            if frame is None:
                raise CameraStaleError(self.name, math.inf, max_age)
            age = time.monotonic() - frame.stamp
            if age > max_age:
                raise CameraStaleError(self.name, age, max_age)
            self._returned_seq = max(self._returned_seq, frame.seq)
            return frame

    def async_read(self, timeout: float = 1.0) -> Frame:
        """Wait up to ``timeout`` s for a frame newer than the last one returned by either
        reader; :class:`CameraTimeoutError` if none comes, :class:`EndOfStream` after the end
        of a recording."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                frame = self._latest
                if frame is not None and frame.seq > self._returned_seq:
                    self._returned_seq = frame.seq
                    return frame
                if self._eof:
                    raise EndOfStream(f"camera {self.name!r}: recording ended")
                if self._worker is None:
                    raise CameraError(f"camera {self.name!r}: capture is not running")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CameraTimeoutError(
                        f"camera {self.name!r}: no new frame within {timeout:.3f} s"
                    )
                self._cond.wait(remaining)

    def stats(self) -> CaptureStats:
        with self._cond:
            stamps = self._stamps
            span = stamps[-1] - stamps[0] if len(stamps) >= 2 else 0.0
            latest = self._latest
            return CaptureStats(
                name=self.name,
                frames=self._frames,
                drops=self._drops,
                reopens=self._reopens,
                errors=self._errors,
                stalls=self._stalls,
                last_error=self._last_error,
                fps=(len(stamps) - 1) / span if span > 0 else 0.0,
                age=time.monotonic() - latest.stamp if latest is not None else math.inf,
                is_open=self._is_open,
                eof=self._eof,
                hung_threads=sum(t.is_alive() for t in self._abandoned),
                process_ms=self._process_ms,
                encode_ms=self._encode_ms,
            )

    # ---- capture thread ----------------------------------------------------------------

    def _spawn(self, after: threading.Thread | None, reopening: bool) -> None:
        """Start a capture thread for the current generation (caller holds the lock)."""
        self._worker = threading.Thread(
            target=self._run,
            args=(self._gen, after, reopening),
            name=f"camera-{self.name}",
            daemon=True,
        )
        self._worker.start()

    def _current(self, gen: int) -> bool:
        return self._gen == gen and not self._stop_evt.is_set()

    def _backoff(self, failures: int) -> float:
        base = self.cfg.reopen_backoff_s
        return min(base * 2 ** max(failures - 1, 0), max(5.0, base))

    def _enter_sdk(self, gen: int, what: str, limit: float) -> bool:
        """Mark an SDK call (``open``/``grab``) the watchdog should time; False if retired."""
        with self._cond:
            if not self._current(gen):
                return False
            self._busy = (time.monotonic(), limit, what)
            return True

    def _leave_sdk(self, gen: int) -> bool:
        """Clear the mark; False if this thread was retired meanwhile (then it must exit
        without touching the camera: the watchdog or stop() owns it now)."""
        with self._cond:
            if self._gen != gen:
                return False
            self._busy = None
            return not self._stop_evt.is_set()

    def _run(self, gen: int, after: threading.Thread | None, reopening: bool) -> None:
        if after is not None:  # the hung camera is being closed; give that a bounded wait
            after.join(self.cfg.stall_timeout_s)
        failures = 1 if reopening else 0
        opened = first = False
        while self._current(gen):
            if not opened:
                if failures:
                    if self._stop_evt.wait(self._backoff(failures)) or not self._current(gen):
                        return
                    with self._cond:
                        self._reopens += 1
                if not self._enter_sdk(gen, "open", self.cfg.first_frame_timeout_s):
                    return
                try:
                    self.camera.open()
                    self._info = None  # a reopened device reports its intrinsics afresh
                except Exception as err:  # noqa: BLE001 - any SDK error means "retry later"
                    if not self._leave_sdk(gen):
                        return
                    failures += 1
                    self._note_error(gen, f"open failed: {err}")
                    continue
                if not self._leave_sdk(gen):
                    return
                opened = first = True
                with self._cond:
                    self._is_open = True
                log.info("camera %r opened (serial %s)", self.name, self.camera.serial)
            limit = self.cfg.first_frame_timeout_s if first else self.cfg.stall_timeout_s
            if not self._enter_sdk(gen, "grab", limit):
                return
            try:
                rgb, stamp = self.camera.grab(limit)
            except EndOfStream:
                if self._leave_sdk(gen):
                    log.info("camera %r: end of recording", self.name)
                    with self._cond:
                        self._eof, self._is_open = True, False
                        self._cond.notify_all()
                    self._safe_close()
                return
            except Exception as err:  # noqa: BLE001
                if not self._leave_sdk(gen):
                    return
                failures += 1
                self._note_error(gen, f"grab failed: {err}", stall=_is_timeout(err))
                self._safe_close()
                opened = False
                continue
            if not self._leave_sdk(gen):
                return
            first, failures = False, 0
            try:
                self._publish(gen, rgb, stamp)
            except Exception as err:  # noqa: BLE001 - e.g. a frame of an unexpected size
                with self._cond:
                    self._drops += 1
                self._note_error(gen, f"processing failed: {err}")

    def _publish(self, gen: int, rgb, stamp: float) -> None:
        t0 = time.perf_counter()
        image = crop_resize(rgb, self.cfg.crop, self.cfg.resize, self._backend)
        t1 = time.perf_counter()
        quality = self.cfg.jpeg_quality
        jpeg = encode_jpeg(image, quality, self._backend) if quality is not None else None
        t2 = time.perf_counter()
        image.setflags(write=False)
        with self._cond:
            if not self._current(gen):
                return
            prev = self._latest
            if prev is not None:
                if stamp <= prev.stamp:  # keep stamps strictly increasing
                    stamp = prev.stamp + 1e-6
                if self.cfg.fps > 0:
                    self._drops += max(round((stamp - prev.stamp) * self.cfg.fps) - 1, 0)
            seq = prev.seq + 1 if prev is not None else 0
            self._latest = Frame(image=image, stamp=stamp, seq=seq, jpeg=jpeg)
            self._frames += 1
            self._stamps.append(stamp)
            a = 0.1 if self._frames > 1 else 1.0
            self._process_ms += a * ((t1 - t0) * 1e3 - self._process_ms)
            self._encode_ms += a * ((t2 - t1) * 1e3 - self._encode_ms)
            self._cond.notify_all()

    def _note_error(self, gen: int, message: str, stall: bool = False) -> None:
        with self._cond:
            if self._gen != gen:
                return
            self._errors += 1
            self._stalls += int(stall)
            self._last_error = message
            self._is_open = False
        log.warning("camera %r: %s; reopening", self.name, message)

    def _safe_close(self) -> None:
        try:
            self.camera.close()
        except Exception as err:  # noqa: BLE001 - closing a broken device may fail too
            log.warning("camera %r: close failed: %s", self.name, err)

    # ---- watchdog ----------------------------------------------------------------------

    def _watch(self) -> None:
        period = max(0.005, min(0.1, self.cfg.stall_timeout_s / 4))
        while not self._stop_evt.wait(period):
            with self._cond:
                if self._busy is None or not self._current(self._gen):
                    continue
                since, limit, what = self._busy
                waited = time.monotonic() - since
                if waited <= limit + 0.25 * limit + 0.05:
                    continue
                message = f"no frame for {waited:.2f} s ({what} did not return)"
                self._gen += 1
                self._busy = None
                self._errors += 1
                self._stalls += 1
                self._last_error = message
                self._is_open = False
                if self._worker is not None:
                    self._abandoned = [t for t in self._abandoned if t.is_alive()]
                    self._abandoned.append(self._worker)
                closer = threading.Thread(
                    target=self._safe_close, name=f"camera-{self.name}-close", daemon=True
                )
                closer.start()
                self._spawn(after=closer, reopening=True)
            log.warning("camera %r: %s; abandoning that thread and reopening", self.name, message)


def _is_timeout(err: BaseException) -> bool:
    return isinstance(err, (TimeoutError, CameraTimeoutError))
