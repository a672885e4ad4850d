"""Process and measurement helpers shared by the edge benchmarks (bench_edge.py)."""


from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CAMERA_640 = {"name": "wrist", "kind": "synthetic", "width": 640, "height": 480, "fps": 15}
POLICIES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE"}

# ----------------------------------------------------------------------------------------
# machine description


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def fifo_probe(priority: int = 40) -> dict[str, Any]:
    """Whether a fresh process may switch itself to SCHED_FIFO ``priority`` (and why not)."""
    code = (
        "import os\n"
        "try:\n"
        f"    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param({priority})); print('ok')\n"
        "except OSError as e:\n"
        "    print('denied:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    return {"granted": out == "ok", "detail": out, "priority": priority}


def machine() -> dict[str, Any]:
    import msgpack
    import zmq

    cpu, flags = "unknown", ""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name") and cpu == "unknown":
            cpu = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line
    import resource

    rtprio = resource.getrlimit(resource.RLIMIT_RTPRIO)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "virtualised": " hypervisor" in flags,
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "preempt_rt": Path("/sys/kernel/realtime").exists(),
        "clocksource": _read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "sched_rt_runtime_us": _read("/proc/sys/kernel/sched_rt_runtime_us"),
        "rlimit_rtprio": list(rtprio),
        "sched_fifo": fifo_probe(40),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "msgpack": ".".join(map(str, msgpack.version)),
    }


# ----------------------------------------------------------------------------------------
# statistics


def summarise(values_ms: np.ndarray, unit: str = "ms") -> dict[str, Any]:
    v = np.asarray(values_ms, dtype=np.float64)
    if v.size == 0:
        return {"n": 0}
    s = 1e3 if unit == "us" else 1.0
    r = 1 if unit == "us" else 3
    return {
        "n": int(v.size),
        f"p50_{unit}": round(float(np.median(v)) * s, r),
        f"p99_{unit}": round(float(np.percentile(v, 99)) * s, r),
        f"max_{unit}": round(float(v.max()) * s, r),
        f"mean_{unit}": round(float(v.mean()) * s, r),
    }


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    parts = [float(x) for x in (_read("/proc/stat") or "cpu 0 0 0 0").splitlines()[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0.0)
    return sum(parts) - idle, sum(parts)


def busy_pct(a: tuple[float, float], b: tuple[float, float]) -> float | None:
    total = b[1] - a[1]
    return round(100.0 * (b[0] - a[0]) / total, 1) if total > 0 else None


def background(args, label: str) -> float | None:
    """CPU busy % over 1 s before a case starts (other processes on the machine); waits up to
    ``--wait-quiet`` s for it to drop to ``--quiet-pct``."""
    deadline = time.monotonic() + args.wait_quiet
    while True:
        a = cpu_times()
        time.sleep(1.0)
        pct = busy_pct(a, cpu_times())
        if pct is None or pct <= args.quiet_pct or time.monotonic() >= deadline:
            return pct
        print(f"[{label}] {pct}% CPU busy before starting: waiting for a quieter machine", flush=True)
        time.sleep(4.0)


# ----------------------------------------------------------------------------------------
# processes: load generators, daemons; all cleaned up at exit

_CHILDREN: list[Any] = []


def _cleanup() -> None:
    while _CHILDREN:
        child = _CHILDREN.pop()
        try:
            child.close()
        except Exception as err:  # noqa: BLE001 - keep cleaning up the rest
            print(f"cleanup: {err}", file=sys.stderr)


def _on_signal(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")


def _burn(stop) -> None:
    """A busy loop mixing pure-Python integer math and single-threaded numpy."""
    a = np.random.default_rng(0).random(50_000)
    x = 1
    while not stop.is_set():
        for _ in range(5_000):
            x = (x * 1103515245 + 12345) % 2147483648
        a = np.sqrt(a * a + 1.0) - 0.5


FLOODER = """
import sys, time, zmq
from rlinf_user.edge.protocol import Message, encode
s = zmq.Context().socket(zmq.DEALER); s.linger = 0; s.sndhwm = 0
s.connect("tcp://127.0.0.1:" + sys.argv[1])
frames = encode(Message("telemetry", 1)); n = 0
print("flooding", flush=True)
while True:
    s.send_multipart(frames); n += 1
    while s.poll(0):
        s.recv_multipart()
"""


class Flood:
    """A hostile client: raw DEALER, no hello, ``telemetry`` requests as fast as it can."""

    def __init__(self, port: int):
        self.proc = subprocess.Popen([sys.executable, "-c", FLOODER, str(port)], stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)  # fmt: skip
        self.proc.stdout.readline()
        _CHILDREN.append(self)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        if self in _CHILDREN:
            _CHILDREN.remove(self)


class Load:
    """``n`` busy-loop processes (spawned), stopped and joined by ``close``."""

    def __init__(self, n: int):
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=_burn, args=(self.stop,), daemon=True, name=f"burn{i}")
                      for i in range(n)]  # fmt: skip
        for p in self.procs:
            p.start()
        _CHILDREN.append(self)
        time.sleep(0.5)  # let them get going

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(3)
            if p.is_alive():
                p.terminate()
                p.join(2)
        if self in _CHILDREN:
            _CHILDREN.remove(self)


def free_port_pair() -> int:
    from rlinf_user.procs import free_ports

    return free_ports(3)


class Child:
    """A subprocess in its own session (so its whole tree can be ended), logging to a file."""

    def __init__(self, argv: list[str], log_path: Path, ready: str, timeout_s: float = 120.0):
        env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), COLUMNS="200",
                   PYTHONUNBUFFERED="1")  # fmt: skip
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)  # fmt: skip
        _CHILDREN.append(self)
        deadline = time.monotonic() + timeout_s
        while ready not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited {self.proc.returncode}" if self.proc.poll() is not None else (
                    f"not ready after {timeout_s} s")  # fmt: skip
                log = self.log()[-4000:]
                self.close()
                raise RuntimeError(f"{' '.join(argv[1:4])}... {why}:\n{log}")
            time.sleep(0.05)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the session this child leads
                self.proc.wait(5)
        self._log.close()
        if self in _CHILDREN:
            _CHILDREN.remove(self)


def serve_child(spec: dict[str, Any], tmp: Path, name: str) -> Child:
    """This script in ``--_serve`` mode: the CLI's daemon plus recorders, in its own process."""
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    return Child([sys.executable, str(HERE / "bench_edge.py"), "--_serve", str(path)],
                 tmp / f"{name}.log", ready="BENCH-EDGE-READY")  # fmt: skip


def cli_child(args: list[str], tmp: Path, name: str) -> Child:
    """``rlinf-user edge <args>`` exactly as a robot PC runs it."""
    return Child([sys.executable, "-m", "rlinf_user.cli.main", "edge", *args], tmp / f"{name}.log",
                 ready="edge daemon serving")  # fmt: skip
