"""mp4 encoding and decoding of camera streams with PyAV (FFmpeg).

Frames are encoded as they arrive (no PNG round trip, bounded memory) into a hidden
``.partial`` file that is renamed into place only when the episode is saved.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np


class VideoEncoder:
    """Streams uint8 (H, W, 3) RGB frames into an mp4 at a constant ``fps``.

    Frame ``i`` gets presentation time ``i / fps`` exactly, which is what LeRobot's
    timestamp-based frame lookup expects.
    """

    def __init__(self, path: Path, height: int, width: int, fps: int, codec: str = "h264", crf: int = 18):
        import av

        if height % 2 or width % 2:
            raise ValueError(f"video frames need even sizes for yuv420p, got {height}x{width}")
        self.final = Path(path)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.path = self.final.with_name("." + self.final.name + ".partial")
        self.shape = (int(height), int(width), 3)
        self.frames = 0
        self._container = av.open(str(self.path), mode="w", format="mp4")
        encoder = {"h264": "libx264", "av1": "libsvtav1"}.get(codec, codec)
        self._stream = self._container.add_stream(encoder, rate=int(fps))
        self._stream.width, self._stream.height = int(width), int(height)
        self._stream.pix_fmt = "yuv420p"
        # the muxer rewrites the stream's time base once writing starts: keep the frames' own
        self._time_base = Fraction(1, int(fps))
        self._stream.time_base = self._time_base
        if encoder == "libx264":
            # each encoded frame decodable without look-ahead past its episode: no B-frames
            self._stream.options = {"crf": str(crf), "preset": "veryfast", "bf": "0", "g": "30"}
        self._av = av

    def add(self, image: np.ndarray) -> None:
        if image.shape != self.shape or image.dtype != np.uint8:
            raise ValueError(f"frame {image.dtype} {image.shape} does not match the video {self.shape} uint8")
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        frame.pts = self.frames
        frame.time_base = self._time_base
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self.frames += 1

    def finish(self) -> Path:
        """Flush, close and fsync the partial file (it is moved into place by the caller)."""
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
        with open(self.path, "rb") as f:
            os.fsync(f.fileno())
        return self.path

    def abort(self) -> None:
        try:
            self._container.close()
        except Exception:  # noqa: BLE001 - closing a half-written container may fail; we delete it
            pass
        self.path.unlink(missing_ok=True)


def decode_video(path: Path) -> np.ndarray:
    """All frames of an mp4 as uint8 (N, H, W, 3) RGB, in presentation order."""
    import av

    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    if not frames:
        raise ValueError(f"{path} holds no video frames")
    return np.stack(frames)
