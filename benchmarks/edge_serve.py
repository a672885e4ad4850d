"""The daemon side of the edge benchmarks: ``bench_edge.py --_serve`` builds the CLI's daemon
with recorders, and the client side's remote env."""


from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
from edge_common import POLICIES  # noqa: E402

# ----------------------------------------------------------------------------------------
# --_serve: the daemon process (same config and construction as `rlinf-user edge`)


def recording_backend(make_backend, path: str):
    """Runs in the control-loop process: record every tick's wake-up error, then build the
    real backend and time its ``apply`` calls. The records (monotonic time, error s), the
    apply intervals and the loop's scheduling policy are written when the loop closes its
    backend."""
    from rlinf_user.edge import control_loop

    records: list[tuple[float, float]] = []
    stats = getattr(control_loop, "TimingStats", None)
    if stats is not None and hasattr(stats, "add"):
        original = stats.add

        def add(self, err, _original=original):
            records.append((time.monotonic(), err))
            _original(self, err)

        stats.add = add
    backend = make_backend()
    close, apply = backend.close, backend.apply
    applies: list[tuple[float, float]] = []

    def timed_apply(action):
        t0 = time.monotonic()
        try:
            return apply(action)
        finally:
            applies.append((t0, time.monotonic()))

    def close_and_dump():
        try:
            param = os.sched_getparam(0).sched_priority
            policy = os.sched_getscheduler(0)
            np.save(path + ".npy", np.asarray(records, dtype=np.float64).reshape(-1, 2))
            np.save(path + ".apply.npy", np.asarray(applies, dtype=np.float64).reshape(-1, 2))
            Path(path + ".meta.json").write_text(json.dumps(
                {"policy": POLICIES.get(policy, str(policy)), "priority": param,
                 "recorded": stats is not None}))  # fmt: skip
        finally:
            close()

    backend.close = close_and_dump
    backend.apply = timed_apply
    return backend


class AttachRecorder:
    """Wraps a capture stream in the daemon: logs (frame stamp, time read, reading method) so
    the time a frame was attached to an observation (``_attach_frames``) is known."""

    def __init__(self, stream):
        self._stream = stream
        self.log: list[tuple[float, float, str]] = []

    def latest(self):
        frame = self._stream.latest()
        if frame is not None:
            self.log.append((frame.stamp, time.monotonic(), sys._getframe(1).f_code.co_name))
        return frame

    def __getattr__(self, name):
        return getattr(self._stream, name)


def serve(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s daemon %(levelname)s %(message)s")
    from rlinf_user.cli.edge import build_daemon
    from rlinf_user.edge.config import compose_edge_config

    cfg = compose_edge_config(spec["overrides"], robot=spec.get("robot"), sim=spec.get("sim"))
    sim_server = None
    if cfg.franky_sim:
        from rlinf_user.robots.franka.sim_server import start_franky_sim

        render = any(c.get("kind") == "sim" for c in cfg.cameras)  # a franky-sim scene camera
        sim_server = start_franky_sim(hostname=cfg.robot.ip, render=render)
    daemon = None
    recorders: dict[str, AttachRecorder] = {}
    try:
        daemon = build_daemon(cfg, sim_server)
        if spec.get("ticks_path"):
            daemon.make_backend = functools.partial(recording_backend, daemon.make_backend,
                                                    spec["ticks_path"])  # fmt: skip
        if spec.get("attach_path"):
            recorders = {k: AttachRecorder(s) for k, s in daemon.cameras.items()}
            daemon.cameras = dict(recorders)
        signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
        daemon.start()
        print("BENCH-EDGE-READY", flush=True)
        daemon.run()
    finally:
        if daemon is not None:
            daemon.close()
        if sim_server is not None:
            sim_server.close()
        if spec.get("attach_path"):
            Path(spec["attach_path"]).write_text(json.dumps({k: r.log for k, r in recorders.items()}))


# ----------------------------------------------------------------------------------------
# clients


def remote_env(port: int, cameras: list[str], task: str = "edge", keys: dict | None = None):
    from rlinf_user.edge.client import EdgeClient
    from rlinf_user.edge.remote_env import RemoteRobotEnv

    keys = keys or {}
    client = EdgeClient("127.0.0.1", port, server_public_key=keys.get("edge_public"),
                        client_secret_key=keys.get("client_secret"), timeout_s=30.0)  # fmt: skip
    return RemoteRobotEnv(client, task, {}, cameras, 10**9, seed=0, hello_timeout_s=30.0)


def step_for(env, seconds: float, on_step=None) -> tuple[float, float, list[float]]:
    """Reset (untimed), then step with zero actions for ``seconds``; (start, end, step times)."""
    env.reset(seed=0)
    action = np.zeros(7, np.float32)
    t0 = time.monotonic()
    durations = []
    while time.monotonic() - t0 < seconds:
        t = time.monotonic()
        obs, *_ = env.step(action)
        now = time.monotonic()
        durations.append(now - t)
        if on_step is not None:
            on_step(obs, now)
    return t0, time.monotonic(), durations
