import importlib.util
import os
import sys
import threading
import types
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MUJOCO_GL", "egl")


def pytest_configure(config):
    # every Ray node a test starts (ray.init, cluster_utils) gives its dashboard agent a free
    # port (the other lane's Ray would otherwise hold the fixed one and cost each start 3.4 s)
    # and starts no autoscaler monitor, as the project's own runs do
    from rlinf_user.runtime.orchestration.placement import lean_local_node

    lean_local_node()
    from cpu_meter import register

    register(config)


_SESSION: list = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001 - pytest's signature
    _SESSION.append(session)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):  # noqa: ARG001 - pytest's signature
    """The suite's process leaves with pytest's exit status once everything is reported, without
    the interpreter's teardown: after a lane in which every test passed, the destructors of the
    native libraries the suite loads (MuJoCo's EGL contexts, SAPIEN's Vulkan, Ray's core worker)
    once crashed the process at exit (a segfault, exit 139, that failed a green run). Child
    processes are ended and Ray shut down first, and the threads still alive are named, so a
    leak stays visible. RLINF_TEST_TEARDOWN=1 keeps the teardown."""
    if not _SESSION or os.environ.get("RLINF_TEST_TEARDOWN") == "1":
        return
    # what the skipped teardown would have done in Python: no child process or Ray node outlives it
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
        child.join(timeout=5)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if alive:
        print(f"threads still alive at exit: {', '.join(sorted(alive))}", file=sys.stderr)
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(_SESSION[-1].exitstatus))


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
