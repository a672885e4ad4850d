"""Load a dataset with LeRobot's own ``LeRobotDataset`` and dump what it returns.

Runs in a separate interpreter whose path starts with LeRobot's isolated package folder
(see scripts/install_lerobot_env.sh): LeRobot pins a torch/torchvision pair that cannot
share rlinf-user's environment. Usage: ``python lerobot_load.py DATASET OUT.npz``.
"""

import json
import sys

import numpy as np
import torch

# torchvision here is a wheel built for another torch; registering its one custom op's
# schema lets it import (LeRobot uses torchvision only for transforms and pyav decoding).
_lib = torch.library.Library("torchvision", "DEF")
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

root, out = sys.argv[1], sys.argv[2]
ds = LeRobotDataset("local/rlinf-user-test", root=root, video_backend="pyav")
arrays = {}
for i in range(len(ds)):
    item = ds[i]
    for k, v in item.items():
        if isinstance(v, torch.Tensor):
            arrays.setdefault(k, []).append(v.numpy())
        elif k == "task":
            arrays.setdefault("task", []).append(v)
np.savez(out, **{k: np.stack(v) if k != "task" else np.array(v) for k, v in arrays.items()})
print(json.dumps({
    "num_episodes": ds.num_episodes,
    "num_frames": ds.num_frames,
    "fps": ds.fps,
    "camera_keys": ds.meta.camera_keys,
    "features": sorted(ds.features),
    "stats_keys": sorted(ds.meta.stats) if ds.meta.stats else [],
}))
