"""Reading LeRobotDataset v3.0 folders back: episodes as arrays, and as transitions.

Reads any v3.0 dataset whose episode rows name their data/video files (LeRobot's own
many-episodes-per-file layout included: rows are selected by ``episode_index`` and videos
by the episode's timestamp range).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_user.data import lerobot_format as fmt
from rlinf_user.data.video import decode_video
from rlinf_user.env.spec import Col, instruction_array


@dataclass
class Episode:
    index: int
    task: str
    columns: dict[str, np.ndarray]  # feature -> (T, ...) array
    images: dict[str, np.ndarray] = field(default_factory=dict)  # camera -> (T, H, W, 3)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["frame_index"])


class LeRobotReader:
    def __init__(self, root: str | Path):
        import pyarrow.parquet as pq

        self.root = Path(root)
        info_path = self.root / fmt.INFO_PATH
        if not info_path.exists():
            raise fmt.DatasetError(f"{self.root} is not a LeRobot dataset: {fmt.INFO_PATH} is missing")
        self.info = json.loads(info_path.read_text())
        version = self.info.get("codebase_version")
        if version != fmt.CODEBASE_VERSION:
            raise fmt.DatasetError(f"{self.root} is LeRobot format {version}; rlinf-user reads {fmt.CODEBASE_VERSION}")
        self.features: dict[str, dict] = self.info["features"]
        self.fps = int(self.info["fps"])
        self.video_keys = [k for k, v in self.features.items() if v["dtype"] == "video"]
        rows: list[dict] = []
        for path in sorted((self.root / "meta" / "episodes").glob("*/*.parquet")):
            rows.extend(pq.read_table(path).to_pylist())
        rows.sort(key=lambda r: r["episode_index"])
        self.episode_rows = rows[: int(self.info["total_episodes"])]  # uncommitted leftovers are ignored
        tasks_path = self.root / fmt.TASKS_PATH
        self.tasks: dict[int, str] = {}
        if tasks_path.exists():
            t = pq.read_table(tasks_path)
            names = t.column("task").to_pylist() if "task" in t.column_names else t.column("__index_level_0__").to_pylist()
            self.tasks = dict(zip(t.column("task_index").to_pylist(), names, strict=True))

    @property
    def num_episodes(self) -> int:
        return len(self.episode_rows)

    def cameras(self) -> dict[str, tuple[int, int]]:
        out = {}
        for k in self.video_keys:
            h, w, _ = self.features[k]["shape"]
            out[k[len(fmt.IMAGE_PREFIX) :]] = (int(h), int(w))
        return out

    def episode(self, i: int, images: bool = True) -> Episode:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        row = self.episode_rows[i]
        data_path = self.root / self.info["data_path"].format(
            chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
        )
        table = pq.read_table(data_path)
        table = table.filter(pc.equal(table.column("episode_index"), row["episode_index"]))
        cols: dict[str, np.ndarray] = {}
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            ft = self.features.get(name, {})
            if ft.get("shape", [1]) == [1] and not hasattr(col.type, "list_size"):
                cols[name] = col.to_numpy(zero_copy_only=False)
            else:
                cols[name] = np.stack(col.to_pylist()).astype(ft.get("dtype", "float32"))
        order = np.argsort(cols["frame_index"])
        cols = {k: v[order] for k, v in cols.items()}
        n = len(order)
        if n != row["length"]:
            raise fmt.DatasetError(f"episode {i}: {n} data rows, the episode row says {row['length']}")
        frames = {}
        if images:
            for key in self.video_keys:
                path = self.root / self.info["video_path"].format(
                    video_key=key,
                    chunk_index=row[f"videos/{key}/chunk_index"],
                    file_index=row[f"videos/{key}/file_index"],
                )
                video = decode_video(path)
                first = int(round(row[f"videos/{key}/from_timestamp"] * self.fps))
                video = video[first : first + n]
                if len(video) != n:
                    raise fmt.DatasetError(f"episode {i}: {key} has {len(video)} frames for {n} data rows")
                frames[key[len(fmt.IMAGE_PREFIX) :]] = video
        task_idx = int(cols["task_index"][0]) if "task_index" in cols else 0
        meta = {k: v for k, v in row.items() if not k.startswith("stats/")}
        return Episode(int(row["episode_index"]), self.tasks.get(task_idx, ""), cols, frames, meta)

    def state_action_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every frame's ``observation.state`` and ``action``, episodes concatenated."""
        eps = [self.episode(i, images=False) for i in range(self.num_episodes)]
        if not eps:
            raise fmt.DatasetError(f"{self.root} holds no episodes")
        states = np.concatenate([e.columns[fmt.STATE_KEY] for e in eps]).astype(np.float32)
        return states, np.concatenate([e.columns[fmt.ACTION_KEY] for e in eps]).astype(np.float32)

    def episodes(self, images: bool = True):
        for i in range(self.num_episodes):
            yield self.episode(i, images=images)


