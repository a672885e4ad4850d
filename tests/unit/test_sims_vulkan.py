"""rlinf_user.sims.vulkan: ICD discovery and the doctor status, on temporary folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf_user.sims import vulkan


@pytest.fixture(autouse=True)
def _restore_icd_variable():
    """ensure_vulkan() sets VK_ICD_FILENAMES itself (monkeypatch.delenv of an unset
    variable records nothing to undo): a fake ICD must not outlive the test, or every
    simulator started later in this process (and its Ray workers) gets it."""
    before = vulkan.os.environ.get("VK_ICD_FILENAMES")
    yield
    if before is None:
        vulkan.os.environ.pop("VK_ICD_FILENAMES", None)
    else:
        vulkan.os.environ["VK_ICD_FILENAMES"] = before


def _fake_lavapipe(root: Path) -> Path:
    icd = root / "mesa" / "usr" / "share" / "vulkan" / "icd.d" / "lvp_icd.json"
    icd.parent.mkdir(parents=True)
    icd.write_text('{"ICD": {"library_path": "/nowhere/libvulkan_lvp.so"}}')
    return icd


def test_sets_icd_when_unset_and_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if vulkan.nvidia_driver_present():
        pytest.skip("an NVIDIA driver is present: the system ICD is used instead")
    icd = _fake_lavapipe(tmp_path)
    monkeypatch.setenv("RLINF_USER_DEPS", str(tmp_path))
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    assert vulkan.lavapipe_icd() == icd
    assert vulkan.ensure_vulkan() == str(icd)
    assert vulkan.os.environ["VK_ICD_FILENAMES"] == str(icd)
    assert vulkan.ensure_vulkan() == str(icd)  # idempotent


def test_leaves_a_set_variable_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_lavapipe(tmp_path)
    monkeypatch.setenv("RLINF_USER_DEPS", str(tmp_path))
    monkeypatch.setenv("VK_ICD_FILENAMES", "/custom/icd.json")
    assert vulkan.ensure_vulkan() == "/custom/icd.json"
    assert vulkan.os.environ["VK_ICD_FILENAMES"] == "/custom/icd.json"


def test_does_nothing_without_lavapipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLINF_USER_DEPS", str(tmp_path))
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    assert vulkan.ensure_vulkan() is None
    assert "VK_ICD_FILENAMES" not in vulkan.os.environ


def test_status_names_the_fix_when_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VK_ICD_FILENAMES", "/nonexistent/icd.json")
    status = vulkan.vulkan_status()
    assert set(status) == {"ok", "driver", "icd", "loader", "fix"}
    assert status["ok"] is False
    assert "bash scripts/install_system_deps.sh" in status["fix"]


def test_status_finds_lavapipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if vulkan.nvidia_driver_present():
        pytest.skip("an NVIDIA driver is present")
    icd = _fake_lavapipe(tmp_path)
    monkeypatch.setenv("RLINF_USER_DEPS", str(tmp_path))
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    status = vulkan.vulkan_status()
    assert status["driver"] == "lavapipe" and status["icd"] == str(icd)
    assert status["ok"] == (status["loader"] is not None)
    assert "VK_ICD_FILENAMES" not in vulkan.os.environ  # status only reads
