"""Who controls the robot: one client at a time, holding a session (a bearer secret).

A client asks with ``hello`` on the daemon's public socket, presenting a session id it
made up; the daemon accepts it when nobody controls the robot, when the controller has been
silent for ``peer_timeout_s``, or (with CURVE keys only) when the same key presents the same
session from a new connection (a client reconnecting after a network drop). The accepted
client then presents the same session on the controller's own socket (:meth:`bind`), which
moves its commands there. Session ids are never echoed and are compared in constant time.
"""

from __future__ import annotations

import hmac

Peer = tuple  # (socket, ZMQ identity): where a request came from and its reply goes


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


class ControlSession:
    def __init__(self, peer_timeout_s: float, keys: bool):
        self.peer_timeout_s, self.keys = peer_timeout_s, keys
        self.peer: Peer | None = None  # where the controller's commands come from
        self.key: str | None = None  # its CURVE public key (z85)
        self.session: str | None = None
        self.last_seen = 0.0

    def controls(self, peer: Peer) -> bool:
        return self.peer is not None and peer == self.peer

    def alive(self, now: float) -> bool:
        return now - self.last_seen < self.peer_timeout_s

    def claim(self, peer: Peer, key: str | None, session: str, now: float) -> tuple[bool, str]:
        """A ``hello``: (granted, how). Taking control from a live connection needs the same
        session presented by the same CURVE key; without keys a live controller is never
        displaced."""
        how = "new"
        if self.peer is not None and self.peer != peer:
            resume = self.keys and key is not None and key == self.key and _same(self.session, session)
            if self.alive(now) and not resume:
                return False, "busy"
            how = "handover: same key and session" if resume else "handover: previous one silent"
        self.peer, self.key, self.session, self.last_seen = peer, key, session, now
        return True, how

    def bind(self, peer: Peer, key: str | None, session: str, now: float) -> bool:
        """A ``hello`` on the controller's socket: the accepted session (with its key, when
        there are keys) moves there."""
        if not _same(self.session, session) or (self.keys and key != self.key):
            return False
        self.peer, self.last_seen = peer, now
        return True

    def lapse(self) -> None:
        """The controller went silent: the robot is free; the same key and session may take
        it back with ``hello``."""
        self.peer = None

    def release(self) -> None:
        """The controller said ``bye``."""
        self.peer = self.key = self.session = None

