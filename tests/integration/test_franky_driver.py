"""FrankyArm against franky-sim: the real libfranka protocol over loopback, MuJoCo physics.

One franky-sim subprocess serves the whole module (127.0.0.1:1337/1338) and one driver stays
connected to it (franky-sim takes a single client). Simulated time runs at wall-clock speed,
so the timing bounds here are real seconds; they are loose enough for a loaded 2-core machine.
"""

from __future__ import annotations

import socket
import statistics
import time

import numpy as np
import pytest

pytest.importorskip(
    "franky_sim", reason="needs franky-sim (pip install 'rlinf-user[franka-sim]')"
)
pytest.importorskip("franky", reason="needs franky (pip install 'rlinf-user[franka-sim]')")

from rlinf_user.robots.arm import ArmCommand, ArmError, ArmState  # noqa: E402
from rlinf_user.robots.franka.driver import FrankaDriverConfig, FrankyArm  # noqa: E402
from rlinf_user.robots.franka.sim_server import start_franky_sim  # noqa: E402

SIM_HOST = "127.0.0.1"


def _config(**overrides: object) -> FrankaDriverConfig:
    # realtime=False: no PREEMPT_RT kernel here; a brisker homing than the real-robot default.
    settings: dict = {"ip": SIM_HOST, "realtime": False, "relative_dynamics_factor": 0.4}
    return FrankaDriverConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def sim():
    handle = start_franky_sim(hostname=SIM_HOST)
    print(f"franky-sim subprocess up in {handle.startup_s:.2f} s")
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def arm(sim):
    driver = FrankyArm(_config())
    driver.connect()
    yield driver
    driver.close()


def _angle(q1: np.ndarray, q2: np.ndarray) -> float:
    """Rotation angle (rad) between two unit quaternions."""
    return 2.0 * float(np.arccos(min(1.0, abs(float(np.dot(q1, q2))))))


