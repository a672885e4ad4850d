"""Cameras through the edge daemon: capture thread -> daemon -> wire -> remote env.

(1) ``rlinf-user edge`` with a synthetic 640x480 camera resized to 128x128 and JPEG-encoded
on the edge; (2) a RealSense camera on pyrealsense2's software device (the real
``RealSenseCamera`` code path, frames injected as a device would deliver them) served by
an in-process daemon: frames arrive byte-exact with their capture stamps, and a camera
that stops delivering is reported stale without stalling the robot's steps.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

pytest.importorskip("gym_hil")

from edge_helpers import EdgeProcess, free_ports  # noqa: E402

from rlinf_user.edge.client import EdgeClient  # noqa: E402
from rlinf_user.edge.remote_env import RemoteRobotEnv  # noqa: E402

GYM_HIL = {"kind": "sim", "backend": "gym_hil", "task": "PandaPickCube", "max_episode_steps": 100,
           "cameras": [], "image_size": 128, "reward": "dense", "sim_device": "cpu",
           "control_hz": 20.0, "success_bonus": 0.0, "kwargs": {}, "edge": None}  # fmt: skip


def test_synthetic_camera_is_cropped_encoded_and_stamped_on_the_edge(tmp_path):
    port = free_ports(3)
    cam = "[{name: wrist, kind: synthetic, width: 640, height: 480, fps: 15, resize: [128, 128], jpeg_quality: 90}]"
    edge = EdgeProcess(["--sim", "gym_hil", "control_hz=20", f"cameras={cam}"], port,
                       tmp_path / "edge.log")  # fmt: skip
    env = None
    try:
        env = RemoteRobotEnv(EdgeClient("127.0.0.1", port), "edge", {}, ["wrist"], 20, seed=0)
        assert env.observation_space["images"]["wrist"].shape == (128, 128, 3)
        obs, _ = env.reset(seed=0)
        stamps = []
        for _ in range(10):
            obs, *_ = env.step(np.zeros(7, np.float32))
            received = time.monotonic()
            img = obs["images"]["wrist"]
            assert img.shape == (128, 128, 3) and img.dtype == np.uint8 and img.std() > 1
            age = received - float(obs["timestamps"]["wrist"])  # same host, same clock
            assert 0 <= age < 0.25, age
            stamps.append(float(obs["timestamps"]["wrist"]))
        assert len(set(stamps)) > 1 and stamps == sorted(stamps)  # fresh frames, in order
        stats = env.telemetry()["cameras"]["wrist"]
        assert stats["frames"] > 0
        # the same frames on the latest-value stream (port + 1), e.g. for a monitoring UI
        import zmq

        from rlinf_user.edge.protocol import decode

        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.linger = 0
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port + 1}")
        kinds = set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "frame" not in kinds:
            env.step(np.zeros(7, np.float32))
            while sub.poll(10):
                m = decode(sub.recv_multipart())
                kinds.add(m.kind)
                if m.kind == "frame":
                    assert m.body["camera"] == "wrist" and m.arrays["jpeg"].size > 100
        sub.close()
        assert {"frame", "state"} <= kinds
    finally:
        if env is not None:
            env.close()
        edge.close()


def test_realsense_software_device_served_byte_exact_and_staleness_reported():
    rs = pytest.importorskip("pyrealsense2")
    from test_realsense_software import H, SoftwareColourDevice, W

    from rlinf_user.edge.daemon import EdgeDaemon
    from rlinf_user.edge.factory import sim_backend
    from rlinf_user.robots.cameras.base import CameraConfig
    from rlinf_user.robots.cameras.capture import CaptureThread
    from rlinf_user.robots.cameras.realsense import RealSenseCamera

    sw = SoftwareColourDevice("rgb8")
    cfg = CameraConfig(name="rs", width=W, height=H, fps=30, stall_timeout_s=5.0)
    stream = CaptureThread(RealSenseCamera(cfg, device=sw.device)).start()
    rng = np.random.default_rng(0)
    sent: dict[int, np.ndarray] = {}
    feeding = threading.Event()
    feeding.set()
    stop = threading.Event()

    def feed():
        k = 0
        while not stop.is_set():
            if feeding.is_set():
                img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
                img[0, 0, 0] = k % 256  # frame id in the first pixel
                sent[k % 256] = img
                sw.inject(img, k, time.time() * 1e3, rs.timestamp_domain.system_time)
                k += 1
            time.sleep(1 / 30)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    port = free_ports(3)
    daemon = EdgeDaemon(functools.partial(sim_backend, GYM_HIL), port=port, control_hz=20,
                        cameras={"rs": stream}, frame_max_age_s=0.2)  # fmt: skip
    daemon.start()
    server = threading.Thread(target=daemon.run, daemon=True)
    server.start()
    env = RemoteRobotEnv(EdgeClient("127.0.0.1", port), "edge", {}, ["rs"], 100, seed=0)
    try:
        env.reset(seed=0)
        time.sleep(0.3)
        for _ in range(5):
            obs, _, _, _, info = env.step(np.zeros(7, np.float32))
            img = obs["images"]["rs"]
            np.testing.assert_array_equal(img, sent[int(img[0, 0, 0])])  # byte-exact
            assert "stale_cameras" not in info
        feeding.clear()  # the camera stops delivering
        time.sleep(0.5)
        t0 = time.monotonic()
        for _ in range(5):
            _, _, _, tr, info = env.step(np.zeros(7, np.float32))
        assert info["stale_cameras"] == ["rs"] and not tr
        assert time.monotonic() - t0 < 5 * 1.5 / 20  # steps keep the control rate
        feeding.set()
        time.sleep(0.5)
        _, _, _, _, info = env.step(np.zeros(7, np.float32))
        assert "stale_cameras" not in info
    finally:
        env.close()
        daemon.stop()
        server.join(10)
        stop.set()


def test_franky_sim_scene_camera_follows_the_arm(tmp_path):
    """A ``kind: sim`` camera renders franky-sim's MuJoCo scene through the capture path."""
    pytest.importorskip("franky_sim")
    port = free_ports(3)
    cam = "[{name: scene, kind: sim, width: 96, height: 96, fps: 5}]"
    edge = EdgeProcess(["--robot", "franka", "franky_sim=true", "robot.ip=127.0.0.51",
                        "control_hz=10", "frame_max_age_s=0.5", f"cameras={cam}"],
                       port, tmp_path / "edge.log")  # fmt: skip
    env = None
    try:
        env = RemoteRobotEnv(EdgeClient("127.0.0.1", port, timeout_s=3.0), "reach", {}, ["scene"], 40)
        obs, _ = env.reset(seed=0)
        first = obs["images"]["scene"].astype(np.int16)
        move = np.array([0, 1.0, 0, 0, 0, 0, 0], np.float32)
        for _ in range(15):
            obs, *_ = env.step(move)
        last = obs["images"]["scene"]
        assert last.shape == (96, 96, 3)
        assert np.abs(last.astype(np.int16) - first).mean() > 1.0  # the arm moved in view
        assert float(obs["timestamps"]["scene"]) <= time.monotonic()
    finally:
        if env is not None:
            env.close()
        edge.close()
