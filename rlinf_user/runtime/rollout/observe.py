"""Observation stage: an env's observations in the learner's layout (a fleet member's are
adapted to the union spec), with a frozen encoder's feature maps in place of its frames
where ``policy.frame_features`` computes them here, each frame through the backbone once."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_user.env.spec import Col, instruction_array


class Observer:
    def __init__(self, featurizer=None):
        self.adapter = None  # rlinf_user.runtime.rollout.fleet.Adapter, set when the worker is attached
        self.featurizer = featurizer
        self.features: dict[str, Any] | None = None  # the current observation with maps in place of frames

    def current(self, raw_obs: dict[str, Any]) -> dict[str, Any]:
        """What the policy acts on this step."""
        obs = self.adapter.obs(raw_obs)
        if self.featurizer is None:
            return obs
        if self.features is None:
            self.features = self.featurizer.observation(obs)
        return self.features

    def reached(self, raw_next: dict[str, Any], done: np.ndarray, infos: list[dict[str, Any]]) -> dict[str, Any]:
        """The observations each env's step reached, as stored: where an episode ended its
        final one (the batch already holds the next episode's first); the maps of the next
        step's observations are kept for :meth:`current`."""
        fleet_next = self.adapter.obs(raw_next)
        stored = self._with_final_obs(fleet_next, done, infos)
        if self.featurizer is not None:
            stored, self.features = self._featurize(fleet_next, stored, done)
        return stored

    def restart(self) -> None:
        self.features = None

    def _featurize(self, fleet_next, stored_next, done) -> tuple[dict[str, Any], dict[str, Any]]:
        """The maps of the observations this step reached (stored) and of those the next
        step starts from: the same frames except where an episode ended."""
        f = self.featurizer
        stored = f.observation(stored_next)
        rows = np.flatnonzero(done)
        nxt = {k: v for k, v in fleet_next.items() if k != Col.IMAGES}
        nxt[Col.IMAGES] = {}
        nxt[Col.FEATURES] = {k: v.copy() if len(rows) else v for k, v in stored[Col.FEATURES].items()}
        for k, frames in fleet_next[Col.IMAGES].items():
            if len(rows):
                nxt[Col.FEATURES][k][rows] = f.maps(frames[rows])
        return stored, nxt

    def _with_final_obs(self, fleet_next: dict[str, Any], done: np.ndarray, infos) -> dict[str, Any]:
        if not done.any():
            return fleet_next
        out = {
            Col.STATE: fleet_next[Col.STATE].copy(),
            Col.IMAGES: {k: v.copy() for k, v in fleet_next[Col.IMAGES].items()},
        }
        texts = list(fleet_next[Col.INSTRUCTION]) if Col.INSTRUCTION in fleet_next else None
        for i in np.flatnonzero(done):
            final = infos[i]["final_obs"]
            one = {Col.STATE: final[Col.STATE][None], Col.IMAGES: {k: v[None] for k, v in final[Col.IMAGES].items()}}
            if Col.INSTRUCTION in final:
                one[Col.INSTRUCTION] = np.asarray([final[Col.INSTRUCTION]])
            one = self.adapter.obs(one)
            out[Col.STATE][i] = one[Col.STATE][0]
            for k in out[Col.IMAGES]:
                out[Col.IMAGES][k][i] = one[Col.IMAGES][k][0]
            if texts is not None and Col.INSTRUCTION in one:
                texts[i] = one[Col.INSTRUCTION][0]
        if texts is not None:
            out[Col.INSTRUCTION] = instruction_array(texts)
        return out
