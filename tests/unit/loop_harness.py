"""The edge control loop on a thread, talked to over a real ZMQ PAIR socket as the daemon does."""

from __future__ import annotations

import contextlib
import threading
import time

import zmq

from rlinf_user.edge.backends import ArmBackend
from rlinf_user.edge.protocol import Message, decode, encode
from rlinf_user.edge.safety import SafetyConfig


@contextlib.contextmanager
def running_loop(arm, hz: float = 50, watchdog_periods: int = 3, name: str = "loop"):
    """Yields ``(control, ask, collect, states)``: ``ask(kind, rid, body=None, **arrays)``
    sends a request and returns its answer (state messages on the way are kept in
    ``states``); ``collect(seconds)`` keeps the state stream for that long."""
    from rlinf_user.edge.control_loop import ControlLoop

    ctx = zmq.Context()
    daemon, loop_sock = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    daemon.bind(f"inproc://{name}")
    loop_sock.connect(f"inproc://{name}")
    control = ControlLoop(ArmBackend(arm, SafetyConfig()), loop_sock, hz=hz, watchdog_periods=watchdog_periods)
    thread = threading.Thread(target=control.run, daemon=True)
    thread.start()
    states: list[Message] = []

    def ask(kind, rid, body=None, **arrays):
        daemon.send_multipart(encode(Message(kind, rid, body or {}, arrays)))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if daemon.poll(100):
                m = decode(daemon.recv_multipart())
                if m.kind == "state":
                    states.append(m)
                elif m.rid == rid and m.kind in ("obs", "error", "ack"):
                    return m
        raise TimeoutError(kind)

    def collect(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if daemon.poll(20):
                m = decode(daemon.recv_multipart())
                if m.kind == "state":
                    states.append(m)

    try:
        yield control, ask, collect, states
    finally:
        control.running = False
        thread.join(2)
        daemon.close(0)
        loop_sock.close(0)
        ctx.term()
