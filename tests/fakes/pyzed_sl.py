"""Test double for the Stereolabs ZED SDK module ``pyzed.sl``; it stands in for the SDK,
which needs Stereolabs' installer and a CUDA GPU and cannot be installed in CI.

It mimics only the API surface :mod:`rlinf_user.robots.cameras.zed` uses, with the SDK's
names and conventions: enums are ``enum.Enum`` classes (``ERROR_CODE``, ``RESOLUTION``,
``DEPTH_MODE``, ``VIEW``, ``TIME_REFERENCE``, ``MEM``) and ``ERROR_CODE.SUCCESS`` is 0;
``Camera.open``/``grab``/``retrieve_image`` return ``ERROR_CODE`` values instead of raising;
``Mat.get_data()`` returns an ``H x W x 4`` BGRA ``uint8`` array; ``Timestamp`` holds
nanoseconds since the Unix epoch on the host clock; ``Camera.get_device_list()`` is static and
returns ``DeviceProperties`` with an integer ``serial_number``; ``grab`` blocks until the next
frame at ``camera_fps``.

Test controls (not SDK API) start with an underscore: ``_plug`` connects a simulated camera,
``_add_svo`` registers a recording, ``_reset`` forgets both.
"""

from __future__ import annotations

import enum
import time

import numpy as np


class ERROR_CODE(enum.Enum):  # noqa: N801 - SDK name
    CORRUPTED_FRAME = -2
    CAMERA_REBOOTING = -1
    SUCCESS = 0
    FAILURE = 1
    CAMERA_NOT_DETECTED = 4
    INVALID_RESOLUTION = 7
    INVALID_SVO_FILE = 11
    END_OF_SVOFILE_REACHED = 13
    CAMERA_NOT_INITIALIZED = 20


class RESOLUTION(enum.Enum):  # noqa: N801
    HD2K = 0
    HD1080 = 1
    HD1200 = 2
    HD720 = 3
    SVGA = 4
    VGA = 5
    AUTO = 6


_SIZES = {
    RESOLUTION.HD2K: (2208, 1242),
    RESOLUTION.HD1080: (1920, 1080),
    RESOLUTION.HD1200: (1920, 1200),
    RESOLUTION.HD720: (1280, 720),
    RESOLUTION.SVGA: (960, 600),
    RESOLUTION.VGA: (672, 376),
}


class DEPTH_MODE(enum.Enum):  # noqa: N801
    NONE = 0
    PERFORMANCE = 1
    QUALITY = 2
    ULTRA = 3
    NEURAL = 4


class VIEW(enum.Enum):  # noqa: N801
    LEFT = 0
    RIGHT = 1


class TIME_REFERENCE(enum.Enum):  # noqa: N801
    IMAGE = 0
    CURRENT = 1


class MEM(enum.Enum):  # noqa: N801
    CPU = 1
    GPU = 2


class Timestamp:
    def __init__(self, data_ns: int = 0):
        self.data_ns = int(data_ns)

    def get_nanoseconds(self) -> int:
        return self.data_ns

    def get_microseconds(self) -> int:
        return self.data_ns // 1_000

    def get_milliseconds(self) -> int:
        return self.data_ns // 1_000_000

    def get_seconds(self) -> int:
        return self.data_ns // 1_000_000_000


class InitParameters:
    def __init__(self) -> None:
        self.camera_resolution = RESOLUTION.AUTO
        self.camera_fps = 0
        self.depth_mode = DEPTH_MODE.ULTRA  # the SDK's default computes depth
        self.svo_real_time_mode = False
        self._serial: int | None = None
        self._svo: str | None = None

    def set_from_serial_number(self, serial_number: int, bus_type=None) -> None:
        if not isinstance(serial_number, int):
            raise TypeError("serial_number must be an int")
        self._serial = serial_number

    def set_from_svo_file(self, svo_input_filename: str) -> None:
        self._svo = str(svo_input_filename)


class RuntimeParameters:
    def __init__(self) -> None:
        self.enable_depth = True


