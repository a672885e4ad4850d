"""Incremental, crash-safe LeRobotDataset v3.0 writer for env-contract episodes.

Frames are buffered per episode (camera frames go straight into an mp4 encoder); when an
episode is saved its files are written next to their final names, fsynced and renamed
into place, and ``meta/info.json`` is replaced last: it is the commit point. A crash
while recording or saving therefore loses only that episode; opening the folder again
finds the leftovers (files of episodes ``info.json`` does not count, ``.partial`` and
``.tmp`` files), names them in a warning and removes them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_user.data import lerobot_format as fmt
from rlinf_user.data.video import VideoEncoder

log = logging.getLogger(__name__)

IMAGE_STATS_SAMPLES = 64


def _arrow_type(pa, feature: Mapping[str, Any]):
    base = {"float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(), "bool": pa.bool_()}[
        feature["dtype"]
    ]
    shape = list(feature["shape"])
    return base if shape == [1] else pa.list_(base, shape[0])


def _write_parquet_atomic(table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="snappy")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LeRobotWriter:
    """Writes episodes of env-contract observations and actions as a LeRobotDataset v3.0.

    ``resume=False`` refuses an existing non-empty folder (nothing there is touched);
    ``resume=True`` appends to it after checking that its features match.
    """

    def __init__(
        self,
        root: str | Path,
        fps: int,
        features: dict[str, dict[str, Any]],
        robot_type: str | None = None,
        resume: bool = False,
        crf: int = 18,
        reward: dict[str, Any] | None = None,
    ):
        self.root = Path(root)
        self.crf = int(crf)
        self.recovered: list[str] = []
        info_path = self.root / fmt.INFO_PATH
        if info_path.exists() and json.loads(info_path.read_text()).get("total_episodes") == 0 and not any(
            (self.root / d).exists() for d in ("data", "videos")
        ):
            resume = True  # a dataset created but never given an episode: reuse it
        if self.root.exists() and any(self.root.iterdir()):
            if not resume:
                what = "a dataset" if info_path.exists() else "files"
                raise fmt.DatasetError(
                    f"{self.root} already exists and holds {what}; nothing was changed. Pass "
                    f"resume=true to append episodes to it, or choose a new folder."
                )
            if not info_path.exists():
                raise fmt.DatasetError(f"{self.root} is not a LeRobot dataset (no {fmt.INFO_PATH}); choose a new folder")
            self.info = json.loads(info_path.read_text())
            if self.info.get("codebase_version") != fmt.CODEBASE_VERSION:
                raise fmt.DatasetError(
                    f"{self.root} is LeRobot format {self.info.get('codebase_version')}, this writer appends to "
                    f"{fmt.CODEBASE_VERSION} only"
                )
            problems = fmt.feature_mismatch(self.info["features"], features)
            if problems:
                raise fmt.DatasetError(
                    f"cannot append to {self.root}: its features do not match this env: " + "; ".join(problems)
                )
            if int(self.info["fps"]) != int(fps):
                raise fmt.DatasetError(f"cannot append to {self.root}: it was recorded at {self.info['fps']} fps, not {fps}")
            had = self.info.get(fmt.REWARD_INFO_KEY)
            # appended episodes keep the dataset's info as it is (an older one's missing
            # bonus mark too: its loader then checks every success step)
            if reward is not None and had is not None and not fmt.same_reward(had, reward):
                raise fmt.DatasetError(f"cannot append to {self.root}: its rewards follow {had}, these episodes' {reward}")
            self.features = self.info["features"]
            stats_path = self.root / fmt.STATS_PATH
            self.stats = fmt.stats_from_json(json.loads(stats_path.read_text())) if stats_path.exists() else None
            self.tasks = self._load_tasks()
            self._remove_leftovers()
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            self.features = dict(features)
            self.info = fmt.empty_info(fps, self.features, robot_type)
            if reward is not None:
                self.info[fmt.REWARD_INFO_KEY] = dict(reward)
            self.stats = None
            self.tasks: dict[str, int] = {}
            fmt.write_json_atomic(self.root / fmt.INFO_PATH, self.info)
        self.fps = int(self.info["fps"])
        self.video_keys = [k for k, v in self.features.items() if v["dtype"] == "video"]
        self.columns = [
            k for k, v in self.features.items() if v["dtype"] != "video" and k not in fmt.DEFAULT_FEATURES
        ]
        self._frames: dict[str, list] = {}
        self._encoders: dict[str, VideoEncoder] = {}
        self._samples: dict[str, list[np.ndarray]] = {}

    # ------------------------------------------------------------------ properties
    @property
    def num_episodes(self) -> int:
        return int(self.info["total_episodes"])

    @property
    def num_frames(self) -> int:
        return int(self.info["total_frames"])

    @property
    def episode_frames(self) -> int:
        return len(self._frames.get(fmt.ACTION_KEY, []))

    # ------------------------------------------------------------------ recording
    def add_frame(self, values: Mapping[str, Any], images: Mapping[str, np.ndarray] | None = None) -> None:
        """Append one frame: ``values`` by feature name, ``images`` by camera name."""
        images = dict(images or {})
        missing = [k for k in self.columns if k not in values]
        if missing:
            raise fmt.DatasetError(f"frame lacks {missing}")
        for key in self.video_keys:
            cam = key[len(fmt.IMAGE_PREFIX) :]
            if cam not in images:
                raise fmt.DatasetError(f"frame lacks camera {cam!r} ({key})")
        rows = {}
        for k in self.columns:
            ft = self.features[k]
            v = np.asarray(values[k], dtype=ft["dtype"]).reshape(-1)
            if list(v.shape) != list(ft["shape"]):
                raise fmt.DatasetError(f"{k}: expected shape {ft['shape']}, got {list(v.shape)}")
            if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
                raise fmt.DatasetError(f"{k} contains NaN/Inf; the frame was not recorded")
            rows[k] = v
        for key in self.video_keys:
            ft = self.features[key]
            if key not in self._encoders:
                h, w, _ = ft["shape"]
                path = fmt.episode_paths(self.root, self.num_episodes, [key])[key]
                self._encoders[key] = VideoEncoder(path, h, w, self.fps, ft["info"]["video.codec"], self.crf)
            self._encoders[key].add(np.asarray(images[key[len(fmt.IMAGE_PREFIX) :]]))
        for k, v in rows.items():
            self._frames.setdefault(k, []).append(v)
        n = self.episode_frames
        for key in self.video_keys:  # a bounded, evenly spread sample for the image statistics
            s = self._samples.setdefault(key, [])
            if len(s) < IMAGE_STATS_SAMPLES or n % 8 == 0:
                s.append(np.asarray(images[key[len(fmt.IMAGE_PREFIX) :]]).copy())
                if len(s) > IMAGE_STATS_SAMPLES:
                    del s[::2]

    def update_last_frame(self, **values: Any) -> None:
        """Overwrite columns of the newest frame (e.g. mark it terminal when a person ends
        the episode after the step was recorded)."""
        for k, v in values.items():
            if k not in self.columns:
                raise fmt.DatasetError(f"{k!r} is not a column of this dataset")
            if not self._frames.get(k):
                raise fmt.DatasetError("no frame recorded yet")
            self._frames[k][-1] = np.asarray(v, dtype=self.features[k]["dtype"]).reshape(-1)

    def discard_episode(self) -> None:
        """Drop the frames recorded since the last save (re-record)."""
        for enc in self._encoders.values():
            enc.abort()
        self._encoders.clear()
        self._frames.clear()
        self._samples.clear()

    def save_episode(self, task: str, extra: Mapping[str, Any] | None = None) -> int:
        """Write the buffered episode; returns its index. ``extra``: more episode-row columns."""
        import pyarrow as pa

        n = self.episode_frames
        if n == 0:
            raise fmt.DatasetError("no frames recorded in this episode")
        ep = self.num_episodes
        start = self.num_frames
        task_index = self.tasks.setdefault(str(task), len(self.tasks))
        cols = {k: np.stack(v) for k, v in self._frames.items()}
        cols["timestamp"] = (np.arange(n) / self.fps).astype(np.float32)[:, None]
        cols["frame_index"] = np.arange(n, dtype=np.int64)[:, None]
        cols["episode_index"] = np.full((n, 1), ep, dtype=np.int64)
        cols["index"] = np.arange(start, start + n, dtype=np.int64)[:, None]
        cols["task_index"] = np.full((n, 1), task_index, dtype=np.int64)

        arrays, fields = [], []
        for k, ft in self.features.items():
            if ft["dtype"] == "video":
                continue
            t = _arrow_type(pa, ft)
            v = cols[k]
            arr = pa.array(v[:, 0]) if ft["shape"] == [1] else pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), ft["shape"][0])
            arrays.append(arr.cast(t))
            fields.append(pa.field(k, t))
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))

        paths = fmt.episode_paths(self.root, ep, self.video_keys)
        ep_stats = {k: fmt.numeric_stats(cols[k]) for k, ft in self.features.items() if ft["dtype"] != "video"}
        row: dict[str, Any] = {
            "episode_index": ep,
            "tasks": [str(task)],
            "length": n,
            "data/chunk_index": fmt.chunk_file(ep)[0],
            "data/file_index": fmt.chunk_file(ep)[1],
            "dataset_from_index": start,
            "dataset_to_index": start + n,
        }
        for key in self.video_keys:
            enc = self._encoders.pop(key)
            if enc.frames != n:
                raise fmt.DatasetError(f"{key}: {enc.frames} video frames for {n} data frames")
            enc.finish()
            os.replace(enc.path, paths[key])
            row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"] = fmt.chunk_file(ep)
            row[f"videos/{key}/from_timestamp"] = 0.0
            row[f"videos/{key}/to_timestamp"] = n / self.fps
            ep_stats[key] = fmt.image_stats(np.stack(self._samples.get(key, [])))
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = fmt.chunk_file(ep)
        for k, v in dict(extra or {}).items():
            row[k] = v
        for feat, st in ep_stats.items():
            for name, val in st.items():
                row[f"stats/{feat}/{name}"] = np.asarray(val).tolist()

        _write_parquet_atomic(table, paths["data"])
        _write_parquet_atomic(pa.Table.from_pylist([row]), paths["meta"])
        self._write_tasks()
        self.stats = fmt.aggregate_stats(self.stats, ep_stats)
        fmt.write_json_atomic(self.root / fmt.STATS_PATH, fmt.stats_to_json(self.stats))
        self.info["total_episodes"] = ep + 1
        self.info["total_frames"] = start + n
        self.info["total_tasks"] = len(self.tasks)
        self.info["splits"] = {"train": f"0:{ep + 1}"}
        fmt.write_json_atomic(self.root / fmt.INFO_PATH, self.info)  # the commit point
        self._frames.clear()
        self._samples.clear()
        log.info("saved episode %d (%d frames, task %r) to %s", ep, n, task, self.root)
        return ep

    def close(self) -> None:
        if self.episode_frames:
            log.warning("closing %s with %d unsaved frames: the episode is discarded", self.root, self.episode_frames)
        self.discard_episode()

    # ------------------------------------------------------------------ internals
    def _write_tasks(self) -> None:
        import pyarrow as pa

        names = sorted(self.tasks, key=self.tasks.get)
        table = pa.table({"task": pa.array(names, pa.string()), "task_index": pa.array([self.tasks[t] for t in names], pa.int64())})
        # pandas metadata: LeRobot reads this file with pandas, which restores the task strings as the index
        pandas_meta = {
            "index_columns": ["task"],
            "column_indexes": [],
            "columns": [
                {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
                {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
            ],
            "pandas_version": "2.2.0",
        }
        table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
        _write_parquet_atomic(table, self.root / fmt.TASKS_PATH)

    def _load_tasks(self) -> dict[str, int]:
        import pyarrow.parquet as pq

        path = self.root / fmt.TASKS_PATH
        if not path.exists():
            return {}
        t = pq.read_table(path).to_pydict()
        if "task" not in t:
            raise fmt.DatasetError(f"{path} has no 'task' column (not written by rlinf-user?)")
        return {str(name): int(i) for name, i in zip(t["task"], t["task_index"], strict=True)}

    def _remove_leftovers(self) -> None:
        """Delete what a crash left behind: files of uncommitted episodes, partial/tmp files."""
        keep = self.num_episodes
        removed = []
        for sub in ("data", "meta/episodes", "videos"):
            base = self.root / sub
            if not base.exists():
                continue
            for path in sorted(base.rglob("*")):
                if not path.is_file():
                    continue
                name = path.name
                if name.endswith((".partial", ".tmp")):
                    removed.append(path)
                    continue
                if name.startswith("file-") and path.parent.name.startswith("chunk-"):
                    try:
                        c = int(path.parent.name[6:])
                        f = int(name[5:].split(".")[0])
                    except ValueError:
                        continue
                    if c * fmt.CHUNK_SIZE + f >= keep:
                        removed.append(path)
        for p in self.root.glob("meta/*.tmp"):
            removed.append(p)
        if removed:
            log.warning(
                "%s: removing %d file(s) of an episode that was not completely saved (a crash while recording?): %s",
                self.root,
                len(removed),
                ", ".join(str(p.relative_to(self.root)) for p in removed),
            )
            for p in removed:
                p.unlink(missing_ok=True)
        self.recovered = [str(p.relative_to(self.root)) for p in removed]
