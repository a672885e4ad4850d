"""LeRobot's own pi0 (``PI0Pytorch``) at a tiny size: random weights saved in LeRobot's
checkpoint layout, and the chunk it samples from fixed inputs and noise, for
``tests/integration/test_pi0_lerobot_oracle.py`` to compare with rlinf-user's pi0.

Runs in a separate interpreter whose path holds openpi's patched transformers 4.53.2 first
(LeRobot's pi0 requires it: ``pip install "transformers @ git+https://github.com/huggingface/
transformers.git@fix/lerobot_openpi"``, or openpi's ``transformers_replace`` copied over
transformers 4.53.2), then LeRobot's isolated package folder (scripts/install_lerobot_env.sh).
Only LeRobot's size tables are replaced (its configs offer gemma_300m/gemma_2b and the
so400m tower); its model code runs as shipped. Usage: ``python lerobot_pi0.py OUT_DIR``.
"""

import importlib.abc
import importlib.machinery
import json
import sys
import types
from pathlib import Path

import torch

# torchvision here is a wheel built for another torch: registering its custom op's schema lets it import
_lib = torch.library.Library("torchvision", "DEF")
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for the robot-hardware packages LeRobot's policy factory imports
    (serial ports, caches) and a pi0 never uses."""

    names = {"serial", "cachebox"}

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.append(_Absent())
import lerobot  # noqa: E402

# lerobot.policies/__init__ imports every policy (groot needs diffusers): load pi0's modules only
_pkg = types.ModuleType("lerobot.policies")
_pkg.__path__ = [str(Path(lerobot.__path__[0]) / "policies")]
sys.modules["lerobot.policies"] = _pkg

from lerobot.policies.pi0 import modeling_pi0 as m  # noqa: E402
from lerobot.policies.pi0.configuration_pi0 import PI0Config  # noqa: E402
from safetensors.torch import save_model  # noqa: E402


def tiny_gemma(variant):  # 8 heads: LeRobot's joint layer assumes them
    return m.GemmaConfig(width=64 if variant == "gemma_2b" else 32, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1,
                         head_dim=16)  # fmt: skip


_PaliGemma = m.PaliGemmaForConditionalGeneration


def tiny_paligemma(config):  # the vision tower of rlinf-user's "tiny" SigLIP size
    v = config.vision_config
    v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads = 32, 64, 2, 2
    v.patch_size, v.image_size = 8, 32
    v.projection_dim = config.projection_dim = config.text_config.hidden_size
    return _PaliGemma(config=config)


m.get_gemma_config = tiny_gemma
m.PaliGemmaForConditionalGeneration = tiny_paligemma

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
cfg = PI0Config(device="cpu", chunk_size=4, n_action_steps=4, max_state_dim=8, max_action_dim=8,
                image_resolution=(32, 32), num_inference_steps=3)  # fmt: skip
torch.manual_seed(0)
model = m.PI0Pytorch(cfg).eval()
b = 2
g = torch.Generator().manual_seed(1)
inputs = {
    "images": [torch.rand(b, 3, 32, 32, generator=g) * 2 - 1],
    "masks": [torch.ones(b, dtype=torch.bool)],
    "tokens": torch.randint(0, 1000, (b, 5), generator=g),
    "token_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool),
    "state": torch.randn(b, 8, generator=g),
    "noise": torch.randn(b, 4, 8, generator=g),
}
with torch.no_grad():
    actions = model.sample_actions(inputs["images"], inputs["masks"], inputs["tokens"], inputs["token_mask"],
                                   inputs["state"], noise=inputs["noise"])  # fmt: skip
# saved as PI0Policy saves itself (huggingface_hub's mixin: safetensors' save_model of the
# policy, whose pi0 is its ``model``; the tied embedding/lm_head tensor is stored once)
holder = torch.nn.Module()
holder.model = model
save_model(holder, str(out / "model.safetensors"))
state = model.state_dict()
(out / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": 4, "max_action_dim": 8, "max_state_dim": 8,
                                             "num_inference_steps": 3}))  # fmt: skip
(out / "policy_preprocessor.json").write_text(json.dumps({"steps": []}))
torch.save({**inputs, "actions": actions}, out / "io.pt")
print(json.dumps({"lerobot": lerobot.__version__ if hasattr(lerobot, "__version__") else "?", "keys": len(state)}))
