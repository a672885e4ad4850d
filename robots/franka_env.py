"""Cloud-side env for a Franka reached through the edge daemon.

The edge daemon (``rlinf-user edge --robot franka``) and its ZMQ protocol are not part of
this release yet; until they are, selecting ``--robot franka`` composes and validates its
configuration (so a missing ``env.edge.host`` is reported) and then stops with this
explanation instead of pretending to drive a robot.
"""

from __future__ import annotations

from rlinf_user.env.base import ContractEnv


class EdgeUnavailableError(RuntimeError):
    pass


class FrankaRemoteEnv(ContractEnv):
    @classmethod
    def from_config(cls, cfg, seed=None):
        raise EdgeUnavailableError(
            "the Franka robot is driven through the edge daemon (`rlinf-user edge --robot franka` "
            "on the robot PC), which this version of rlinf-user does not ship yet; train in "
            "simulation with `rlinf-user train --sim maniskill` meanwhile"
        )

    def _reset(self, seed):  # pragma: no cover - unreachable until the edge client exists
        raise EdgeUnavailableError("edge client unavailable")

    def _step(self, action):  # pragma: no cover
        raise EdgeUnavailableError("edge client unavailable")
