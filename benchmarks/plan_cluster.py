"""The placement cost model on paper for a cluster this machine is not: 4 robot PCs (one Franka
each, 10 Hz) and one box with 8 H100s.

Nothing here runs a robot or a GPU. The costs are measured ones, put together:

* the robot side (the policy's act on one observation, on a robot PC's CPU; the rows' send)
  from this machine's profiles in ``results/placement_auto.json`` (``bench_placement.py``:
  the pixel pick's, and the state pick's for DSRL's small noise actor and critics), assuming
  a robot PC's core is as fast as one of these;
* the GPU side from the committed H100 figures: an image-SAC update on frame features
  (``results/image_learner_gpu.json``) and pi0's chunk latency by batch
  (``results/vla_pi0_gpu.json``);
* the robots' control rate as a hard constraint: a robot never waits for a learner.
* data-parallel learner replicas on the box's GPUs: each updates on ``B / N``, plus an
  assumed ``DP_OVERHEAD_S`` an update (no GPU all-reduce is measured here). The H100 update
  on frame features took the same time at every precision (bound by launching kernels, not
  by arithmetic), so it is taken as flat in the batch; the fine-tuned EfficientNet's update
  is taken as proportional to the batch, the most that replicas could gain.

Per scenario the model (``rlinf_user/runtime/planning/model.py``) ranks the placements it
would consider, and the top ones are written with what limits them:

    python benchmarks/plan_cluster.py
"""

from __future__ import annotations

import json
from pathlib import Path

from machine import describe

from rlinf_user.runtime.planning.model import Costs, Curve, Pipeline, candidates, rank

RESULTS = Path(__file__).resolve().parent / "results"
ROBOTS, HZ = 4, 10.0
NETWORK_S = 0.001  # a request across the robot PC's link to the GPU box (1 GbE, small payloads)
# what N >= 2 replicas add to an update on one box (assumed, not measured): the shards through
# the object store and an NVLink all-reduce of a few to 50 MB of gradients, about a millisecond each
DP_OVERHEAD_S = 0.002


def cpu_costs(workload: str) -> Costs:
    """This machine's profile of ``workload`` (bench_placement.py)."""
    data = json.loads((RESULTS / "placement_auto.json").read_text())
    for w in data["workloads"]:
        if w["workload"] == workload:
            return Costs.from_dict(w["costs"])
    raise SystemExit(f"results/placement_auto.json has no {workload!r}: run benchmarks/bench_placement.py first")


def gpu_update_s(case: str) -> float:
    rows = json.loads((RESULTS / "image_learner_gpu.json").read_text())["cases"]
    return next(c for c in rows if c["case"] == case)["update_ms_median"] / 1000.0


def pi0_chunk() -> Curve:
    rows = json.loads((RESULTS / "vla_pi0_gpu.json").read_text())["rows"]
    wall = {r["batch"]: r["latency_ms_p50"] / 1000.0 for r in rows
            if r["size"] == "pi0" and r["kv_cache"] and not r["rl_extras"]}  # fmt: skip
    return Curve(wall, {b: 0.0 for b in wall})  # on the GPU: no robot PC's CPU


def robot_costs(cpu: Costs, gpus: int = 8, cores: int = 64) -> Costs:
    """A robot PC's act from this machine's profile; the box's cores and GPUs."""
    c = Costs(cores=cores, gpus=gpus, robot_hz=HZ)
    c.act = {"cpu": cpu.act["cpu"]}
    c.row, c.store, c.call_s = cpu.row, cpu.store, cpu.call_s + NETWORK_S
    c.publish_s, c.apply_s = cpu.publish_s, cpu.apply_s
    return c


def scenario(name: str, costs: Costs, pipe: Pipeline, why: str, top: int = 4, served_only: bool = False) -> dict:
    """``served_only``: the policy runs on the box's GPU (a robot PC has none)."""
    cands = [c for c in candidates(costs, pipe) if c.rollout or not served_only]
    preds = rank(costs, pipe, cands)
    rows = [{**p.row(), "holds_robot": p.holds_robot} for p in preds[:top]]
    print(f"{name}: {rows[0]['placement']}: {rows[0]['env_steps_per_s']} env steps/s, "
          f"{rows[0]['updates_per_s']} updates/s, limited by {rows[0]['bottleneck']}")  # fmt: skip
    return {"scenario": name, "pipeline": pipe.__dict__, "why": why, "top": rows}