class DeviceProperties:
    def __init__(self, serial_number: int):
        self.serial_number = serial_number
        self.camera_model = "ZED2"
        self.camera_state = "AVAILABLE"


class CameraInformation:
    def __init__(self, serial_number: int):
        self.serial_number = serial_number
        self.camera_model = "ZED2"


class Mat:
    def __init__(self) -> None:
        self._data = np.zeros((0, 0, 4), np.uint8)

    def get_data(self, memory_type=MEM.CPU, deep_copy: bool = False) -> np.ndarray:
        return self._data.copy() if deep_copy else self._data  # a view the SDK reuses

    def get_width(self) -> int:
        return self._data.shape[1]

    def get_height(self) -> int:
        return self._data.shape[0]


# ---- test controls ----------------------------------------------------------------------
_PLUGGED: dict[int, object] = {}  # serial -> scene(index, height, width) -> RGB uint8
_SVOS: dict[str, tuple] = {}  # path -> (serial, frames, width, height, scene)


def _plug(serial: int, scene) -> None:
    _PLUGGED[int(serial)] = scene


def _add_svo(path: str, serial: int, frames: int, width: int, height: int, scene) -> None:
    _SVOS[str(path)] = (int(serial), frames, width, height, scene)


def _reset() -> None:
    _PLUGGED.clear()
    _SVOS.clear()


def _rgb_to_bgra(rgb: np.ndarray) -> np.ndarray:
    h, w = rgb.shape[:2]
    out = np.full((h, w, 4), 255, np.uint8)
    out[:, :, :3] = rgb[:, :, ::-1]
    return out


class Camera:
    def __init__(self) -> None:
        self._opened = False

    @staticmethod
    def get_device_list() -> list[DeviceProperties]:
        return [DeviceProperties(s) for s in sorted(_PLUGGED)]

    def open(self, init: InitParameters) -> ERROR_CODE:
        self._index, self._ts_ns, self._frames = 0, 0, None
        if init._svo is not None:
            if init._svo not in _SVOS:
                return ERROR_CODE.INVALID_SVO_FILE
            self._serial, self._frames, w, h, scene = _SVOS[init._svo]
        else:
            if init.camera_resolution not in _SIZES:
                return ERROR_CODE.INVALID_RESOLUTION
            w, h = _SIZES[init.camera_resolution]
            serial = init._serial if init._serial is not None else min(_PLUGGED, default=None)
            if serial not in _PLUGGED:
                return ERROR_CODE.CAMERA_NOT_DETECTED
            self._serial, scene = serial, _PLUGGED[serial]
        self._scene = scene
        self._size, self._fps = (w, h), init.camera_fps or 30
        self._next = time.monotonic()
        self._opened = True
        return ERROR_CODE.SUCCESS

    def is_opened(self) -> bool:
        return self._opened

    def grab(self, runtime: RuntimeParameters | None = None) -> ERROR_CODE:
        if not self._opened:
            return ERROR_CODE.CAMERA_NOT_INITIALIZED
        if self._frames is not None and self._index >= self._frames:
            return ERROR_CODE.END_OF_SVOFILE_REACHED
        delay = self._next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self._next = max(self._next + 1.0 / self._fps, time.monotonic())
        self._ts_ns = time.time_ns()  # exposure time on the host clock
        w, h = self._size
        self._image = _rgb_to_bgra(self._scene(self._index, h, w))
        self._index += 1
        return ERROR_CODE.SUCCESS

    def retrieve_image(self, py_mat: Mat, view=VIEW.LEFT, mem_type=MEM.CPU, resolution=None):
        if not self._opened:
            return ERROR_CODE.CAMERA_NOT_INITIALIZED
        py_mat._data = self._image
        return ERROR_CODE.SUCCESS

    def get_timestamp(self, time_reference: TIME_REFERENCE) -> Timestamp:
        if time_reference == TIME_REFERENCE.IMAGE:
            return Timestamp(self._ts_ns)
        return Timestamp(time.time_ns())

    def get_camera_information(self, resizer=None) -> CameraInformation:
        return CameraInformation(self._serial)

    def close(self) -> None:
        self._opened = False
