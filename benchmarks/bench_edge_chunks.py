"""A slow model, a robot that never pauses: chunked vs per-step execution at the edge.

``rlinf-user edge --robot franka franky_sim=true`` in its own process (franky driving
franky-sim's MuJoCo FR3), the real :class:`EdgeClient` as the policy side. The "model" is a
scripted smooth trajectory (a 6 cm circle in x-y, one lap per 8 s) whose every inference
returns it with its own random offset (std 0.05 per axis, as two samples of a learned
policy differ) after an injected latency L, measured from the observation it used:

* **per step**: observe, think L, send one ``act``; the arm moves only in the periods
  after an action arrives;
* **chunked**: observe (the state stream's tick s), think L, send a ``chunk`` of H = 5 s of
  actions for ticks s+1...; the next inference starts early enough that the schedule never
  runs dry. ``blend=0`` switches chunks at once; ``blend=B`` blends over B ticks.

Per control rate and latency: the robot's **duty cycle** (episode ticks that ended a
period in which an action ran, over all episode ticks, from the daemon's telemetry) and
the **seam jump** (the largest per-axis change between consecutive executed actions where
the chunk, or for per-step the inference, changes; from the daemon's state stream).

    python benchmarks/bench_edge_chunks.py                 # 10 and 20 Hz x 100/200/400 ms (~10 min)
    python benchmarks/bench_edge_chunks.py --quick         # 10 Hz, 200 ms
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_tracking import Edge  # noqa: E402
from machine import describe  # noqa: E402

from rlinf_user.edge.protocol import decode  # noqa: E402

RESULTS = HERE / "results"
BOX = ((0.30, -0.25, 0.15), (0.60, 0.25, 0.55))
LAP_S, RADIUS_ACTION = 8.0, 0.25  # action units: 0.25 x 2 cm per step
CHUNK_S = 2.0  # each chunk covers 2 s of control


class Model:
    def __init__(self, hz: float, latency: float, seed: int):
        self.hz, self.latency = hz, latency
        self.rng = np.random.default_rng(seed)

    def actions(self, first_tick: int, n: int) -> np.ndarray:
        """The trajectory's actions for ticks first_tick.., offset by this inference's noise."""
        time.sleep(self.latency)
        k = np.arange(first_tick, first_tick + n)
        phase = 2 * math.pi * k / (LAP_S * self.hz)
        a = np.zeros((n, 7), np.float32)
        a[:, 0], a[:, 1] = -RADIUS_ACTION * np.sin(phase), RADIUS_ACTION * np.cos(phase)
        a[:, :2] += self.rng.normal(0, 0.05, 2)
        return a


def latest_tick(edge: Edge, store: list | None = None) -> int:
    """The newest tick on the state stream; every message read is kept in ``store``."""
    tick = None
    while tick is None or edge.sub.poll(0):
        if edge.sub.poll(2000):
            body = decode(edge.sub.recv_multipart()).body
            if store is not None:
                store.append(body)
            tick = body.get("tick", tick)  # a reset's reply carries no tick
    return tick


def per_step(edge: Edge, model: Model, seconds: float) -> dict:
    sent: list[np.ndarray] = []
    tick = latest_tick(edge)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = model.actions(tick + 1, 1)[0]
        reply = edge.client.act(a)
        sent.append(a)
        tick = reply.body["tick"]
    jumps = np.abs(np.diff(np.asarray(sent), axis=0)).max(axis=1) if len(sent) > 1 else np.zeros(1)
    return {"inferences": len(sent), "seam_jump_max": float(jumps.max()), "seam_jump_p50": float(np.median(jumps))}


def chunked(edge: Edge, model: Model, seconds: float, hz: float, blend: int) -> dict:
    horizon = int(CHUNK_S * hz)
    d = math.ceil(model.latency * hz)
    states: list[dict] = []
    while edge.sub.poll(0):  # what the stream held from before this case
        edge.sub.recv_multipart()
    inferences, late = 0, 0
    end = time.monotonic() + seconds
    next_at = 0
    while time.monotonic() < end:
        s = latest_tick(edge, states)
        if s < next_at:
            time.sleep(0.5 / hz)
            continue
        ack = edge.client.chunk(model.actions(s + 1, horizon), start_tick=s, blend=blend)
        inferences += 1
        late += ack.body["late"]
        next_at = s + horizon - 2 * d - 3  # start the next inference with margin to spare
    stop = time.monotonic() + 0.3  # the stream never pauses: read what came until now
    while time.monotonic() < stop and edge.sub.poll(50):
        states.append(decode(edge.sub.recv_multipart()).body)
    ran = [(b["tick"], b["plan"]["chunk"], np.asarray(b["plan"]["applied"])) for b in states if "plan" in b]
    jumps = [float(np.abs(a2 - a1).max()) for (t1, c1, a1), (t2, c2, a2) in zip(ran, ran[1:]) if c1 != c2 and t2 == t1 + 1]
    return {"inferences": inferences, "late_actions": late, "seams": len(jumps),
            "seam_jump_max": max(jumps, default=0.0), "seam_jump_p50": float(np.median(jumps)) if jumps else 0.0}


def case(edge: Edge, hz: float, latency: float, mode: str, seconds: float, blend: int = 0) -> dict:
    edge.client.reset(seed=0)
    model = Model(hz, latency, seed=0)
    before = edge.client.telemetry()
    out = per_step(edge, model, seconds) if mode == "per_step" else chunked(edge, model, seconds, hz, blend)
    after = edge.client.telemetry()
    ticks = after["episode_ticks"] - before["episode_ticks"]
    acted = after["acted_ticks"] - before["acted_ticks"]
    edge.client.request("hold")
    row = {"hz": hz, "latency_ms": int(latency * 1e3), "mode": mode, "blend": blend, "seconds": seconds,
           "episode_ticks": ticks, "duty_cycle": round(acted / max(ticks, 1), 4),
           "watchdog_holds": after["watchdog_holds"] - before["watchdog_holds"], **out}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[10.0, 20.0])
    ap.add_argument("--latencies", type=float, nargs="+", default=[0.1, 0.2, 0.4])
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "edge_chunks.json"))
    args = ap.parse_args()
    if args.quick:
        args.rates, args.latencies, args.seconds = [10.0], [0.2], 10.0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hz in args.rates:
            edge = Edge(hz, "commanded", BOX, Path(tmp) / f"edge-{hz}.log", extra=("safety.watchdog_periods=3",))
            try:
                for latency in args.latencies:
                    blend = max(2, math.ceil(latency * hz))
                    rows.append(case(edge, hz, latency, "per_step", args.seconds))
                    rows.append(case(edge, hz, latency, "chunked", args.seconds, blend=0))
                    rows.append(case(edge, hz, latency, "chunked", args.seconds, blend=blend))
            finally:
                edge.close()
    result = {"benchmark": "edge duty cycle and seam jumps, chunked vs per-step, injected inference latency (franky-sim)",
              "machine": describe(), "rows": rows}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