def _wait_for(predicate, timeout_s: float, period_s: float = 0.01) -> float | None:
    """Seconds until ``predicate()`` held, or None after ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 <= timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(period_s)
    return None


def test_connect_home_reaches_reset_joints(arm: FrankyArm) -> None:
    t0 = time.monotonic()
    state = arm.home()
    print(f"home() took {time.monotonic() - t0:.2f} s")
    assert isinstance(state, ArmState)
    # franky-sim's joint position control sags ~0.03 rad under gravity on joints 2 and 4.
    np.testing.assert_allclose(state.joint_positions, arm.config.reset_joints, atol=0.05)
    assert state.error is None
    assert state.gripper < 0.1  # opened by home()
    assert np.linalg.norm(state.tcp_velocity[:3]) < 0.05


def test_read_is_finite_and_monotonic(arm: FrankyArm) -> None:
    arm.home()
    stamps = []
    for _ in range(20):
        state = arm.read()
        stamps.append(state.stamp)
        for field in (state.tcp_position, state.tcp_quaternion, state.tcp_velocity):
            assert np.all(np.isfinite(field))
        assert state.tcp_position.shape == (3,) and state.tcp_quaternion.shape == (4,)
        assert state.tcp_velocity.shape == (6,) and state.joint_positions.shape == (7,)
        assert np.isfinite(state.gripper) and 0.0 <= state.gripper <= 1.0
        assert abs(np.linalg.norm(state.tcp_quaternion) - 1.0) < 1e-6
        assert state.proprio().shape == (14,)
        time.sleep(0.002)
    assert all(b > a for a, b in zip(stamps, stamps[1:]))


def test_track_converges_and_holds_orientation(arm: FrankyArm) -> None:
    start = arm.home()
    target = start.tcp_position + np.array([0.05, 0.0, 0.0])
    arm.track(ArmCommand(target, start.tcp_quaternion, gripper_closed=False))
    took = _wait_for(lambda: np.linalg.norm(arm.read().tcp_position - target) < 0.01, 3.0)
    print(f"5 cm step: within 1 cm after {took} s")
    assert took is not None, f"TCP at {arm.read().tcp_position}, target {target}"
    time.sleep(0.5)
    state = arm.read()
    assert np.linalg.norm(state.tcp_position - target) < 0.01
    assert _angle(state.tcp_quaternion, start.tcp_quaternion) < np.deg2rad(3.0)
    assert state.error is None


def test_track_returns_fast(arm: FrankyArm) -> None:
    start = arm.home()
    latencies = []
    for i in range(50):
        offset = np.array([0.0, 0.0005 * i, 0.0])
        command = ArmCommand(start.tcp_position + offset, start.tcp_quaternion, False)
        t0 = time.perf_counter()
        arm.track(command)
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.002)
    median = statistics.median(latencies)
    print(f"track(): median {median * 1e6:.1f} us, max {max(latencies) * 1e6:.1f} us")
    assert median < 5e-3  # smoke bound; the real figure is tens of microseconds


def test_gripper_close_then_open(arm: FrankyArm) -> None:
    start = arm.home()
    assert start.gripper < 0.1
    t0 = time.perf_counter()
    arm.track(ArmCommand(start.tcp_position, start.tcp_quaternion, gripper_closed=True))
    assert time.perf_counter() - t0 < 0.05  # the grasp runs in the background
    assert _wait_for(lambda: arm.read().gripper > 0.9, 4.0) is not None
    arm.track(ArmCommand(start.tcp_position, start.tcp_quaternion, gripper_closed=False))
    assert _wait_for(lambda: arm.read().gripper < 0.1, 4.0) is not None


def test_hold_stops_the_arm(arm: FrankyArm) -> None:
    start = arm.home()
    far = start.tcp_position + np.array([0.20, 0.0, 0.0])
    arm.track(ArmCommand(far, start.tcp_quaternion, False))
    # under load the simulated arm starts later: wait (bounded) until it is on its way
    deadline = time.monotonic() + 2.0
    while np.linalg.norm(arm.read().tcp_velocity[:3]) <= 0.1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert np.linalg.norm(arm.read().tcp_velocity[:3]) > 0.1  # it was on its way
    arm.hold()
    time.sleep(0.5)
    deadline = time.monotonic() + 2.5  # stopped within 0.5 s idle, within 3 s on a loaded machine
    settled = arm.read()
    while float(np.linalg.norm(settled.tcp_velocity[:3])) >= 0.03 and time.monotonic() < deadline:
        time.sleep(0.05)
        settled = arm.read()
    speed = float(np.linalg.norm(settled.tcp_velocity[:3]))
    time.sleep(1.0)
    drift = float(np.linalg.norm(arm.read().tcp_position - settled.tcp_position))
    print(f"hold(): speed {speed:.4f} m/s once settled, drift {drift * 1000:.2f} mm over 1 s")
    assert speed < 0.03
    assert drift < 0.005
    assert np.linalg.norm(settled.tcp_position - far) > 0.05  # it did not go on to the target


def test_stop_then_recover(arm: FrankyArm) -> None:
    start = arm.home()
    arm.stop()
    with pytest.raises(ArmError, match="not tracking"):
        arm.track(ArmCommand(start.tcp_position, start.tcp_quaternion, False))
    assert arm.recover()
    arm.track(ArmCommand(start.tcp_position, start.tcp_quaternion, False))
    assert arm.read().error is None


def test_versions(arm: FrankyArm) -> None:
    versions = arm.versions()
    assert versions["franky"] and versions["driver"] == "franky"
    assert "libfranka" in versions and "franka_hand_server" in versions


def test_unreachable_robot_fails_fast() -> None:
    # Nothing listens on this loopback address: the connection is refused at once.
    driver = FrankyArm(_config(ip="127.0.0.254", gripper="none"))
    t0 = time.monotonic()
    with pytest.raises(ArmError, match="127.0.0.254"):
        driver.connect()
    assert time.monotonic() - t0 < 2.0


def test_silent_robot_times_out() -> None:
    # A host that accepts TCP but never answers would block libfranka for minutes.
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.253", 1337))
    except OSError as exc:
        listener.close()
        pytest.skip(f"cannot bind a second loopback address here: {exc}")
    listener.listen(1)
    try:
        driver = FrankyArm(_config(ip="127.0.0.253", gripper="none", connect_timeout_s=1.0))
        t0 = time.monotonic()
        with pytest.raises(ArmError, match=r"127\.0\.0\.253.*unreachable"):
            driver.connect()
        assert time.monotonic() - t0 < 3.0
    finally:
        listener.close()  # resets the pending connection, so the abandoned attempt ends


def test_read_before_connect_raises(sim) -> None:
    with pytest.raises(ArmError, match="not connected"):
        FrankyArm(_config()).read()


def test_render_rgb_in_process() -> None:
    # A second, in-process franky-sim on another loopback address, for the camera hook.
    try:
        handle = start_franky_sim(render=True, hostname="127.0.0.2")
    except RuntimeError as exc:
        pytest.skip(f"no second franky-sim here: {exc}")
    try:
        image = handle.render_rgb(width=64, height=48)
        assert image.shape == (48, 64, 3) and image.dtype == np.uint8
        assert image.std() > 5.0  # a scene, not a blank frame
        with pytest.raises(ValueError, match="no camera"):
            handle.render_rgb(camera="no_such_camera")
    finally:
        handle.close()
