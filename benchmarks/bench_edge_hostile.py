"""The edge daemon under hostile peers: floods and half-open connections, the controller timed.

``rlinf-user edge --robot franka franky_sim=true`` at 20 Hz with CURVE keys, in its own
process as on a robot PC. The controller is the real :class:`EdgeClient` stepping a policy
at the control rate (``act`` -> the next tick's observation). Attackers are separate
processes speaking the wire format by hand over raw pyzmq sockets (loopback only, bounded
in time), on the same two cores:

``telemetry``   other authorised clients (three processes) flood ``telemetry`` requests flat out;
``mixed``       other authorised clients (three processes) flood a mix (``hello``, ``act``, ``chunk``,
                ``telemetry``, ``ping``, malformed headers, a repeated array name);
``act_flood``   the controller itself sends ``act`` flat out without waiting (a runaway
                policy); the loop's own timing is what counts (nobody else steps);
``half_open``   1,500 TCP connections that never finish the ZMTP/CURVE handshake (half send
                nothing, half a partial greeting), with the daemon's soft limit on open
                files at 1,024; a fresh authorised client connects during the attack.

Reported per case, with and without ``realtime_priority=40`` (SCHED_FIFO for the control
loop): watchdog holds, the controller's step time (p50, p99, max), the loop's period error,
the daemon's counters, and for ``half_open`` the time a fresh client needs to connect and
be welcomed, the daemon's memory before, during and after, and its log lines.

    python benchmarks/bench_edge_hostile.py            # every case, both priorities (~6 min)
    python benchmarks/bench_edge_hostile.py --cases telemetry --rt 40 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import zmq.auth

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from machine import describe, franky_sim_footer  # noqa: E402

from rlinf_user.edge.client import EdgeClient, EdgeRefused, EdgeTimeout  # noqa: E402
from rlinf_user.edge.security import keygen  # noqa: E402
from rlinf_user.procs import free_ports  # noqa: E402

HZ = 20.0

def free_port_pair() -> int:
    return free_ports(3)


def make_keys(d: Path) -> Path:
    keygen(d)
    pub, _ = zmq.auth.create_certificates(str(d), "attacker")  # a second authorised client
    shutil.copy(pub, d / "authorized" / "attacker.key")
    return d


class Daemon:
    def __init__(self, keys: Path | None, rt: int, log: Path, nofile: int | None = None):
        self.port = free_port_pair()
        args = ["--robot", "franka", "franky_sim=true", "robot.ip=127.0.0.44", f"control_hz={HZ}",
                f"port={self.port}", f"realtime_priority={rt}", "peer_timeout_s=2"]  # fmt: skip
        if keys is not None:
            args += [f"secret_key={keys}/edge.key_secret", f"authorized_keys={keys}/authorized"]
        self.log_path = log
        self.log = open(log, "w")

        def limit():  # the usual service default: 1,024 open files (soft), the hard limit kept
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), COLUMNS="200")
        self.proc = subprocess.Popen([sys.executable, "-m", "rlinf_user.cli.main", "edge", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, preexec_fn=limit)  # fmt: skip
        deadline = time.monotonic() + 120
        while "edge daemon serving" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log.read_text()[-3000:])
            time.sleep(0.1)
        self.ps = psutil.Process(self.proc.pid)

    def rss_mb(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def log_lines(self) -> int:
        self.log.flush()
        return len(self.log_path.read_text().splitlines())

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def client(port: int, keys: Path | None, timeout_s: float = 3.0) -> EdgeClient:
    if keys is None:
        return EdgeClient("127.0.0.1", port, timeout_s=timeout_s)
    return EdgeClient("127.0.0.1", port, server_public_key=str(keys / "edge.key"),
                      client_secret_key=str(keys / "client.key_secret"), timeout_s=timeout_s)  # fmt: skip


def attack(mode: str, port: int, seconds: float, keys: Path | None, meanwhile=None) -> subprocess.Popen:
    """An attacker of :mod:`rlinf_user.edge.hostile` in its own process, under way on return;
    ``meanwhile()`` is called while it starts (the controller keeps stepping)."""
    args = ["half_open", str(port), "1500", str(seconds)] if mode == "half_open" else \
        ["flood", str(port), str(seconds), str(keys or "-"), mode]  # fmt: skip
    p = subprocess.Popen([sys.executable, "-m", "rlinf_user.edge.hostile", *args], stdout=subprocess.PIPE, text=True)
    while meanwhile is not None and not select.select([p.stdout], [], [], 0)[0]:
        meanwhile()
    line = p.stdout.readline().strip()
    if line not in ("opened", "flooding"):
        raise RuntimeError(f"the {mode} attacker did not start: {line!r}")
    return p


def probe(port: int, keys: Path | None, seconds: float, out: list) -> None:
    """Four fresh clients during the attack: seconds each took to be answered (None: not in 5 s)."""
    time.sleep(0.5)
    for _ in range(4):
        c = client(port, keys, timeout_s=5.0)
        t0 = time.monotonic()
        try:
            c.request("ping", timeout_s=5.0)
            out.append(round(time.monotonic() - t0, 4))
        except EdgeTimeout:
            out.append(None)
        c.close(say_bye=False)
        time.sleep(max(0.0, seconds / 5 - (time.monotonic() - t0)))


def pct(v, q) -> float | None:
    return round(float(np.percentile(v, q)) * 1e3, 1) if len(v) else None


def run_case(mode: str, rt: int, seconds: float, keys: Path | None, tmp: Path, attackers: int = 3) -> dict:
    auth = "curve" if keys else "none"
    daemon = Daemon(keys, rt, tmp / f"{mode}_{rt}_{auth}.log", nofile=1024 if mode == "half_open" else None)
    row: dict = {"case": mode, "realtime_priority": rt, "auth": auth}
    try:
        rss0 = daemon.rss_mb()
        c = client(daemon.port, keys)
        c.hello()
        c.reset(seed=0)
        for _ in range(int(HZ)):
            c.act(np.zeros(7, np.float32))
        lines0 = daemon.log_lines()
        steps, lost, connects, rss_peak = [], 0, [], rss0
        if mode == "act_flood":  # the runaway controller takes over; we only watch
            c.close()
            t0 = client(daemon.port, keys).telemetry()
            atk = attack(mode, daemon.port, seconds, keys)
            atk.wait()
            atks = [atk]
            watcher = client(daemon.port, keys)
            t1 = watcher.telemetry()
            watcher.close(say_bye=False)
        else:
            # the attacker starts while the controller steps (a pause would be a hold of its own)
            n = attackers if mode in ("telemetry", "mixed") else 1
            atks = [attack(mode, daemon.port, seconds, keys, meanwhile=lambda: c.act(np.zeros(7, np.float32)))
                    for _ in range(n)]  # fmt: skip
            atk = atks[0]
            t0 = c.telemetry()
            end = time.monotonic() + seconds
            prober = None
            if mode == "half_open":  # fresh clients mid-attack, beside the controller (never blocking it)
                prober = threading.Thread(target=probe, args=(daemon.port, keys, seconds, connects), daemon=True)
                prober.start()
            # the controller steps until the attack and the fresh clients are done
            while (all(a.poll() is None for a in atks) or (prober is not None and prober.is_alive())) \
                    and time.monotonic() < end + 15:  # fmt: skip
                s = time.monotonic()
                try:
                    c.act(np.zeros(7, np.float32), timeout_s=1.0)
                    steps.append(time.monotonic() - s)
                except (EdgeTimeout, EdgeRefused):
                    lost += 1
                if mode == "half_open":
                    rss_peak = max(rss_peak, daemon.rss_mb())
            if prober is not None:
                prober.join(10)
            t1 = c.telemetry()
            c.close()
        sent = [a.stdout.read().split() for a in atks]
        row["attacker_sent"] = sum(int(x[-1]) for x in sent if x and x[-1].isdigit())
        row["attackers"] = len(sent)
        if mode == "half_open":
            time.sleep(2.0)
            row.update(fresh_client_connect_s=connects,
                       rss_mb={"before": round(rss0, 1), "peak": round(rss_peak, 1), "after": round(daemon.rss_mb(), 1)},
                       log_lines_during=daemon.log_lines() - lines0)  # fmt: skip
        row.update(
            watchdog_holds=t1["watchdog_holds"] - t0["watchdog_holds"],
            controller_steps=len(steps), controller_lost=lost,
            step_ms={"p50": pct(steps, 50), "p99": pct(steps, 99), "max": pct(steps, 100)},
            period_error_ms={"p99": t1.get("period_error_ms_p99"), "max": t1.get("period_error_ms_max")},
            daemon={k: (t1.get("daemon") or {}).get(k) for k in ("rate_limited", "rejected", "busy", "refused_peers",
                                                                  "shed", "public_read", "controller_throttled",
                                                                  "overloaded")},
            ingress=t1.get("ingress"),
        )  # fmt: skip
        if row["step_ms"]["p99"] is not None:
            row["step_p99_periods"] = round(row["step_ms"]["p99"] / (1e3 / HZ), 2)
    finally:
        daemon.close()
    return row


def write_markdown(result: dict, path: Path) -> None:
    lines = ["# The edge daemon under hostile peers (franky-sim, 20 Hz, CURVE)", "",
             "Generated by `python benchmarks/bench_edge_hostile.py`. Attackers run as separate processes on the "
             f"same cores, {result['seconds']:g} s per case. Step: the controller's `act` to the next tick's "
             "observation (one period is 50 ms; the aim is p99 <= 1.5 periods and no watchdog hold).", "",
             "| case | keys | RT priority | watchdog holds | controller steps (lost) | step p50 / p99 / max ms "
             "| p99 in periods | loop period error p99 / max ms | attacker messages (processes) | read by the daemon |",
             "|---|---|---|---:|---:|---|---:|---|---:|---:|"]  # fmt: skip
    for label, rows in result["runs"].items():
        for r in rows:
            s, pe, d = r["step_ms"], r["period_error_ms"], r["daemon"]
            steps = f"{r['controller_steps']} ({r['controller_lost']})" if r["case"] != "act_flood" else "(runaway)"
            read = d.get("public_read")
            pe = {k: None if v is None else round(v, 2) for k, v in pe.items()}
            lines.append(f"| {r['case']} ({label}) | {r.get('auth', 'curve')} | {r['realtime_priority'] or 'off'} | "
                         f"{r['watchdog_holds']} | {steps} | {s['p50']} / {s['p99']} / {s['max']} | "
                         f"{r.get('step_p99_periods', '')} | {pe['p99']} / {pe['max']} | "
                         f"{r.get('attacker_sent')} ({r.get('attackers', 1)}) | {'all' if read is None else read} |")  # fmt: skip
    half = [(label, r) for label, rows in result["runs"].items() for r in rows if r["case"] == "half_open"]
    if half:
        lines += ["", "Half-open connections (up to 1,500, the daemon's soft limit on open files at 1,024):", "",
                  "| run | keys | RT | fresh client connect s (None: no answer in 5 s) | daemon RSS MB before / peak / 2 s after "
                  "| log lines during |", "|---|---|---|---|---|---:|"]  # fmt: skip
        for label, r in half:
            m = r["rss_mb"]
            lines.append(f"| {label} | {r.get('auth', 'curve')} | {r['realtime_priority'] or 'off'} | {r['fresh_client_connect_s']} | "
                         f"{m['before']} / {m['peak']} / {m['after']} | {r['log_lines_during']} |")  # fmt: skip
    lines += ["", franky_sim_footer(result["machine"]), ""]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="telemetry,mixed,act_flood,half_open")
    ap.add_argument("--rt", default="40,0", help="realtime priorities to run (0: off)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--attackers", type=int, default=3, help="flooding processes at once (each its own connection)")
    ap.add_argument("--auth", default="none,curve", help="daemon without keys (loopback) and/or with CURVE keys")
    ap.add_argument("--label", default="this commit")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    keys = make_keys(tmp / "keys")
    out = Path(args.out)
    path = out / "edge_hostile.json"
    result = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    result.update(benchmark="edge daemon under hostile peers", machine=describe(), seconds=args.seconds)
    rows = []
    for auth in args.auth.split(","):
        for rt in map(int, args.rt.split(",")):
            for mode in args.cases.split(","):
                print(f"[hostile] {mode} rt={rt} auth={auth}", flush=True)
                rows.append(run_case(mode, rt, args.seconds, keys if auth == "curve" else None, tmp, args.attackers))
                print("   ", json.dumps(rows[-1]), flush=True)
    key = lambda r: (r["case"], r["realtime_priority"], r.get("auth"))  # noqa: E731 - a rerun replaces its rows
    kept = [r for r in result["runs"].get(args.label, []) if key(r) not in {key(x) for x in rows}]
    result["runs"][args.label] = kept + rows
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    write_markdown(result, out / "EDGE_HOSTILE.md")
    print(f"wrote {path} and EDGE_HOSTILE.md")


if __name__ == "__main__":
    main()