def episode_transitions(
    ep: Episode, image_keys: list[str] | None = None, instruction: bool = False
) -> dict[str, np.ndarray] | None:
    """An episode as a replay chunk (``obs/state``, ``next_obs/state``, ``action``, ...).

    Frame ``t`` holds ``(obs_t, action_t, next.reward_t, next.done_t)``; ``next_obs_t`` is
    frame ``t+1``'s observation. The last frame has no successor: it is kept when the
    episode terminated there (its ``next_obs`` is never bootstrapped from) and dropped when
    the episode was cut short. ``instruction``: the episode's ``task`` becomes the
    observation's language instruction (LeRobot's convention).
    """
    state = ep.columns[fmt.STATE_KEY].astype(np.float32)
    n = len(state)
    done = ep.columns.get("next.done", np.zeros(n, bool)).astype(bool).reshape(n)
    truncated = ep.columns.get("next.truncated", np.zeros(n, bool)).astype(bool).reshape(n)
    terminated_last = bool(done[-1]) and not bool(truncated[-1])
    keep = n if terminated_last else n - 1
    if keep <= 0:
        return None
    nxt = np.concatenate([state[1:], state[-1:]])
    chunk = {
        Col.state(Col.OBS): state[:keep],
        Col.state(Col.NEXT_OBS): nxt[:keep],
        Col.ACTION: ep.columns[fmt.ACTION_KEY].astype(np.float32)[:keep],
        Col.REWARD: ep.columns.get("next.reward", np.zeros(n, np.float32)).astype(np.float32).reshape(n)[:keep],
        Col.TERMINATED: np.zeros(keep, np.float32),
        Col.TRUNCATED: np.zeros(keep, np.float32),
        Col.POLICY_VERSION: ep.columns.get("policy_version", np.full(n, -1)).astype(np.int64).reshape(n)[:keep],
        Col.INTERVENTION: ep.columns.get("intervention", np.ones(n, bool)).astype(bool).reshape(n)[:keep],
    }
    if terminated_last:
        chunk[Col.TERMINATED][-1] = 1.0
    if instruction:
        chunk[Col.instruction(Col.OBS)] = chunk[Col.instruction(Col.NEXT_OBS)] = instruction_array([ep.task] * keep)
    for cam in image_keys or []:
        frames = ep.images[cam]
        chunk[f"obs/images/{cam}"] = frames[:keep]
        chunk[f"next_obs/images/{cam}"] = np.concatenate([frames[1:], frames[-1:]])[:keep]
    return chunk


def demo_mismatch(reader: LeRobotReader, spec) -> list[str]:
    """Why a dataset's episodes cannot feed training on an env with ``spec`` (empty: fine)."""
    problems = []
    state = reader.features.get(fmt.STATE_KEY)
    if state is None:
        problems.append(f"the dataset has no {fmt.STATE_KEY}")
    elif int(state["shape"][0]) != int(spec.state_dim):
        problems.append(f"{fmt.STATE_KEY} has {state['shape'][0]} dims, the env's state has {spec.state_dim}")
    action = reader.features.get(fmt.ACTION_KEY)
    if action is None or int(action["shape"][0]) != int(spec.contract_action_dim):
        problems.append(f"action is {None if action is None else action['shape']}, the env takes 7-D contract actions")
    have = reader.cameras()
    for cam, hw in dict(spec.cameras).items():
        if cam not in have:
            problems.append(f"camera {cam!r} is not in the dataset (it has {sorted(have) or 'none'})")
        elif tuple(have[cam]) != tuple(hw):
            problems.append(f"camera {cam!r} is {have[cam]} in the dataset, {tuple(hw)} in the env")
    return problems
