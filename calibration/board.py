"""ChArUco calibration boards (OpenCV's ``aruco`` module): the board a config names, its
printable image, and its detection in a camera frame with the board's pose.

A ChArUco board is a chessboard whose white squares hold ArUco markers: each inner
chessboard corner is identified by the markers around it, so a partly hidden or steeply
seen board still gives corners with known board coordinates, which is what intrinsics
(many views) and hand-eye (one pose per view) need.

Board frame (OpenCV's): origin at the board's outer corner next to the first marker, x
along ``squares_x``, y along ``squares_y``, z out of the printed side's back (a camera
facing the print sees z pointing away from it).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class BoardNotFound(RuntimeError):
    """The board is not (or not enough of it is) in view."""


@dataclasses.dataclass(frozen=True)
class BoardSpec:
    """Squares across x and y, the square and marker side in metres, the ArUco dictionary."""

    squares_x: int = 7
    squares_y: int = 5
    square_m: float = 0.04
    marker_m: float = 0.03
    dictionary: str = "DICT_4X4_50"
    min_corners: int = 6  # fewer visible corners: no pose (PnP is ill-conditioned)

    def __post_init__(self) -> None:
        if self.squares_x < 3 or self.squares_y < 3:
            raise ValueError(f"a ChArUco board needs at least 3 x 3 squares, got {self.squares_x} x {self.squares_y}")
        if not 0 < self.marker_m < self.square_m:
            raise ValueError(f"marker_m={self.marker_m} must be positive and smaller than square_m={self.square_m}")
        import cv2

        if not hasattr(cv2.aruco, self.dictionary):
            raise ValueError(f"unknown ArUco dictionary {self.dictionary!r} (e.g. DICT_4X4_50, DICT_5X5_100)")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> BoardSpec:
        d = dict(d or {})
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown board key(s) {sorted(unknown)}; known: {[f.name for f in dataclasses.fields(cls)]}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def size_m(self) -> tuple[float, float]:
        return self.squares_x * self.square_m, self.squares_y * self.square_m

    def cv_board(self):
        import cv2

        d = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, self.dictionary))
        return cv2.aruco.CharucoBoard((self.squares_x, self.squares_y), self.square_m, self.marker_m, d)

    def image(self, px_per_square: int = 100, margin_px: int = 0) -> np.ndarray:
        """The board as a grayscale image (uint8), for printing or a simulator texture.
        Row 0 is the board's y = 0 edge, column 0 its x = 0 edge."""
        w, h = self.squares_x * px_per_square, self.squares_y * px_per_square
        return self.cv_board().generateImage((w + 2 * margin_px, h + 2 * margin_px), marginSize=margin_px)

    def corner_points(self) -> np.ndarray:
        """The inner chessboard corners in the board frame (N x 3, metres), by corner id."""
        return np.asarray(self.cv_board().getChessboardCorners(), np.float64).reshape(-1, 3)


@dataclasses.dataclass
class Detection:
    """Board corners found in one frame: pixel positions and their ids (board corners)."""

    corners: np.ndarray  # (N, 2) float pixels
    ids: np.ndarray  # (N,) int
    image_size: tuple[int, int]  # (width, height)

    def __len__(self) -> int:
        return len(self.ids)

    def object_points(self, board: BoardSpec) -> np.ndarray:
        return board.corner_points()[self.ids].astype(np.float32)


def detect(board: BoardSpec, image: np.ndarray) -> Detection:
    """The board's corners in ``image`` (RGB or gray); :class:`BoardNotFound` when fewer
    than ``board.min_corners`` are identified."""
    import cv2

    gray = image if image.ndim == 2 else cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    corners, ids, markers, _ = cv2.aruco.CharucoDetector(board.cv_board()).detectBoard(gray)
    n = 0 if ids is None else len(ids)
    if n < board.min_corners:
        seen = 0 if markers is None else len(markers)
        raise BoardNotFound(
            f"the {board.squares_x}x{board.squares_y} {board.dictionary} board is not in view "
            f"({n} corners, {seen} markers found; need {board.min_corners} corners): "
            "put the whole board in the camera's view, lit and in focus"
        )
    return Detection(corners.reshape(-1, 2).astype(np.float64), ids.reshape(-1).astype(int), (gray.shape[1], gray.shape[0]))


def board_pose(board: BoardSpec, det: Detection, K: np.ndarray, dist: np.ndarray) -> tuple[np.ndarray, float]:
    """The board's pose in the camera frame (4x4, OpenCV camera: z forward, y down) and the
    RMS reprojection error of its corners in pixels."""
    import cv2

    obj = det.object_points(board)
    ok, rvec, tvec = cv2.solvePnP(obj, det.corners.astype(np.float32), K, dist, flags=cv2.SOLVEPNP_ITERATIVE)
    if not ok:
        raise BoardNotFound("the board's pose could not be solved from its corners")
    rvec, tvec = cv2.solvePnPRefineLM(obj, det.corners.astype(np.float32), K, dist, rvec, tvec)
    proj, _ = cv2.projectPoints(obj, rvec, tvec, K, dist)
    rms = float(np.sqrt(np.mean(np.sum((proj.reshape(-1, 2) - det.corners) ** 2, axis=1))))
    T = np.eye(4)
    T[:3, :3] = cv2.Rodrigues(rvec)[0]
    T[:3, 3] = tvec.reshape(3)
    return T, rms


def board_poses(board: BoardSpec, detections: list[Detection], K: np.ndarray, dist: np.ndarray
                ) -> tuple[list[np.ndarray], list[float]]:  # fmt: skip
    """:func:`board_pose` of each detection: the poses and their reprojection errors."""
    out = [board_pose(board, d, K, dist) for d in detections]
    return [T for T, _ in out], [rms for _, rms in out]
