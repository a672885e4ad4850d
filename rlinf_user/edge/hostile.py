"""Hostile peers for testing an edge daemon: floods and half-open connections.

What the daemon is tested and benchmarked against (``tests/integration/test_edge_hostile.py``,
``benchmarks/bench_edge_hostile.py``); point it at your own daemon (loopback or a test
network only) to check a deployment. Each attacker runs in its own process, speaks the wire
format by hand over raw sockets, is bounded in time, and prints a line when it is under way
and how many messages (or connections) it sent when it ends::

    python -m rlinf_user.edge.hostile flood PORT SECONDS KEYS MODE   # MODE: telemetry | mixed | act_flood
    python -m rlinf_user.edge.hostile half_open PORT COUNT SECONDS

``KEYS`` is a folder with ``edge.key`` (the daemon's public key) and ``attacker.key_secret``
(an authorised key pair), or ``-`` for a daemon without keys.
"""

from __future__ import annotations

import resource
import secrets
import socket
import sys
import time

import numpy as np
import zmq
import zmq.auth

from rlinf_user.edge.protocol import PROTOCOL_VERSION, Message, decode, encode

# a ZMTP 3 greeting for CURVE, cut short: the handshake never finishes
PARTIAL_GREETING = bytes([0xFF] + [0] * 8 + [0x7F, 3, 0]) + b"CURVE"


def _dealer(port: int, keys: str) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    s.sndhwm = 0  # unbounded: push as fast as the daemon can be made to read
    if keys != "-":
        s.curve_publickey, s.curve_secretkey = zmq.auth.load_certificate(f"{keys}/attacker.key_secret")
        s.curve_serverkey = zmq.auth.load_certificate(f"{keys}/edge.key")[0]
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def _hello(session: str) -> Message:
    return Message("hello", 1, {"client": "hostile", "session": session, "protocol": PROTOCOL_VERSION})


def flood(port: int, seconds: float, keys: str, mode: str) -> int:
    """Send requests flat out for ``seconds`` (reading whatever comes back); returns how many.

    ``telemetry``: telemetry requests. ``mixed``: hello, act, chunk, telemetry, ping, a bad
    header and a message naming one array twice. ``act_flood``: take control (hello, reset
    where the arm is), then acts without waiting for their observations (a runaway policy)."""
    s = _dealer(port, keys)
    a = {"action": np.zeros(7, np.float32)}
    if mode == "act_flood":
        s.send_multipart(encode(_hello(secrets.token_hex(8))))
        s.recv_multipart()
        s.send_multipart(encode(Message("reset", 2, {"seed": 0, "options": {"home": False}})))
        while decode(s.recv_multipart()).kind not in ("obs", "error"):
            pass
        frames = [encode(Message("act", 3, {}, a))]
    elif mode == "mixed":
        act = encode(Message("act", 5, {}, a))
        frames = [encode(_hello(secrets.token_hex(8))), act,
                  encode(Message("chunk", 6, {}, {"actions": np.zeros((8, 7), np.float32)})),
                  encode(Message("telemetry", 7)), encode(Message("ping", 8)), [b"\x93\xa3bad"],
                  [_twice_named(act[0]), act[1], act[1]]]  # fmt: skip
    elif mode == "telemetry":
        frames = [encode(Message("telemetry", 1))]
    else:
        raise ValueError(f"unknown flood mode {mode!r}")
    print("flooding", flush=True)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        s.send_multipart(frames[n % len(frames)])
        n += 1
        while s.poll(0):
            s.recv_multipart()  # read what comes back, as a real client would
    s.close(0)
    return n


def _twice_named(header: bytes) -> bytes:
    """The header of a one-array message rewritten to announce that array twice."""
    import msgpack

    h = msgpack.unpackb(bytes(header))
    h["a"] = h["a"] * 2
    return msgpack.packb(h)


def half_open(port: int, count: int, seconds: float) -> int:
    """Hold up to ``count`` TCP connections that never finish a handshake (every other one
    sent a partial greeting) for ``seconds``, reopening those the daemon drops; says
    ``opened`` once 1,100 are established (or after 1 s, against a daemon that cuts them);
    returns how many were opened."""
    import selectors

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()  # epoll: no FD_SETSIZE limit
    est: list[socket.socket] = []
    opened, announced, t0 = 0, False, time.monotonic()
    end, next_check = t0 + seconds, t0 + 0.2
    while time.monotonic() < end:
        while len(est) + len(sel.get_map()) < count:  # top up: connects in flight
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            sel.register(s, selectors.EVENT_WRITE)
            opened += 1
        for key, _ in sel.select(0.05):
            s = key.fileobj
            sel.unregister(s)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                s.close()
                continue
            if len(est) % 2:
                try:
                    s.send(PARTIAL_GREETING)
                except OSError:
                    pass
            est.append(s)
        if not announced and (len(est) >= min(count, 1100) or time.monotonic() > t0 + 1):
            print("opened", flush=True)
            announced = True
        if time.monotonic() >= next_check:  # forget the ones the daemon closed
            next_check = time.monotonic() + 0.2
            alive = []
            for s in est:
                try:
                    while s.recv(4096, socket.MSG_DONTWAIT):  # the daemon's greeting, never answered
                        pass
                    s.close()  # an empty read: the daemon closed it
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    continue
                alive.append(s)
            est = alive
    for s in est + [k.fileobj for k in sel.get_map().values()]:
        s.close()
    return opened


def main(argv: list[str]) -> None:
    if argv[:1] == ["flood"] and len(argv) == 5:
        print(flood(int(argv[1]), float(argv[2]), argv[3], argv[4]), flush=True)
    elif argv[:1] == ["half_open"] and len(argv) == 4:
        print(half_open(int(argv[1]), int(argv[2]), float(argv[3])), flush=True)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
