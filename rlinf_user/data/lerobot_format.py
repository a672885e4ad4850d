"""The LeRobotDataset v3.0 on-disk format: paths, features and statistics.

A dataset folder holds::

    meta/info.json                                   format version, fps, features, totals
    meta/stats.json                                  per-feature statistics (normalisation)
    meta/tasks.parquet                               task strings -> task_index
    meta/episodes/chunk-CCC/file-FFF.parquet         one row per episode: length, file indices
    data/chunk-CCC/file-FFF.parquet                  one row per frame
    videos/<video key>/chunk-CCC/file-FFF.mp4        one video per camera

LeRobot's own writer appends many episodes to one parquet/mp4 file; rlinf-user writes one
file per episode (``file_index`` = episode index within its chunk of 1000), which is the
same format (every episode row names its files and time range) and means a finished
episode is never rewritten, so a crash can only lose the episode being recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

CODEBASE_VERSION = "v3.0"
CHUNK_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)

# Columns every LeRobot dataset has, computed by the writer.
DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}

STATE_KEY = "observation.state"
ACTION_KEY = "action"
IMAGE_PREFIX = "observation.images."


class DatasetError(ValueError):
    """A dataset that cannot be written or read as asked; the message says what to do."""


def chunk_file(episode_index: int) -> tuple[int, int]:
    return divmod(int(episode_index), CHUNK_SIZE)


def episode_paths(root: Path, episode_index: int, video_keys: list[str]) -> dict[str, Path]:
    c, f = chunk_file(episode_index)
    paths = {
        "data": root / DATA_PATH.format(chunk_index=c, file_index=f),
        "meta": root / EPISODES_PATH.format(chunk_index=c, file_index=f),
    }
    for key in video_keys:
        paths[key] = root / VIDEO_PATH.format(video_key=key, chunk_index=c, file_index=f)
    return paths


def contract_features(
    state_dim: int,
    cameras: Mapping[str, tuple[int, int]],
    fps: int,
    state_names: list[str] | None = None,
    action_names: list[str] | None = None,
    codec: str = "h264",
) -> dict[str, dict[str, Any]]:
    """LeRobot features for env-contract episodes, with rlinf-user's extra columns.

    ``intervention`` (a human acted on this step), ``policy_version`` (the weights that
    acted; -1 for a human-only demonstration) and the step outcome (``next.reward``,
    ``next.done`` = the episode ends after this frame, ``next.truncated`` = it ended by a
    time limit or a lost connection rather than a terminal state, ``next.success``) ride
    along as ordinary columns.
    """
    from rlinf_user.env.contract import ACTION_NAMES

    feats: dict[str, dict[str, Any]] = {
        STATE_KEY: {
            "dtype": "float32",
            "shape": [int(state_dim)],
            "names": list(state_names) if state_names else [f"s{i}" for i in range(state_dim)],
        },
        ACTION_KEY: {"dtype": "float32", "shape": [7], "names": list(action_names or ACTION_NAMES)},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "next.truncated": {"dtype": "bool", "shape": [1], "names": None},
        "next.success": {"dtype": "bool", "shape": [1], "names": None},
        "intervention": {"dtype": "bool", "shape": [1], "names": None},
        "policy_version": {"dtype": "int64", "shape": [1], "names": None},
    }
    for name, (h, w) in cameras.items():
        feats[IMAGE_PREFIX + name] = {
            "dtype": "video",
            "shape": [int(h), int(w), 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": int(h),
                "video.width": int(w),
                "video.codec": codec,
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": int(fps),
                "video.channels": 3,
                "has_audio": False,
            },
        }
    return {**feats, **DEFAULT_FEATURES}


def comparable(features: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple]:
    """What must agree between two feature sets for their episodes to share a dataset."""
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in features.items()}


def feature_mismatch(have: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    a, b = comparable(have), comparable(want)
    problems = [f"{k}: dataset has {a[k]}, env gives {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    problems += [f"{k}: only in the dataset" for k in sorted(a.keys() - b.keys())]
    problems += [f"{k}: only in the env" for k in sorted(b.keys() - a.keys())]
    return problems


# info.json key (ours, beside LeRobot's) holding the env reward the rewards were recorded under
REWARD_INFO_KEY = "rlinf_user_reward"


REWARD_SETTINGS = ("reward", "success_bonus")


def reward_info(env_cfg) -> dict[str, Any]:
    """The reward settings a recording's ``next.reward`` column follows. ``bonus_applied``:
    its success steps hold the bonus (recordings made before recorders applied the run's
    shaping lack the mark, and the bonus; their loader adds it)."""
    return {"reward": str(env_cfg.reward), "success_bonus": float(env_cfg.get("success_bonus", 0.0) or 0.0),
            "bonus_applied": True}  # fmt: skip


def same_reward(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two recordings' rewards follow the same settings (marks aside)."""
    return all(a.get(k) == b.get(k) for k in REWARD_SETTINGS)


