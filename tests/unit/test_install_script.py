"""scripts/install.sh picks the CPU build of torch from every source pip is configured with.

Run on a clean HOME with no pip configuration file, so only what a test sets is seen: a
find-links folder given by the environment (PIP_FIND_LINKS, as some machines configure
pip) must be used, and PyTorch's CPU index may only ever be an extra index beside PyPI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fake_torch_wheel(folder: Path, version: str = "2.13.0+cpu") -> Path:
    """A minimal valid wheel named like the CPU build (pip checks its metadata)."""
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def _torch_args(tmp_path: Path, find_links: Path) -> str:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(HOME=str(home), PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(find_links),
               PIP_RETRIES="0", PIP_TIMEOUT="1", PYTHON=sys.executable, TORCH_VERSION="2.13.0",
               PATH="/usr/bin:/bin")  # fmt: skip
    out = subprocess.run(["bash", str(ROOT / "scripts/install.sh"), "--torch-args"], env=env,
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return out.stdout.strip()


def test_a_cpu_wheel_offered_by_the_environment_is_used(tmp_path):
    links = tmp_path / "wheels"
    links.mkdir()
    wheel = _fake_torch_wheel(links)
    args = _torch_args(tmp_path, links)
    assert args.endswith(wheel.name), args  # a copy of the local wheel, no index consulted


def test_without_a_local_wheel_the_cpu_index_is_extra_never_a_replacement(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = _torch_args(tmp_path, empty).split()
    assert args[0] == "torch==2.13.0+cpu"
    assert "--extra-index-url" in args and "--index-url" not in args


def test_the_installer_never_imports_torch_to_read_its_version():
    script = (ROOT / "scripts/install.sh").read_text()
    assert "import torch" not in script
