"""Who controls the robot: one client at a time, holding a session (a bearer secret).

A client asks with ``hello`` on the daemon's public socket, presenting a session id it
made up; the daemon accepts it when nobody controls the robot, when the controller has been
silent for ``peer_timeout_s``, or (with CURVE keys only) when the same key presents the same
session from a new connection (a client reconnecting after a network drop). The accepted
client then presents the same session on the controller's own socket (:meth:`bind`), which
moves its commands there; its commands still count when they come from the connection that
asked (a client whose route forwards only the public port, or one whose move to the
controller's socket answered after it gave up waiting): control follows them back
(:meth:`follow`). Session ids are never echoed and are compared in constant time.
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
        self.asked: Peer | None = None  # the connection whose hello was accepted
        self.key: str | None = None  # its CURVE public key (z85)
        self.session: str | None = None
        self.last_seen = 0.0

    def controls(self, peer: Peer, key: str | None = None) -> bool:
        """Whether a message from ``peer`` (signed by ``key``, with CURVE) is the controller's:
        it came from one of the session's two connections, and with keys, under its key (a
        connection's routing id is no credential)."""
        return self.peer is not None and peer in (self.peer, self.asked) and (not self.keys or key == self.key)

    def follow(self, peer: Peer) -> bool:
        """A command from the controller: its replies, heartbeats and streams go where it came
        from from now on. True when control moved."""
        moved = peer != self.peer
        self.peer = peer
        return moved

    def alive(self, now: float) -> bool:
        return now - self.last_seen < self.peer_timeout_s

    def claim(self, peer: Peer, key: str | None, session: str, now: float) -> tuple[bool, str]:
        """A ``hello``: (granted, how). Taking control from a live connection needs the same
        session presented by the same CURVE key; without keys a live controller is never
        displaced."""
        how = "new"
        if self.peer is not None and not self.controls(peer, key):
            resume = self.keys and key is not None and key == self.key and _same(self.session, session)
            if self.alive(now) and not resume:
                return False, "busy"
            how = "handover: same key and session" if resume else "handover: previous one silent"
        self.peer = self.asked = peer
        self.key, self.session, self.last_seen = key, session, now
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
        self.peer = self.asked = self.key = self.session = None

