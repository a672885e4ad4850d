"""Command round trip (``--rtt``) and capture-to-learner frame latency (``--frames``)."""


from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from edge_common import CAMERA_640, Child, Load, background, cli_child, free_port_pair, serve_child, summarise  # noqa: E402
from edge_serve import remote_env, step_for  # noqa: E402

ECHO = """
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); s.linger = 0
s.bind("tcp://127.0.0.1:" + sys.argv[1]); print("echo ready", flush=True)
while True:
    s.send_multipart(s.recv_multipart(copy=False), copy=False)
"""


def time_calls(fn, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.float64)
    clock = time.perf_counter_ns
    for i in range(n):
        t = clock()
        fn()
        out[i] = clock() - t
    return out / 1e6  # ms


def raw_pinger(port: int, keys: dict | None):
    """A bare DEALER sending a pre-encoded ``ping`` with an act-sized (7 float32) array."""
    import zmq

    from rlinf_user.edge.protocol import Message, encode
    from rlinf_user.edge.security import client_options

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    opts = client_options(keys.get("edge_public"), keys.get("client_secret")) if keys else {}
    for opt, value in opts.items():
        sock.setsockopt(opt, value)
    sock.connect(f"tcp://127.0.0.1:{port}")
    frames = [bytes(f) for f in encode(Message("ping", 1, {}, {"action": np.zeros(7, np.float32)}))]

    def call():
        sock.send_multipart(frames)
        sock.recv_multipart()

    def close():
        sock.close(0)
        ctx.term()

    return call, close


def run_rtt(args, tmp: Path) -> dict[str, Any]:
    from rlinf_user.edge.client import EdgeClient
    from rlinf_user.edge.security import keygen

    keys = {k: str(v) for k, v in keygen(tmp / "keys").items()}
    ports = {"none": free_port_pair(), "curve": free_port_pair(), "echo": free_port_pair()}
    n = max(100, int(args.rtt_samples * args.scale))
    # the round trip, not the rate limit a peer that is not the controller meets (50 requests/s)
    unlimited = ["peer_rate_hz=1000000", "total_rate_hz=1000000"]
    daemons = {
        "none": cli_child(["--sim", "gym_hil", f"port={ports['none']}", *unlimited], tmp, "rtt_none"),
        "curve": cli_child(["--sim", "gym_hil", f"port={ports['curve']}", f"secret_key={keys['edge_secret']}",
                            f"authorized_keys={keys['authorized']}", *unlimited], tmp, "rtt_curve"),  # fmt: skip
    }
    echo = Child([sys.executable, "-c", ECHO, str(ports["echo"])], tmp / "echo.log", ready="echo ready")
    closers, calls = [], {}
    try:
        for auth in ("none", "curve"):
            k = keys if auth == "curve" else None
            client = EdgeClient("127.0.0.1", ports[auth], server_public_key=k and k["edge_public"],
                                client_secret_key=k and k["client_secret"], timeout_s=10.0)  # fmt: skip
            closers.append(functools.partial(client.close, True))
            calls[("ping", auth)] = functools.partial(client.request, "ping")
            calls[("telemetry", auth)] = client.telemetry
            raw, close = raw_pinger(ports[auth], k)
            closers.append(close)
            calls[("raw_ping_act_sized", auth)] = raw
        raw, close = raw_pinger(ports["echo"], None)
        closers.append(close)
        calls[("zmq_echo_floor", "none")] = raw
        for call in calls.values():  # connect, handshake, warm up
            time_calls(call, 300)
        samples: dict[tuple[str, str, str], list[np.ndarray]] = {}
        bg = []
        for rep in range(args.reps):
            bg.append(background(args, "rtt"))
            for (kind, auth), call in calls.items():
                samples.setdefault((kind, auth, "idle"), []).append(time_calls(call, n))
            load = Load(2)
            try:
                for auth in ("none", "curve"):
                    samples.setdefault(("ping", auth, "loaded"), []).append(time_calls(calls[("ping", auth)], n))
            finally:
                load.close()
            print(f"[rtt] repetition {rep + 1}/{args.reps} done", flush=True)
    finally:
        for close in closers:
            close()
        echo.close()
        for d in daemons.values():
            d.close()
    what = {
        "ping": "EdgeClient.request('ping'): encode, DEALER->ROUTER, daemon network process "
                "decodes and answers pong, client decodes",
        "raw_ping_act_sized": "bare DEALER, pre-encoded ping carrying a 7 x float32 array; "
                              "answered by the daemon network process",
        "telemetry": "EdgeClient.telemetry(): answered by the daemon from the control loop's "
                     "latest snapshot (no round trip through the loop)",
        "zmq_echo_floor": "bare DEALER to a bare ROUTER echo process (no protocol, no daemon)",
    }  # fmt: skip
    rows = []
    for (kind, auth, cond), reps in samples.items():
        pooled = summarise(np.concatenate(reps), "us")
        row = {"kind": kind, "auth": auth, "condition": cond, "what": what[kind],
               "samples_per_rep": n, "per_rep": [summarise(r, "us") for r in reps], "pooled": pooled}  # fmt: skip
        if kind in ("ping", "raw_ping_act_sized") and cond == "idle":
            row["target"] = "p50 <= 150 us, p99 <= 500 us"
            row["target_met"] = pooled["p50_us"] <= 150 and pooled["p99_us"] <= 500
        rows.append(row)
    return {"benchmark": "edge command round trip on loopback", "machine": args.machine,
            "unit": "us", "daemon": "rlinf-user edge --sim gym_hil (10 Hz), one client at a time",
            "background_cpu_busy_pct": bg,
            "conditions": {"idle": "nothing else running",
                           "loaded": "2 busy-loop processes (nice 0) on the 2 cores"},
            "cases": rows}  # fmt: skip


