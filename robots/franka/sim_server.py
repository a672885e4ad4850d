"""Start franky-sim (the libfranka network protocol over MuJoCo physics) for tests and demos.

franky-sim serves one simulated FR3 + Franka Hand on ``<hostname>`` with the robot on TCP
port 1337 and the gripper on TCP port 1338, exactly like a real robot's FCI, so
:class:`~rlinf_user.robots.franka.driver.FrankyArm` drives it unchanged (with
``realtime=False``). Simulated time runs at wall-clock speed (1 ms physics steps, 1 kHz).

Two ways to run it:

* **subprocess** (the default): ``python -m franky_sim.run_server --simulator mujoco``. The
  simulator's 1 kHz Python loop then runs on its own interpreter and GIL, so it neither slows
  the caller's Python control loop nor is slowed by it.
* **in-process** (``render=True`` or ``in_process=True``): the simulator runs in a daemon
  thread of this process. Needed for :meth:`FrankySimHandle.render_rgb`, which renders the
  MuJoCo scene offscreen (set ``MUJOCO_GL=egl`` on a headless machine before MuJoCo is first
  imported). The thread shares the GIL with the caller.

franky-sim has no safety reflexes (an unreachable target simply never converges) and no cameras
of its own.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

ROBOT_PORT = 1337  # libfranka's fixed command port (the gripper uses 1338)
GRIPPER_PORT = 1338
_READY_LINE = "Connect to the server using"  # printed by franky_sim.run_server when serving


def _port_accepts(hostname: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class FrankySimHandle:
    """A running franky-sim server. ``close()`` (or leaving a ``with`` block) stops it."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self.startup_s = float("nan")  # wall seconds from start request to port open
        self._proc: subprocess.Popen | None = None
        self._sim: Any = None  # franky_sim MujocoSimulator (in-process only)
        self._server: Any = None  # franky_sim SimulationServer (in-process only)
        self._snapshot_lock = threading.Lock()
        self._snapshot_request = threading.Event()
        self._snapshot_ready = threading.Event()
        self._snapshot_qpos: np.ndarray | None = None
        self._render_data: Any = None
        self._renderers: dict[tuple[int, int, int], Any] = {}
        self._ready = threading.Event()  # the server is fully up (model built, ports bound)
        self._output: collections.deque[str] = collections.deque(maxlen=40)  # subprocess log

    # ------------------------------------------------------------------ lifecycle

    @property
    def in_process(self) -> bool:
        return self._server is not None

    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self._server is not None and bool(self._server.running)

    @property
    def model(self) -> Any:
        """The MuJoCo ``MjModel`` (in-process only; read-only use, the sim thread owns it)."""
        return None if self._sim is None else self._sim.model

    def close(self) -> None:
        """Stop the server (idempotent)."""
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()
        if self._proc is not None:
            proc, self._proc = self._proc, None
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # run_server shuts down cleanly on Ctrl+C
                try:
                    proc.wait(timeout=0.7)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5.0)
            logger.info("franky-sim subprocess on %s stopped", self.hostname)
        if self._server is not None:
            server, self._server = self._server, None
            server.cleanup()  # stops and joins the loop thread, closes the sockets
            self._sim.cleanup()
            self._sim = None
            logger.info("in-process franky-sim on %s stopped", self.hostname)

    def __enter__(self) -> FrankySimHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ rendering

    def _post_step(self, sim: Any) -> None:
        # Runs in the simulator thread after each physics step: copy qpos when asked (µs).
        if self._snapshot_request.is_set():
            self._snapshot_qpos = np.array(sim.data.qpos, copy=True)
            self._snapshot_request.clear()
            self._snapshot_ready.set()

    def camera_intrinsics(self, camera: str | None, width: int, height: int) -> dict[str, Any]:
        """The pinhole model of :meth:`render_rgb` images: MuJoCo renders with square pixels,
        the principal point at the centre and the camera's vertical field of view (the
        free camera's: the model's ``visual/global/fovy``)."""
        if self._sim is None:
            raise RuntimeError("camera_intrinsics needs the simulator in this process")
        import mujoco

        model = self._sim.model
        if camera is None:
            fovy = float(model.vis.global_.fovy)
        else:
            cid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            if cid < 0:
                raise ValueError(f"no camera {camera!r} in the scene; it has {[model.camera(i).name for i in range(model.ncam)]}")
            fovy = float(model.cam_fovy[cid])
        f = 0.5 * height / np.tan(np.deg2rad(fovy) / 2)
        return {"width": int(width), "height": int(height), "fx": f, "fy": f, "cx": (width - 1) / 2,
                "cy": (height - 1) / 2, "dist": [0.0] * 5, "source": "mujoco"}  # fmt: skip

    def render_rgb(
        self,
        camera: str | None = None,
        width: int = 128,
        height: int = 128,
        *,
        lookat: Sequence[float] = (0.35, 0.0, 0.3),
        distance: float = 1.6,
        azimuth: float = 150.0,
        elevation: float = -25.0,
        shadows: bool = False,
    ) -> np.ndarray:
        """Render the scene as an RGB image ``(height, width, 3)`` uint8.

        ``camera`` names an MJCF camera of the scene; ``None`` uses a free camera looking at
        ``lookat`` (base frame, metres) from ``distance`` metres, ``azimuth``/``elevation`` in
        degrees. The state is a consistent snapshot taken between two physics steps. Call it
        from one thread (the GL context belongs to the thread that first renders). Without a
        GPU (EGL on Mesa's software rasteriser) a 160x120 frame takes ~0.1 s, twice that with
        ``shadows``. Several threads may render (each gets its own GL context).
        """
        if self._sim is None:
            raise RuntimeError(
                "render_rgb needs the simulator in this process: start_franky_sim(render=True)"
            )
        import mujoco

        model = self._sim.model
        with self._snapshot_lock:
            self._snapshot_ready.clear()
            self._snapshot_request.set()
            if not self._snapshot_ready.wait(timeout=1.0):
                raise RuntimeError("franky-sim did not step within 1 s; is the server running?")
            if self._render_data is None:
                self._render_data = mujoco.MjData(model)
            self._render_data.qpos[:] = self._snapshot_qpos
            mujoco.mj_forward(model, self._render_data)
            # a GL context is current in one thread: each rendering thread (one per sim
            # camera) gets its own renderer
            key = (threading.get_ident(), int(width), int(height))
            renderer = self._renderers.get(key)
            if renderer is None:
                renderer = mujoco.Renderer(model, height=key[2], width=key[1])
                self._renderers[key] = renderer
            if camera is None:
                cam = mujoco.MjvCamera()
                cam.type = mujoco.mjtCamera.mjCAMERA_FREE
                cam.lookat[:] = lookat
                cam.distance, cam.azimuth, cam.elevation = distance, azimuth, elevation
                renderer.update_scene(self._render_data, camera=cam)
            else:
                if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera) < 0:
                    names = [model.camera(i).name for i in range(model.ncam)]
                    raise ValueError(f"no camera {camera!r} in the scene; it has {names}")
                renderer.update_scene(self._render_data, camera=camera)
            renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = shadows
            return renderer.render().copy()


