"""Control-loop period error (``--loop``) and the loop under a flood (``--flood``)."""


from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from edge_common import CAMERA_640, Flood, Load, background, busy_pct, cpu_times, free_port_pair, serve_child, summarise  # noqa: E402
from edge_serve import remote_env, step_for  # noqa: E402

# ----------------------------------------------------------------------------------------
# 1. control loop


@dataclasses.dataclass
class LoopCase:
    hz: float
    condition: str  # idle | loaded | loaded_rt
    backend: str = "gym_hil"  # gym_hil | franka

    @property
    def loaded(self) -> bool:
        return self.condition.startswith("loaded")

    @property
    def flood(self) -> bool:
        return self.condition.startswith("flood")

    @property
    def rt(self) -> int:
        return 40 if self.condition.endswith("_rt") else 0


def loop_case(case: LoopCase, reps: int, rep_s: float, tmp: Path, bg: float | None) -> dict[str, Any]:
    port = free_port_pair()
    name = f"loop_{case.backend}_{case.hz:g}_{case.condition}"
    ticks_path = str(tmp / name)
    overrides = [f"port={port}", f"control_hz={case.hz}", f"realtime_priority={case.rt}"]
    cameras: list[str] = []
    if case.loaded:
        cam = {**CAMERA_640, "resize": [128, 128], "jpeg_quality": 90}
        overrides.append("cameras=[{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in cam.items()) + "}]")
        cameras = ["wrist"]
    spec: dict[str, Any] = {"overrides": overrides, "ticks_path": ticks_path}
    if case.backend == "franka":
        spec.update(robot="franka")
        overrides += ["franky_sim=true", "robot.ip=127.0.0.9"]
    else:
        spec.update(sim="gym_hil")
    t_start = time.monotonic()
    daemon = serve_child(spec, tmp, name)
    load = Load(2) if case.loaded else None
    env = flood = None
    try:
        env = remote_env(port, cameras, task="reach" if case.backend == "franka" else "edge")
        step_for(env, 1.0)  # warm-up, not counted
        flood = Flood(port) if case.flood else None
        windows, steps, busy = [], [], []
        for _ in range(reps):
            c0 = cpu_times()
            t0, t1, durations = step_for(env, rep_s)
            busy.append(busy_pct(c0, cpu_times()))
            windows.append((t0, t1))
            steps.append(durations)
        watchdog = watchdog_check(env, case.hz) if case.flood else None
        t_tel = time.monotonic()
        telemetry = env.telemetry()
    finally:
        if flood is not None:
            flood.close()
        if env is not None:
            env.close()
        if load is not None:
            load.close()
        daemon.close()
    records = np.load(ticks_path + ".npy")
    meta = json.loads(Path(ticks_path + ".meta.json").read_text())
    t, err_ms = records[:, 0], np.abs(records[:, 1]) * 1e3
    applies = np.load(ticks_path + ".apply.npy")

    def late(sel: np.ndarray) -> dict[str, int]:
        """Ticks later than 2 ms, split by cause: an action being applied (a simulator step,
        a driver call) in the loop thread across the tick's due time, or anything else
        (the process was not scheduled in time)."""
        idx = np.where(sel & (err_ms > 2.0))[0]
        by_apply = 0
        for i in idx:
            wake, due = t[i], t[i] - records[i, 1]
            if np.any((applies[:, 0] < wake) & (applies[:, 1] > due)):
                by_apply += 1
        return {"ticks_over_2ms": int(idx.size), "of_which_during_act_apply": by_apply}

    per_rep = []
    for (t0, t1), durations, b in zip(windows, steps, busy):
        mask = (t >= t0) & (t <= t1)
        sel = err_ms[mask]
        per_rep.append({**summarise(sel), **late(mask),
                        "client_steps": len(durations), "cpu_busy_pct": b,
                        "client_step_ms_p50": round(float(np.median(durations)) * 1e3, 3),
                        "client_step_ms_p99": round(float(np.percentile(durations, 99)) * 1e3, 3)})  # fmt: skip
    pooled_mask = np.zeros(len(t), dtype=bool)
    for a, b in windows:
        pooled_mask |= (t >= a) & (t <= b)
    pooled_sel = err_ms[pooled_mask]
    in_reps = (applies[:, 0] >= windows[0][0]) & (applies[:, 1] <= windows[-1][1])
    apply_ms = (applies[in_reps, 1] - applies[in_reps, 0]) * 1e3
    # the loop's telemetry summarises its last 2000 ticks up to the request: check the
    # recorded errors are the same values
    window = err_ms[t <= t_tel][-2000:]
    matches = (
        "period_error_ms_p99" in telemetry
        and abs(float(np.percentile(window, 99)) - telemetry["period_error_ms_p99"]) < 1e-6
        or abs(float(np.percentile(err_ms[-2000:], 99)) - telemetry.get("period_error_ms_p99", -1)) < 1e-6
    )
    keep = ("ticks", "overruns", "period_error_ms_p50", "period_error_ms_p99", "period_error_ms_max",
            "applied", "deferred", "duty_cycle", "watchdog_holds")  # fmt: skip
    tel = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in telemetry.items() if k in keep}
    cams = telemetry.get("cameras") or {}
    row = {
        "backend": case.backend,
        "hz": case.hz,
        "condition": case.condition,
        "load": "2 busy-loop processes + synthetic camera 640x480@15fps -> 128x128 JPEG q90"
        if case.loaded else "none",  # fmt: skip
        "realtime_priority": case.rt,
        "loop_sched": f"{meta['policy']}:{meta['priority']}",
        "background_cpu_busy_pct": bg,
        "reps": reps,
        "rep_s": rep_s,
        "pooled": {**summarise(pooled_sel), **late(pooled_mask)},
        "act_apply_ms": summarise(apply_ms),
        "per_rep": per_rep,
        "telemetry": tel,
        "telemetry_matches_recorded": bool(matches),
        "camera": {k: {f: round(v[f], 3) for f in ("fps", "frames", "drops", "process_ms", "encode_ms")}
                   for k, v in cams.items()},  # fmt: skip
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    if case.hz <= 20 and case.loaded:
        row["target"] = "p99 <= 2 ms under load at 10-20 Hz"
        row["target_met"] = row["pooled"]["p99_ms"] <= 2.0
    if case.flood:
        row["load"] = "a hostile client flooding telemetry requests (raw DEALER, no hello)"
        row["watchdog"] = watchdog
        row["flood"] = {k: (telemetry.get("daemon") or {}).get(k) for k in ("rate_limited", "rejected", "overloaded")}
        if case.hz == 20 and case.rt:
            row["target"] = "p99 <= 2 ms during the flood at 20 Hz (SCHED_FIFO), no missed watchdog"
            row["target_met"] = row["pooled"]["p99_ms"] <= 2.0 and watchdog["held_on_time"]
    return row


def watchdog_check(env, hz: float) -> dict[str, Any]:
    """During the flood the controller goes quiet after one action: the hold must come two
    periods later, as without a flood."""
    before = env.telemetry()["watchdog_holds"]
    env.step(np.zeros(7, np.float32))
    time.sleep(6 / hz)
    t = env.telemetry()
    hold = t.get("last_hold") or {}
    after = hold.get("after_s")
    on_time = t["watchdog_holds"] == before + 1 and hold.get("idle_periods") == 2 and after is not None \
        and after <= 2 / hz + 0.005  # fmt: skip
    return {"holds": t["watchdog_holds"] - before, "idle_periods": hold.get("idle_periods"),
            "after_s": after, "held_on_time": bool(on_time)}  # fmt: skip


def run_flood(args, tmp: Path) -> dict[str, Any]:
    """The control loop while a hostile client floods the daemon, beside the idle case."""
    cases = [LoopCase(20.0, "idle")] + [LoopCase(hz, c) for c in ("flood", "flood_rt") for hz in (10.0, 20.0)]
    rows = []
    for case in cases:
        seconds = {10.0: 12.0, 20.0: 8.0}[case.hz] * args.scale
        print(f"[flood] {case.hz:g} Hz {case.condition}: {args.reps} x {seconds:g} s", flush=True)
        row = loop_case(case, args.reps, seconds, tmp, background(args, "flood"))
        print("   ", json.dumps({k: row.get(k) for k in ("pooled", "watchdog", "flood", "loop_sched")}), flush=True)
        rows.append(row)
    return {"benchmark": "edge control loop under a hostile flood", "machine": args.machine,
            "unit": "ms (absolute wake-up error of each tick against its due time)", "cases": rows}  # fmt: skip


def run_loop(args, tmp: Path) -> dict[str, Any]:
    rates = [float(r) for r in args.rates.split(",")]
    rep_s = {10.0: 12.0, 20.0: 8.0, 50.0: 5.0}
    cases = [LoopCase(hz, cond) for cond in ("idle", "loaded", "loaded_rt") for hz in rates]
    if args.franka:
        cases += [LoopCase(10.0, cond, "franka") for cond in args.franka_conditions.split(",")]
    rows = []
    for case in cases:
        seconds = rep_s.get(case.hz, 6.0) * args.scale
        print(f"[loop] {case.backend} {case.hz:g} Hz {case.condition}: {args.reps} x {seconds:g} s", flush=True)
        try:
            row = loop_case(case, args.reps, seconds, tmp, background(args, "loop"))
        except Exception as err:  # noqa: BLE001 - report the case, go on with the rest
            row = {"backend": case.backend, "hz": case.hz, "condition": case.condition,
                   "error": f"{type(err).__name__}: {str(err)[-1500:]}"}  # fmt: skip
        print("   ", json.dumps({k: row.get(k) for k in ("pooled", "telemetry", "loop_sched", "error")}), flush=True)
        rows.append(row)
    return {"benchmark": "edge control-loop period error", "machine": args.machine,
            "unit": "ms (absolute wake-up error of each tick against its due time)",
            "cases": rows}  # fmt: skip


# ----------------------------------------------------------------------------------------
# 2. round trip
