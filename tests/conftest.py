import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MUJOCO_GL", "egl")


def pytest_configure(config):
    # every Ray node a test starts (ray.init, cluster_utils) gives its dashboard agent a free
    # port: the other lane's Ray would otherwise hold the fixed one and cost each start 3.4 s
    from rlinf_user.runtime.orchestration.placement import agent_on_any_free_port

    agent_on_any_free_port()
    from cpu_meter import register

    register(config)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
    # tests of the side environments last: scripts/run_tests.sh installs those beside the lanes
    items.sort(key=lambda item: "side_env" in item.keywords)


@pytest.fixture
def fake_pyzed(monkeypatch):
    """The ZED SDK test double (``tests/fakes/pyzed_sl.py``) installed as ``pyzed.sl``.

    The SDK installs only from Stereolabs' installer; the double mimics the API surface the
    camera code uses (enums, error codes, BGRA layout, nanosecond timestamps)."""
    path = Path(__file__).resolve().parent / "fakes" / "pyzed_sl.py"
    spec = importlib.util.spec_from_file_location("pyzed.sl", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    package = types.ModuleType("pyzed")
    package.__path__ = []
    package.sl = module
    monkeypatch.setitem(sys.modules, "pyzed", package)
    monkeypatch.setitem(sys.modules, "pyzed.sl", module)
    yield module
    if hasattr(module, "_reset"):
        module._reset()
