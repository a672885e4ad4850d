"""gym_hil's operational-space controller, computed faster and to the same bits.

gym_hil runs its ``opspace`` controller (``gym_hil.controllers.opspace``) in Python before
every physics substep: 50 per env step. It rebuilds its gain arrays, allocates its
Jacobian and mass buffers and does quaternion arithmetic on 4-element numpy arrays each
time, which made it about three quarters of an env step's cost. :class:`FastOpspace`
keeps gym_hil's default gains precomputed and its buffers allocated, does the scalar
quaternion work on Python floats, and keeps every matrix operation of the original in
the original order, so the torques are bit-for-bit the library's (asserted against the
installed gym_hil over whole episodes in ``tests/integration/test_gym_hil_backend.py``).

:func:`use_fast_control` swaps it into a built env's ``apply_action``.
"""

from __future__ import annotations

import logging
import math
import types
from importlib import metadata
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# gym_hil releases whose controller this reproduces, compared bit for bit by the test;
# another release keeps its own controller until the test has been run against it
VERIFIED_GYM_HIL = ("0.1.14",)


class FastOpspace:
    """``opspace(model, data, site_id, dof_ids, pos, ori=quat, joint, gravity_comp=True)``
    with gym_hil's default gains (200 position and orientation, damping ratio 1,
    nullspace stiffness 0.5, no acceleration limits)."""

    def __init__(self, model: Any, site_id: int, dof_ids: np.ndarray, joint: np.ndarray):
        import mujoco

        self.model, self.site_id = model, int(site_id)
        self._jac_site, self._full_mass = mujoco.mj_jacSite, mujoco.mj_fullM  # looked up once
        # an index array, as gym_hil indexes: its copies are contiguous, and a strided
        # view (a slice) sends the matrix products down another BLAS path whose sums
        # round differently in the last bit
        self.dof = dof = np.asarray(dof_ids)
        kp = np.full(3, 200.0)
        self.kp_x, self.kd_x = -kp, -(1.0 * 2 * np.sqrt(kp))  # the gains enter negated
        kp_joint = np.full(dof.size, 0.5)
        self.kp_q, self.kd_q = -kp_joint, -(1.0 * 2 * np.sqrt(kp_joint))
        self.q_des = np.asarray(joint, np.float64)
        self.jac_v = np.zeros((3, model.nv))
        self.jac_w = np.zeros((3, model.nv))
        self.mass = np.zeros((model.nv, model.nv))
        self.eye = np.eye(dof.size)

    def __call__(self, data: Any, pos: np.ndarray, quat_des: np.ndarray) -> np.ndarray:
        dof = self.dof
        q, dq = data.qpos[dof], data.qvel[dof]
        self._jac_site(self.model, data, self.jac_v, self.jac_w, self.site_id)
        jv, jw = self.jac_v[:, dof], self.jac_w[:, dof]
        jac = np.concatenate([jv, jw], axis=0)
        ddx = (data.site_xpos[self.site_id] - pos) * self.kp_x + (jv @ dq) * self.kd_x
        quat = _mat_to_quat(data.site_xmat[self.site_id])
        qd = (float(quat_des[0]), float(quat_des[1]), float(quat_des[2]), float(quat_des[3]))
        if quat[0] * qd[0] + quat[1] * qd[1] + quat[2] * qd[2] + quat[3] * qd[3] < 0.0:
            quat = (-quat[0], -quat[1], -quat[2], -quat[3])
        dw = np.array(_axis_angle(_quat_diff(qd, quat))) * self.kp_x + (jw @ dq) * self.kd_x
        self._full_mass(self.model, self.mass, data.qM)
        mass = self.mass[dof, :][:, dof]
        mass_inv = np.linalg.inv(mass)
        mx_inv = jac @ mass_inv @ jac.T
        mx = np.linalg.inv(mx_inv) if abs(np.linalg.det(mx_inv)) >= 1e-2 else np.linalg.pinv(mx_inv, rcond=1e-2)
        tau = jac.T @ mx @ np.concatenate([ddx, dw], axis=0)
        ddq = (q - self.q_des) * self.kp_q + dq * self.kd_q
        jnull = mass_inv @ jac.T @ mx
        tau += (self.eye - jac.T @ jnull.T) @ ddq
        tau += data.qfrc_bias[dof]
        return tau


