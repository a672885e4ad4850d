"""Hostile action sequences for the workspace box, and how far the measured TCP left it.

The box guarantee (``safety.*``: the measured TCP never more than ``box_tolerance`` outside
the workspace box) must hold for whatever a policy sends, not only for pushes from the
box's centre. The sequences here are the ones that most tempt an impedance-controlled arm
out of the box: saturated pushes to each face and corner followed by saturated rotation
about each axis at the face (the orientation target pulls the TCP through the controller's
coupling), every axis saturated one way then the other, and chunks that end at a face and
rotate there. Each sequence is driven through a real :class:`EdgeClient` against a running
edge daemon (franky-sim in CI, or your own arm), and every tick's measured TCP is read
back from the replies.

Used by the CI test on franky-sim and by ``benchmarks/bench_box.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

import numpy as np

FACES = tuple(np.eye(3)[i] * s for i in range(3) for s in (1.0, -1.0))
CORNERS = tuple(np.array(c, float) for c in itertools.product((1.0, -1.0), repeat=3))
ROTATIONS = tuple(np.eye(3)[i] * s for i in range(3) for s in (1.0, -1.0))
REST_MM = 1.0  # a push has come to rest when two ticks moved the TCP less than this along its axis


def _label(v: np.ndarray, names: str = "xyz") -> str:
    return "".join(f"{names[i]}{'+' if v[i] > 0 else '-'}" for i in np.flatnonzero(v))


@dataclasses.dataclass
class Segment:
    actions: np.ndarray  # (n, 7) contract actions
    chunk: bool = False  # sent as one observed chunk (run by the edge, one action a tick)


@dataclasses.dataclass
class BoxSequence:
    name: str
    segments: list[Segment]
    face: np.ndarray | None = None  # the face a plain push aims at (its arrival is checked)

    def steps(self) -> int:
        return sum(len(s.actions) for s in self.segments)


def _acts(n: int, translation=(0, 0, 0), rotation=(0, 0, 0)) -> np.ndarray:
    return np.tile(np.r_[translation, rotation, 0.0], (max(1, n), 1)).astype(np.float32)


def hostile_sequences(hz: float, *, faces=FACES, corners=CORNERS, rotations=ROTATIONS,
                      push_s: float = 2.0, rotate_s: float = 1.0, saturate_s: float = 3.0,
                      chunks: bool = True) -> list[BoxSequence]:  # fmt: skip
    """The sequences at control rate ``hz`` (durations in seconds, so every rate sees the
    same motion). Subsets (``faces``, ``corners``, ``rotations``) keep a CI run short."""
    n = lambda s: int(round(s * hz))  # noqa: E731
    out = []
    for target in (*faces, *corners):
        kind = "face" if np.count_nonzero(target) == 1 else "corner"
        segs = [Segment(_acts(n(push_s), target))]
        segs += [Segment(_acts(n(rotate_s), rotation=r)) for r in rotations]
        out.append(BoxSequence(f"{kind} {_label(target)}, then rotate {' '.join(_label(r, 'XYZ') for r in rotations)}",
                               segs, target if kind == "face" else None))  # fmt: skip
    ones = np.ones(3)
    for sign in (1.0, -1.0):
        out.append(BoxSequence(f"all axes {'+1 then -1' if sign > 0 else '-1 then +1'}",
                               [Segment(_acts(n(saturate_s), sign * ones, sign * ones)),
                                Segment(_acts(n(saturate_s), -sign * ones, -sign * ones))]))  # fmt: skip
    if chunks:
        for face in faces:  # a chunk that sweeps to the face, then rotates about a face axis
            axis = int(np.flatnonzero(face)[0])
            r = np.zeros(3)
            r[(axis + 1) % 3] = -face[axis]
            acts = np.concatenate([_acts(n(1.0), face), _acts(n(1.5), rotation=r)])[:256]
            out.append(BoxSequence(f"chunk {_label(face)} then rotate {_label(r, 'XYZ')}", [Segment(acts, chunk=True)]))
    return out


def outside_mm(states: np.ndarray, low, high) -> np.ndarray:
    """Signed distance of each state's TCP outside the box in mm (< 0: inside by that much)."""
    p = np.atleast_2d(states)[:, :3]
    return np.max(np.maximum(np.asarray(low) - p, p - np.asarray(high)), axis=1) * 1e3


def go_to(client, goal, max_translation: float, hz: float, settle_s: float = 0.5) -> np.ndarray:
    """Small translation-only steps to ``goal`` (not part of a sequence), then settle."""
    state = np.asarray(client.act(np.zeros(7, np.float32)).arrays["state"], float)
    for _ in range(int(10 * hz)):
        d = np.asarray(goal) - state[:3]
        if np.linalg.norm(d) < 0.003:
            break
        a = np.r_[np.clip(d / max_translation, -0.5, 0.5), np.zeros(4)]
        state = np.asarray(client.act(a.astype(np.float32)).arrays["state"], float)
    for _ in range(int(settle_s * hz)):
        state = np.asarray(client.act(np.zeros(7, np.float32)).arrays["state"], float)
    return state


def run_sequence(client, seq: BoxSequence, low, high, hz: float, settle_s: float = 1.0) -> dict[str, Any]:
    """Drive ``seq`` (then ``settle_s`` of zero actions); every tick's measured TCP is kept.
    Returns the furthest outside the box (mm), and for a face push how far from the face
    the arm came to rest (every face must stay reachable)."""
    states, t0 = [], time.monotonic()
    rest_gap = None
    for seg in seq.segments:
        if seg.chunk:
            client.chunk(seg.actions, observe=True)
            while True:
                msg = client.next_streamed(timeout_s=5.0)
                states.append(np.asarray(msg.arrays["state"], float))
                if msg.body.get("dry"):
                    break
            client.end_stream()
        else:
            for a in seg.actions:
                states.append(np.asarray(client.act(a).arrays["state"], float))
        if seq.face is not None and rest_gap is None:  # the push segment: did it reach the face?
            axis = int(np.flatnonzero(seq.face)[0])
            wall = high[axis] if seq.face[axis] > 0 else low[axis]
            # an arm whose motion lags the clock (a simulator on a busy machine) is still on
            # its way when the push's ticks end: it pushes on while it still closes on the
            # face (up to twice the push again), so the gap measured is where it came to rest
            for _ in range(2 * len(seg.actions)):
                if len(states) < 3 or abs(states[-1][axis] - states[-3][axis]) < REST_MM * 1e-3:
                    break
                states.append(np.asarray(client.act(seg.actions[-1]).arrays["state"], float))
            rest_gap = abs(wall - states[-1][axis]) * 1e3
    for _ in range(int(settle_s * hz)):
        states.append(np.asarray(client.act(np.zeros(7, np.float32)).arrays["state"], float))
    out = outside_mm(np.asarray(states), low, high)
    return {"name": seq.name, "ticks": len(states), "seconds": round(time.monotonic() - t0, 1),
            "max_outside_mm": round(float(out.max()), 2), "face_gap_mm": None if rest_gap is None else round(rest_gap, 1)}  # fmt: skip


def run_all(client, sequences: list[BoxSequence], low, high, hz: float, max_translation: float) -> list[dict[str, Any]]:
    """Each sequence from the box's centre (the orientation carries over, as a policy's would)."""
    centre = (np.asarray(low) + np.asarray(high)) / 2
    rows = []
    for seq in sequences:
        go_to(client, centre, max_translation, hz)
        rows.append(run_sequence(client, seq, low, high, hz))
    return rows