# ----------------------------------------------------------------------------------------
# 3. frames


FRAME_CASES = {
    "raw_640x480": {},
    "raw_128x128": {"resize": [128, 128]},
    "jpeg_128x128": {"resize": [128, 128], "jpeg_quality": 90},
    "jpeg_640x480": {"jpeg_quality": 90},
}


def frame_case(name: str, extra: dict, hz: float, reps: int, rep_s: float, tmp: Path,
               bg: float | None) -> dict[str, Any]:
    port = free_port_pair()
    cam = {**CAMERA_640, **extra}
    attach_path = tmp / f"frames_{name}_attach.json"
    overrides = [f"port={port}", f"control_hz={hz}",
                 "cameras=[{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in cam.items()) + "}]"]  # fmt: skip
    daemon = serve_child({"overrides": overrides, "sim": "gym_hil", "attach_path": str(attach_path)},
                         tmp, f"frames_{name}")  # fmt: skip
    env = None
    reps_samples: list[list[tuple[float, float]]] = []
    shape = None
    try:
        env = remote_env(port, ["wrist"])
        step_for(env, 1.0)
        for _ in range(reps):
            got: list[tuple[float, float]] = []

            def on_step(obs, now, got=got):
                got.append((float(obs["timestamps"]["wrist"]), now))

            step_for(env, rep_s, on_step)
            reps_samples.append(got)
        obs, *_ = env.step(np.zeros(7, np.float32))
        shape = list(obs["images"]["wrist"].shape)
        telemetry = env.telemetry()
    finally:
        if env is not None:
            env.close()
        daemon.close()
    attach: dict[float, list[float]] = {}
    reads = json.loads(attach_path.read_text()).get("wrist", [])
    if any(r[2] == "_attach_frames" for r in reads):  # other readers (a frame stream) aside
        reads = [r for r in reads if r[2] == "_attach_frames"]
    for stamp, when, _ in reads:
        attach.setdefault(stamp, []).append(when)

    def split(samples):
        total, age, transport = [], [], []
        for stamp, recv in samples:
            total.append(recv - stamp)
            sent = [a for a in attach.get(stamp, []) if a <= recv]
            if sent:
                age.append(max(sent) - stamp)
                transport.append(recv - max(sent))
        return np.array(total) * 1e3, np.array(age) * 1e3, np.array(transport) * 1e3

    per_rep = []
    for s in reps_samples:
        t, a, tr = split(s)
        per_rep.append({"capture_to_learner": summarise(t), "capture_to_attach": summarise(a),
                        "attach_to_learner": summarise(tr)})  # fmt: skip
    t, a, tr = split([x for s in reps_samples for x in s])
    cam_stats = (telemetry.get("cameras") or {}).get("wrist", {})
    nbytes = None
    if shape is not None:
        nbytes = int(np.prod(shape)) if "jpeg_quality" not in extra else None
    return {
        "case": name,
        "camera": cam,
        "served_shape": shape,
        "raw_bytes": nbytes,
        "control_hz": hz,
        "background_cpu_busy_pct": bg,
        "reps": reps,
        "rep_s": rep_s,
        "pooled": {"capture_to_learner": summarise(t), "capture_to_attach": summarise(a),
                   "attach_to_learner": summarise(tr)},  # fmt: skip
        "per_rep": per_rep,
        "camera_stats": {f: round(cam_stats[f], 3) for f in ("fps", "frames", "drops", "process_ms", "encode_ms")
                         if f in cam_stats},  # fmt: skip
    }


def run_frames(args, tmp: Path) -> dict[str, Any]:
    rows = []
    for name, extra in FRAME_CASES.items():
        if args.frame_cases and name not in args.frame_cases.split(","):
            continue
        print(f"[frames] {name}", flush=True)
        try:
            row = frame_case(name, extra, args.frames_hz, args.reps, 6.0 * args.scale, tmp,
                             background(args, "frames"))
        except Exception as err:  # noqa: BLE001
            row = {"case": name, "error": f"{type(err).__name__}: {str(err)[-1500:]}"}
        print("   ", json.dumps(row.get("pooled") or row.get("error")), flush=True)
        rows.append(row)
    return {
        "benchmark": "edge capture-to-learner frame latency (loopback)",
        "machine": args.machine,
        "unit": "ms",
        "definition": {
            "capture_to_learner": "time RemoteRobotEnv.step returned the decoded image minus "
                                  "Frame.stamp (capture, time.monotonic on the same machine)",
            "capture_to_attach": "the daemon attached the camera's newest frame to the "
                                 "observation this long after capture: crop/resize/JPEG plus "
                                 "waiting for the control tick (a 15 fps camera sampled by the loop)",
            "attach_to_learner": "daemon attach -> encode -> ZMQ -> client decode (JPEG via PIL "
                                 "or raw copy) -> step returns",
        },  # fmt: skip
        "daemon": f"served gym_hil at {args.frames_hz:g} Hz, synthetic camera 640x480 @ 15 fps "
                  "through the daemon's camera path (cameras=[...])",  # fmt: skip
        "cases": rows,
    }


# ----------------------------------------------------------------------------------------
# EDGE.md