def _mat_to_quat(mat: np.ndarray) -> tuple[float, float, float, float]:
    """gym_hil's ``mat_to_quat`` ([w, x, y, z]) on floats; ``mat`` is 9 values, row-major."""
    m00, m01, m02, m10, m11, m12, m20, m21, m22 = (float(v) for v in mat)
    trace = m00 + m11 + m22
    if trace > 0:
        s = 2.0 * math.sqrt(trace + 1.0)
        return 0.25 * s, (m21 - m12) / s, (m02 - m20) / s, (m10 - m01) / s
    if m00 > m11 and m00 > m22:
        s = 2.0 * math.sqrt(1.0 + m00 - m11 - m22)
        return (m21 - m12) / s, 0.25 * s, (m01 + m10) / s, (m02 + m20) / s
    if m11 > m22:
        s = 2.0 * math.sqrt(1.0 + m11 - m00 - m22)
        return (m02 - m20) / s, (m01 + m10) / s, 0.25 * s, (m12 + m21) / s
    s = 2.0 * math.sqrt(1.0 + m22 - m00 - m11)
    return (m10 - m01) / s, (m02 + m20) / s, (m12 + m21) / s, 0.25 * s


def _quat_diff(source: tuple, target: tuple) -> tuple[float, float, float, float]:
    """target * conj(source), as gym_hil's ``quat_diff_active``."""
    w2, x2, y2, z2 = source[0], -source[1], -source[2], -source[3]
    w1, x1, y1, z1 = target
    return (
        w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
        w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
        w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
        w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
    )


def _axis_angle(quat: tuple) -> tuple[float, float, float]:
    """gym_hil's ``quat_to_axisangle`` on floats."""
    w, x, y, z = quat
    norm = math.sqrt(w * w + x * x + y * y + z * z)
    if norm < 1e-10:
        return 0.0, 0.0, 0.0
    w, x, y, z = w / norm, x / norm, y / norm, z / norm
    angle = 2.0 * float(np.arccos(min(max(w, -1.0), 1.0)))  # numpy's arccos: math.acos can differ by an ulp
    sin_half = math.sqrt(1.0 - w * w)
    if sin_half < 1e-10:
        return angle * x, angle * y, angle * z
    return angle * (x / sin_half), angle * (y / sin_half), angle * (z / sin_half)


def _apply_action(self: Any, action: np.ndarray) -> None:
    """gym_hil's ``FrankaGymEnv.apply_action`` with :class:`FastOpspace` as its controller."""
    import mujoco
    from gym_hil.mujoco_gym_env import MAX_GRIPPER_COMMAND

    x, y, z, _rx, _ry, _rz, grasp_command = action
    pos = self._data.mocap_pos[0].copy()
    self._data.mocap_pos[0] = np.clip(pos + np.asarray([x, y, z]), *self._cartesian_bounds)
    g = self._data.ctrl[self._gripper_ctrl_id] / MAX_GRIPPER_COMMAND
    self._data.ctrl[self._gripper_ctrl_id] = np.clip(g + grasp_command, 0.0, 1.0) * MAX_GRIPPER_COMMAND
    control, step = self._fast_opspace, mujoco.mj_step
    for _ in range(self._n_substeps):
        self._data.ctrl[self._panda_ctrl_ids] = control(self._data, self._data.mocap_pos[0], self._data.mocap_quat[0])
        step(self._model, self._data)


def use_fast_control(env: Any) -> bool:
    """Give a built gym_hil env (unwrapped) the fast controller; False (nothing changed)
    for an env whose ``apply_action`` is not gym_hil's base one (a task overriding it) or
    a gym_hil release the controller was not compared against."""
    from gym_hil.mujoco_gym_env import FrankaGymEnv

    if type(env).apply_action is not FrankaGymEnv.apply_action:
        return False
    release = metadata.version("gym-hil")
    if release not in VERIFIED_GYM_HIL:
        log.info("gym_hil %s: its own controller (the fast one is verified on %s)", release, ", ".join(VERIFIED_GYM_HIL))
        return False
    env._fast_opspace = FastOpspace(env._model, env._pinch_site_id, env._panda_dof_ids, env._home_position)
    env.apply_action = types.MethodType(_apply_action, env)
    return True