def reward_mismatch(recorded: dict[str, Any] | None, env_cfg) -> str | None:
    """Why rewards recorded under ``recorded`` do not fit ``env_cfg``'s (None: they do, or unknown)."""
    if not recorded:
        return None
    now = reward_info(env_cfg)
    if same_reward(recorded, now):
        return None
    return (
        f"its rewards were recorded with env.reward={recorded.get('reward')} env.success_bonus={recorded.get('success_bonus')}, "
        f"this run uses env.reward={now['reward']} env.success_bonus={now['success_bonus']}: record them again with "
        "this run's settings, or train with theirs"
    )


def empty_info(fps: int, features: dict[str, Any], robot_type: str | None) -> dict[str, Any]:
    has_video = any(f["dtype"] == "video" for f in features.values())
    return {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": 0,
        "total_frames": 0,
        "total_tasks": 0,
        "chunks_size": CHUNK_SIZE,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": int(fps),
        "splits": {},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if has_video else None,
        "features": features,
    }


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def numeric_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """Per-dimension statistics of an (N, ...) array, in LeRobot's stats.json layout."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    out = {
        "min": x.min(0),
        "max": x.max(0),
        "mean": x.mean(0),
        "std": x.std(0),
        "count": np.array([len(x)]),
    }
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(x, q, axis=0)
    return out


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel statistics of (N, H, W, 3) uint8 frames scaled to [0, 1], shape (3, 1, 1)."""
    x = np.asarray(frames, dtype=np.float64) / 255.0
    per = x.transpose(3, 0, 1, 2).reshape(3, -1)
    out = {
        "min": per.min(1),
        "max": per.max(1),
        "mean": per.mean(1),
        "std": per.std(1),
    }
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(per, q, axis=1)
    out = {k: v.reshape(3, 1, 1) for k, v in out.items()}
    out["count"] = np.array([len(frames)])
    return out


def aggregate_stats(a: dict[str, dict[str, np.ndarray]] | None, b: dict[str, dict[str, np.ndarray]]) -> dict:
    """Merge per-feature statistics: exact min/max/mean/std, count-weighted quantiles."""
    if not a:
        return b
    out = {}
    for key in a.keys() | b.keys():
        if key not in a or key not in b:
            out[key] = a.get(key) or b[key]
            continue
        sa, sb = a[key], b[key]
        na, nb = float(sa["count"][0]), float(sb["count"][0])
        n = na + nb
        mean = (sa["mean"] * na + sb["mean"] * nb) / n
        var = ((sa["std"] ** 2 + (sa["mean"] - mean) ** 2) * na + (sb["std"] ** 2 + (sb["mean"] - mean) ** 2) * nb) / n
        merged = {
            "min": np.minimum(sa["min"], sb["min"]),
            "max": np.maximum(sa["max"], sb["max"]),
            "mean": mean,
            "std": np.sqrt(var),
            "count": np.array([int(n)]),
        }
        for q in QUANTILES:
            k = f"q{round(q * 100):02d}"
            if k in sa and k in sb:
                merged[k] = (sa[k] * na + sb[k] * nb) / n
        out[key] = merged
    return out


def stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {k: {s: np.asarray(v).tolist() for s, v in d.items()} for k, d in stats.items()}


def stats_from_json(data: dict) -> dict[str, dict[str, np.ndarray]]:
    return {k: {s: np.asarray(v) for s, v in d.items()} for k, d in data.items()}