def _start_in_process(handle: FrankySimHandle, viewer: bool, initial_joints: Any, scene: Any = None) -> None:
    from franky_sim import SimulationServer
    from franky_sim.mujoco_simulator import MujocoSimulator

    sim = MujocoSimulator(enable_visualization=viewer)
    sim.init()
    if initial_joints is None:
        sim.add_robot()
    else:
        sim.add_robot(initial_q=tuple(float(q) for q in initial_joints))
    if scene is not None:
        scene(sim)  # extends the MJCF (props, cameras) before the model is built
    sim.register_post_step_callback(handle._post_step)
    server = SimulationServer(sim, hostname_candidates=[handle.hostname])
    try:
        server.init()  # binds 1337/1338 and builds the MuJoCo model
    except OSError as exc:
        sim.cleanup()
        raise RuntimeError(f"franky-sim could not bind {handle.hostname}:{ROBOT_PORT}: {exc}") from exc
    server.run_async()
    handle._sim, handle._server = sim, server
    handle._ready.set()


def _start_subprocess(handle: FrankySimHandle, viewer: bool, initial_joints: Any) -> None:
    if initial_joints is not None:
        raise ValueError("initial_joints needs in_process=True (run_server has no such option)")
    cmd = [sys.executable, "-m", "franky_sim.run_server", "--simulator", "mujoco"]
    cmd += ["--hostname", handle.hostname] + (["--render"] if viewer else [])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    from rlinf_user.procs import die_with_parent

    handle._proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        preexec_fn=lambda: die_with_parent(signal.SIGKILL),  # never outlive the caller
    )
    # Drain the child's output (a full pipe would block its loop) and spot its ready line,
    # which run_server prints once the MuJoCo model is built and the server is bound.
    threading.Thread(target=_drain, args=(handle,), daemon=True).start()


