"""Helpers for edge tests: free ports, a daemon in its own process, a cuttable TCP link.

No test is defined here. The daemon runs as ``rlinf-user edge`` in a subprocess, the way a
robot PC runs it; the TCP proxy sits on the link between client and daemon so a test can
cut the network and restore it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rlinf_user.procs import free_ports  # noqa: F401 - the tests' import point


def lane_loopback(last: int) -> str:
    """A loopback address for franky-sim unique to this test process: `make test` runs two
    lanes at once, and a module fixture used by tests of both lanes would otherwise start
    two simulators on one address (libfranka's ports are fixed)."""
    return f"127.{1 + os.getpid() % 250}.0.{last}"


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"edge daemon exited with {proc.returncode}:\n{proc.stdout.read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port} after {timeout} s")


class EdgeProcess:
    """``rlinf-user edge <args>`` in a subprocess; ``log()`` returns what it printed."""

    def __init__(self, args: list[str], port: int, log_path: Path, ready_port: int | None = None,
                 nofile: int | None = None):  # fmt: skip
        """``nofile``: the daemon's soft limit on open files at start (the hard one is kept)."""
        env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), COLUMNS="200")
        self.log_path = log_path
        self._log = open(log_path, "w")

        def limit() -> None:
            import resource

            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlinf_user.cli.main", "edge", *args, f"port={port}"],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, preexec_fn=limit,
        )  # fmt: skip
        self.port = port
        self._wait_ready(ready_port or port)

    def _wait_ready(self, port: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge daemon exited {self.proc.returncode}:\n{self.log()}")
            if "edge daemon serving" in self.log():
                return
            time.sleep(0.1)
        raise TimeoutError(f"edge daemon not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


class TcpLink:
    """A TCP relay ``listen_port -> target_port`` whose connections can be cut."""

    def __init__(self, listen_port: int, target_port: int):
        self.listen_port, self.target_port = listen_port, target_port
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self.up()

    def up(self) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.listen_port))
        srv.listen(8)
        self._server = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                a, _ = srv.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._conns += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        """Drop every connection and refuse new ones (a pulled cable)."""
        if self._server is not None:
            try:  # wakes the thread blocked in accept(), which would keep the port listening
                self._server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._server.close()
            self._server = None
        with self._lock:
            for s in self._conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._conns.clear()

    def close(self) -> None:
        self.cut()


def edge_telemetry(port: int, host: str = "127.0.0.1") -> dict:
    """The daemon's telemetry (read-only: any client may ask, the robot stays untouched)."""
    from rlinf_user.edge.client import EdgeClient

    c = EdgeClient(host, port)
    try:
        return c.telemetry()
    finally:
        c.close(say_bye=False)


def running(procs: list) -> list:
    """The processes (psutil) still running: a zombie has exited, only its status is left."""
    import psutil

    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out