def main() -> None:
    out = []
    pixels = cpu_costs("pick_pixels_rlpd")
    upd = gpu_update_s("efficientnet_frame_features")
    for utd in (1.0, 2.0, 4.0):
        c = robot_costs(pixels)
        c.update = {"cuda": Curve({256: upd}, {256: upd * 0.1}), "cpu": pixels.update["cpu"]}
        for paced in (False, True):
            out.append(scenario(
                f"pixel RLPD, frame features, UTD {utd:g}, {'paced' if paced else 'free-running'}", c,
                Pipeline(on_policy=False, batch_size=256, utd_ratio=utd, paced=paced, robots=ROBOTS),
                f"4 robots give {ROBOTS * HZ:g} env steps/s; an H100 update on frame features takes {upd * 1000:.1f} ms "
                f"({1 / upd:.0f} updates/s), so UTD {utd:g} asks {utd * ROBOTS * HZ:g} updates/s of one learner",
            ))  # fmt: skip
    for case, shape, utd in (("efficientnet_frame_features", "flat", 4.0), ("efficientnet_finetuned", "proportional", 1.0)):
        upd = gpu_update_s(case)
        c = robot_costs(pixels)
        at = {64: upd, 128: upd, 256: upd} if shape == "flat" else {64: upd / 4, 128: upd / 2, 256: upd}
        c.update = {"cuda": Curve(at, {b: v * 0.1 for b, v in at.items()})}  # the profiled CPU learner: frame features
        if shape == "flat":
            c.update["cpu"] = pixels.update["cpu"]
        c.dp_overhead = {"cuda": Curve({2: DP_OVERHEAD_S}, {2: DP_OVERHEAD_S * 0.1})}
        out.append(scenario(
            f"pixel RLPD, {case.replace('_', ' ')}, UTD {utd:g}, free-running, learner replicas", c,
            Pipeline(on_policy=False, batch_size=256, utd_ratio=utd, paced=False, robots=ROBOTS),
            f"an H100 update takes {upd * 1000:.1f} ms at batch 256, taken as {shape} in the batch; N replicas "
            f"update on 256 / N each and add {DP_OVERHEAD_S * 1000:g} ms (assumed)",
            top=6,
        ))  # fmt: skip
    # the robot side's calls and the noise actor's update: an MLP SAC update at batch 256 as
    # profiled for the state pick (DSRL's actor and critics are MLPs of that size)
    vla = cpu_costs("pick_rlpd")
    chunk = pi0_chunk()
    for horizon in (10, 50):
        c = robot_costs(vla)
        c.act = {"cuda": chunk}
        c.request = Curve({b: v + NETWORK_S for b, v in chunk.wall.items()}, {b: NETWORK_S for b in chunk.wall})
        c.update = {"cpu": vla.update["cpu"]}  # the noise actor and critics: small MLPs
        out.append(scenario(
            f"DSRL over a served pi0, chunks of {horizon}", c,
            Pipeline(on_policy=False, batch_size=128, utd_ratio=0.5, paced=False, horizon=horizon, chunk_rows=True,
                     robots=ROBOTS),
            f"pi0 takes {chunk.wall[1] * 1000:.0f} ms a chunk at batch 1 and {chunk.wall[8] * 1000:.0f} ms at 8 on an "
            f"H100; a robot at {HZ:g} Hz asks for a chunk of {horizon} every {horizon / HZ:g} s",
            served_only=True,
        ))  # fmt: skip
    (RESULTS / "placement_cluster_paper.json").write_text(json.dumps(
        {"what": "the placement model on paper: 4 robot PCs at 10 Hz and one 8 x H100 box", "robots": ROBOTS,
         "robot_hz": HZ, "network_s": NETWORK_S, "scenarios": out, "machine_of_the_cpu_profiles": describe()},
        indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