def _drain(handle: FrankySimHandle) -> None:
    proc = handle._proc
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        handle._output.append(line)
        if _READY_LINE in line:
            handle._ready.set()
        logger.debug("franky-sim: %s", line)


def start_franky_sim(
    render: bool = False,
    *,
    hostname: str = "127.0.0.1",
    in_process: bool | None = None,
    viewer: bool = False,
    initial_joints: Sequence[float] | None = None,
    scene: Any = None,
    timeout_s: float = 60.0,
) -> FrankySimHandle:
    """Start franky-sim (MuJoCo) serving one FR3 on ``hostname`` and wait for its robot port.

    Args:
        render: enable :meth:`FrankySimHandle.render_rgb` (forces ``in_process``).
        hostname: loopback address to bind; the robot listens on ``hostname:1337``.
        in_process: run the simulator in a thread of this process instead of a subprocess;
            default: only when ``render`` is set.
        viewer: open MuJoCo's interactive viewer window (needs a display).
        initial_joints: the arm's initial joint angles (7 values, radians; in-process only).
        scene: ``scene(sim)`` adds to the MJCF before the model is built (props, boards,
            cameras; in-process only), e.g. :func:`.sim_scene.calibration_scene`.
        timeout_s: how long to wait for the robot port before giving up.

    Raises:
        RuntimeError: the port is taken, or the server did not come up within ``timeout_s``.
    """
    in_process = (render or scene is not None) if in_process is None else in_process
    if scene is not None and not in_process:
        raise ValueError("a scene needs in_process=True: it edits the model built here")
    if render and not in_process:
        raise ValueError("render=True needs in_process=True: the MuJoCo model must live here")
    if _port_accepts(hostname, ROBOT_PORT):
        from rlinf_user.procs import port_holder

        holder = port_holder(ROBOT_PORT, hostname) or "an unknown process"
        raise RuntimeError(f"{hostname}:{ROBOT_PORT} is already served by {holder}: stop it first "
                           "(a franky-sim left by an earlier run?)")  # fmt: skip
    handle = FrankySimHandle(hostname)
    t0 = time.monotonic()
    try:
        if in_process:
            _start_in_process(handle, viewer, initial_joints, scene)
        else:
            _start_subprocess(handle, viewer, initial_joints)
        while not (handle._ready.is_set() and _port_accepts(hostname, ROBOT_PORT)):
            if handle._proc is not None and handle._proc.poll() is not None:
                time.sleep(0.1)  # let the drain thread collect the last lines
                out = "\n".join(handle._output)
                raise RuntimeError(f"franky-sim exited with {handle._proc.returncode}:\n{out}")
            if time.monotonic() - t0 > timeout_s:
                where = f"{hostname}:{ROBOT_PORT}"
                raise RuntimeError(f"franky-sim did not come up on {where} in {timeout_s} s")
            time.sleep(0.02)
    except BaseException:
        handle.close()
        raise
    handle.startup_s = time.monotonic() - t0
    logger.info(
        "franky-sim (%s) serving %s:%d after %.2f s",
        "in-process" if in_process else "subprocess", hostname, ROBOT_PORT, handle.startup_s,
    )
    return handle

