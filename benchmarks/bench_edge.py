"""Edge daemon benchmarks: control-loop timing, command round trip, camera frame latency.

Four sub-benchmarks (all by default, or pick with ``--loop``, ``--rtt``, ``--frames``, ``--flood``):

``--loop``    Control-loop period error at 10/20/50 Hz: idle; loaded (2 busy-loop processes
              plus a 640x480 @ 15 fps synthetic camera resized to 128x128 and JPEG-encoded
              in the daemon, decoded by the client); loaded with ``realtime_priority=40``
              (SCHED_FIFO). A served gym_hil simulator, and optionally the Franka path on
              franky-sim. -> ``results/edge_control_loop.json``
``--rtt``     Command round trip on loopback: ``ping`` through ``EdgeClient.request`` (answered
              by the daemon's network process), a raw DEALER ``ping`` carrying an act-sized
              array, ``telemetry`` (answered by the daemon from the loop's latest snapshot), a bare ZMQ
              ROUTER echo as the floor; without and with CURVE. -> ``results/edge_round_trip.json``
``--frames``  Capture-to-learner frame latency: from ``Frame.stamp`` (capture, monotonic) to
              the moment ``RemoteRobotEnv.step`` returns the decoded image, for raw 640x480,
              raw 128x128 and JPEG 128x128 (and JPEG 640x480). -> ``results/edge_frames.json``
``--flood``   The control loop at 10/20 Hz (normal and SCHED_FIFO) while a hostile client floods
              the daemon with requests, beside an idle 20 Hz case; then the watchdog's hold
              time under the flood. -> ``results/edge_flood.json``

Every run writes ``results/EDGE.md`` (tables built from whichever JSON files exist;
``--summary`` only rebuilds it). Numbers are medians and p99 per repetition and pooled over
the repetitions. The daemon runs in its own process tree as on a robot PC: ``--rtt`` starts
``rlinf-user edge --sim gym_hil`` itself; ``--loop`` and ``--frames`` start this script in
``--_serve`` mode, which composes the same edge config and builds the same daemon as the CLI
(``compose_edge_config`` + ``build_daemon``, cameras from ``cameras=[...]``) and adds
recorders: in the control-loop process the wake-up error of every tick (the values its
telemetry summarises; ``TimingStats.add`` is wrapped) and the interval of every action
applied to the backend; in the daemon, per camera, when which frame was attached to an
observation.

    python benchmarks/bench_edge.py                 # everything, about 8 minutes on 2 cores
    python benchmarks/bench_edge.py --loop --franka # control loop incl. the franky-sim case
    python benchmarks/bench_edge.py --rtt --quick   # a quick smoke run (short repetitions)
"""


from __future__ import annotations

import argparse
import atexit
import json
import signal
import tempfile
import time
from pathlib import Path

from edge_common import RESULTS, _cleanup, _on_signal, machine  # noqa: E402
from edge_loop import run_flood, run_loop  # noqa: E402
from edge_rtt import FRAME_CASES, run_frames, run_rtt  # noqa: E402
from edge_serve import serve  # noqa: E402
from edge_summary import write_summary  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loop", action="store_true", help="control-loop period error")
    ap.add_argument("--rtt", action="store_true", help="command round trip")
    ap.add_argument("--frames", action="store_true", help="capture-to-learner frame latency")
    ap.add_argument("--flood", action="store_true", help="control loop while a hostile client floods the daemon")
    ap.add_argument("--franka", action="store_true", help="add the Franka (franky-sim) 10 Hz case to --loop")
    ap.add_argument("--franka-conditions", default="idle", help="comma list of idle,loaded,loaded_rt")
    ap.add_argument("--no-franka", action="store_true", help="skip the Franka case when running everything")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply repetition lengths/sample counts")
    ap.add_argument("--quick", action="store_true", help="same as --scale 0.2")
    ap.add_argument("--rates", default="10,20,50")
    ap.add_argument("--rtt-samples", type=int, default=5000)
    ap.add_argument("--frames-hz", type=float, default=20.0)
    ap.add_argument("--frame-cases", default="", help="comma list of " + ",".join(FRAME_CASES))
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="before each case wait up to this many s for other processes to quiet down")
    ap.add_argument("--quiet-pct", type=float, default=10.0, help="CPU busy %% that counts as quiet")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--summary", action="store_true", help="only rebuild EDGE.md from the JSON files")
    ap.add_argument("--keep-logs", action="store_true", help="keep the daemons' logs (printed path)")
    ap.add_argument("--_serve", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._serve:
        serve(args._serve)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.summary:
        print(write_summary(out))
        return
    if args.quick:
        args.scale = 0.2
    everything = not (args.loop or args.rtt or args.frames or args.flood)
    if everything and not args.no_franka:
        args.franka = True
    signal.signal(signal.SIGTERM, _on_signal)
    atexit.register(_cleanup)
    args.machine = machine()
    print(json.dumps(args.machine), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-edge-"))
    t0 = time.monotonic()
    try:
        for flag, fn, name in ((args.loop, run_loop, "edge_control_loop.json"),
                               (args.rtt, run_rtt, "edge_round_trip.json"),
                               (args.frames, run_frames, "edge_frames.json"),
                               (args.flood, run_flood, "edge_flood.json")):  # fmt: skip
            if everything or flag:
                t = time.monotonic()
                result = fn(args, tmp)
                result["settings"] = {"reps": args.reps, "scale": args.scale,
                                      "wall_s": round(time.monotonic() - t, 1)}  # fmt: skip
                (out / name).write_text(json.dumps(result, indent=2))
                print(f"wrote {out / name} ({time.monotonic() - t:.0f} s)", flush=True)
    finally:
        _cleanup()
        if args.keep_logs:
            print(f"logs kept in {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    print(write_summary(out), f"({time.monotonic() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
