"""Edge safety filter: refusals, clipping, workspace box, tilt limit, gripper hysteresis."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from rlinf_user.edge.safety import SafetyConfig, SafetyFilter, UnsafeCommand
from rlinf_user.robots.arm import ArmState

DOWN = Rotation.from_euler("x", np.pi).as_quat()  # tool pointing down


def state(pos=(0.5, 0.0, 0.3), quat=DOWN):
    return ArmState(0.0, np.array(pos, float), np.array(quat, float), np.zeros(6), np.zeros(7), 0.0)


def make(**kw):
    f = SafetyFilter(SafetyConfig(**kw))
    f.set_home(DOWN)
    return f


@pytest.mark.parametrize("bad", [[np.nan] * 7, [0, 0, np.inf, 0, 0, 0, 0], [0.1] * 6, "left", None])
def test_non_finite_or_malformed_actions_are_refused(bad):
    f = make()
    with pytest.raises(UnsafeCommand):
        f.command(bad, state())
    assert f.counts["refused"] == 1


def test_translation_is_scaled_from_the_measured_pose():
    f = make(max_translation=0.02, target_mode="measured")
    cmd, breaches = f.command([1, -0.5, 0, 0, 0, 0, 0], state())
    np.testing.assert_allclose(cmd.tcp_position, [0.52, -0.01, 0.3])
    assert breaches == []
    assert Rotation.from_quat(cmd.tcp_quaternion).approx_equal(Rotation.from_quat(DOWN), atol=1e-9)


def test_out_of_range_values_are_clipped_and_logged():
    f = make(max_translation=0.02)
    cmd, breaches = f.command([5, 0, 0, 0, 0, 0, 0], state())
    np.testing.assert_allclose(cmd.tcp_position, [0.52, 0.0, 0.3])
    assert [b.kind for b in breaches] == ["clip"] and "5.0" in breaches[0].detail


def test_workspace_box_clips_targets_and_reports_the_offending_command():
    f = make(workspace_low=(0.3, -0.2, 0.05), workspace_high=(0.6, 0.2, 0.5), max_translation=0.05,
             workspace_margin=0.0, brake_distance=0.0, target_mode="measured")
    cmd, breaches = f.command([0, 0, -1, 0, 0, 0, 0], state(pos=(0.5, 0.0, 0.07)))
    assert cmd.tcp_position[2] == pytest.approx(0.05)
    assert breaches[0].kind == "workspace" and "action" in breaches[0].detail
    assert f.counts["workspace"] == 1


def test_rotation_is_about_base_axes_and_tilt_is_limited():
    f = make(max_rotation=0.1, max_tilt=0.15, target_mode="measured")
    cmd, _ = f.command([0, 0, 0, 0, 0, 1, 0], state())
    rel = Rotation.from_quat(cmd.tcp_quaternion) * Rotation.from_quat(DOWN).inv()
    np.testing.assert_allclose(rel.as_rotvec(), [0, 0, 0.1], atol=1e-9)
    tilted = (Rotation.from_rotvec([0.12, 0, 0]) * Rotation.from_quat(DOWN)).as_quat()
    cmd, breaches = f.command([1, 0, 0, 1, 0, 0, 0], state(quat=tilted))
    angle = (Rotation.from_quat(DOWN).inv() * Rotation.from_quat(cmd.tcp_quaternion)).magnitude()
    assert angle == pytest.approx(0.15) and breaches[-1].kind == "tilt"


def test_gripper_has_hysteresis():
    f = make(gripper_threshold=0.5)
    seq = [0.9, 0.3, -0.3, -0.9, 0.4, 0.6]
    closed = [f.command([0, 0, 0, 0, 0, 0, g], state())[0].gripper_closed for g in seq]
    assert closed == [True, True, True, False, False, True]


def test_bad_workspace_config_is_refused():
    with pytest.raises(ValueError, match="workspace"):
        SafetyConfig(workspace_low=(0, 0, 1), workspace_high=(1, 1, 0))


def test_commanded_mode_integrates_deltas_on_the_last_target():
    f = make(max_translation=0.02, max_rotation=0.1)
    here = state()
    first, _ = f.command([0.5, 0, 0, 0, 0, 0.5, 0], here)
    second, _ = f.command([0.5, 0, 0, 0, 0, 0.5, 0], here)  # the arm has not moved yet
    np.testing.assert_allclose(second.tcp_position, [0.52, 0.0, 0.3])
    rel = Rotation.from_quat(second.tcp_quaternion) * Rotation.from_quat(DOWN).inv()
    np.testing.assert_allclose(rel.as_rotvec(), [0, 0, 0.1], atol=1e-9)
    f.restart()  # a hold: the next step starts from the measured pose again
    third, _ = f.command([0.5, 0, 0, 0, 0, 0, 0], here)
    np.testing.assert_allclose(third.tcp_position, [0.51, 0.0, 0.3])


def test_a_blocked_arm_never_winds_up_the_target():
    f = make(max_translation=0.02, max_lead=0.03, max_lead_rotation=0.2)
    blocked = state()
    for _ in range(20):
        cmd, breaches = f.command([1, 0, 0, 0, 0, 1, 0], blocked)
    assert np.linalg.norm(cmd.tcp_position - blocked.tcp_position) == pytest.approx(0.03)
    rel = Rotation.from_quat(cmd.tcp_quaternion) * Rotation.from_quat(DOWN).inv()
    assert rel.magnitude() == pytest.approx(0.2)
    assert [b.kind for b in breaches] == ["lead"] and f.counts["lead"] >= 17
    back, _ = f.command([-1, 0, 0, 0, 0, 0, 0], blocked)  # reversing acts at once
    assert back.tcp_position[0] == pytest.approx(0.51)


def test_targets_keep_the_margin_and_slow_down_near_a_face():
    f = make(workspace_low=(0.3, -0.2, 0.05), workspace_high=(0.6, 0.2, 0.5), max_translation=0.05,
             workspace_margin=0.01, brake_distance=0.05, brake_gain=0.5, target_mode="measured")
    far, _ = f.command([1, 0, 0, 0, 0, 0, 0], state(pos=(0.4, 0, 0.3)))
    assert far.tcp_position[0] == pytest.approx(0.45)  # 14 cm from the inner face: full step
    near, _ = f.command([1, 0, 0, 0, 0, 0, 0], state(pos=(0.57, 0, 0.3)))
    assert near.tcp_position[0] == pytest.approx(0.57 + 0.5 * 0.02)  # 2 cm left: lead 1 cm
    at, breaches = f.command([1, 0, 0, 0, 0, 0, 0], state(pos=(0.595, 0, 0.3)))
    assert at.tcp_position[0] == pytest.approx(0.59) and "workspace" in [b.kind for b in breaches]
    away, _ = f.command([-1, 0, 0, 0, 0, 0, 0], state(pos=(0.58, 0, 0.3)))
    assert away.tcp_position[0] == pytest.approx(0.53)  # leaving a face is never slowed


def test_a_measured_pose_outside_the_box_is_a_safety_event():
    f = make(workspace_low=(0.3, -0.2, 0.05), workspace_high=(0.6, 0.2, 0.5), box_tolerance=0.002)
    assert f.check_measured(state(pos=(0.6015, 0, 0.3))) is None  # within tolerance
    event = f.check_measured(state(pos=(0.5, 0.2031, 0.3)))
    assert event.kind == "box_exit" and "3.1 mm" in event.detail and f.counts["box_exit"] == 1
    hold = f.hold_inside(state(pos=(0.5, 0.2031, 0.3)))
    assert hold.tcp_position[1] == pytest.approx(0.19)  # pulled back inside the margin


def test_bad_safety_modes_and_margins_are_refused():
    with pytest.raises(ValueError, match="target_mode"):
        SafetyConfig(target_mode="absolute")
    with pytest.raises(ValueError, match="no room"):
        SafetyConfig(workspace_low=(0, 0, 0), workspace_high=(0.1, 1, 1), workspace_margin=0.05)


def test_tilt_limit_holds_in_commanded_mode_without_winding_up():
    f = make(max_rotation=0.1, max_tilt=0.3, max_lead_rotation=1.0)
    here = state()
    for _ in range(10):  # the arm does not follow: targets integrate, the tilt limit caps them
        cmd, breaches = f.command([0, 0, 0, 1, 0, 0, 0], here)
    tilt = (Rotation.from_quat(DOWN).inv() * Rotation.from_quat(cmd.tcp_quaternion)).magnitude()
    assert tilt == pytest.approx(0.3) and breaches[-1].kind == "tilt"
    back, _ = f.command([0, 0, 0, -1, 0, 0, 0], here)  # one step back is one step off the limit
    tilt = (Rotation.from_quat(DOWN).inv() * Rotation.from_quat(back.tcp_quaternion)).magnitude()
    assert tilt == pytest.approx(0.2)


@pytest.mark.parametrize("target_mode", ["commanded", "measured"])
def test_near_a_face_position_comes_before_orientation(target_mode):
    """The orientation target may lead the measured orientation by less the closer the TCP
    is to a face (a rotation at a face dragged the TCP out of the box through the impedance
    controller): the full lead 6 cm inside, 0.05 rad at the margin, none at the face."""
    f = make(workspace_low=(0.3, -0.2, 0.05), workspace_high=(0.6, 0.2, 0.5), workspace_margin=0.01,
             brake_distance=0.05, max_rotation=0.3, max_lead_rotation=0.2, face_lead_rotation=0.05,
             target_mode=target_mode)  # fmt: skip

    def lead(x: float) -> float:
        f.restart()
        cmd, _ = f.command([0, 0, 0, 0, 1, 0, 0], state(pos=(x, 0, 0.3)))
        return (Rotation.from_quat(cmd.tcp_quaternion) * Rotation.from_quat(DOWN).inv()).magnitude()

    assert lead(0.45) == pytest.approx(0.2)  # 14 cm from the face: the whole lead
    assert lead(0.6 - 0.01 - 0.025) == pytest.approx(0.05 + 0.15 * 0.5)  # halfway through the brake zone
    assert lead(0.59) == pytest.approx(0.05)  # at the margin
    assert lead(0.595) == pytest.approx(0.025)  # halfway to the face
    assert lead(0.6) == pytest.approx(0.0, abs=1e-9) and lead(0.61) == pytest.approx(0.0, abs=1e-9)
    # translation is untouched by it: a step back from the face is a whole step
    f.restart()
    back, _ = f.command([-1, 0, 0, 0, 1, 0, 0], state(pos=(0.6, 0, 0.3)))
    assert back.tcp_position[0] == pytest.approx(0.6 - 0.02)


def test_face_lead_rotation_is_checked():
    with pytest.raises(ValueError, match="face_lead_rotation"):
        SafetyConfig(max_lead_rotation=0.2, face_lead_rotation=0.3)
