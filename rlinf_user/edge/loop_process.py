"""The control-loop process: its entry point (:func:`serve`) builds the backend, reports
its spec to the daemon, runs :class:`~rlinf_user.edge.control_loop.ControlLoop`, and on any
exit holds the robot and leaves within a bounded time, whatever the driver does."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

import zmq

from rlinf_user.edge.backends import EdgeBackend
from rlinf_user.edge.control_loop import PAIR_HWM, ControlLoop
from rlinf_user.edge.protocol import Message, encode, error, finite_body
from rlinf_user.edge.timing import set_realtime

log = logging.getLogger(__name__)


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


def serve(make_backend: Callable[[], EdgeBackend], address: str, hz: float, watchdog_periods: int,
          realtime_priority: int = 0, spin_s: float = 0.0005, log_level: int = logging.INFO,
          daemon_timeout_s: float = 2.0, daemon_pid: int | None = None) -> None:  # fmt: skip
    """Entry point of the control-loop process: build the backend, report, loop."""
    logging.basicConfig(level=log_level, format="%(asctime)s control %(levelname)s %(message)s")
    from rlinf_user.procs import die_with_parent

    die_with_parent(signal.SIGTERM)  # a SIGKILLed daemon still ends this process (held, below)
    signal.signal(signal.SIGTERM, _raise_exit)
    if daemon_pid is not None and os.getppid() != daemon_pid:
        log.error("the edge daemon died while this process started; exiting")
        return
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.linger = 0
    sock.sndhwm = sock.rcvhwm = PAIR_HWM
    sock.connect(address)
    try:
        backend = make_backend()
    except Exception as err:  # noqa: BLE001 - reported to the daemon, which exits cleanly
        log.exception("backend failed to start")
        _send_or_give_up(sock, error(0, "backend", f"{type(err).__name__}: {err}"))
        sock.close(0)
        ctx.term()
        return
    if not _send_or_give_up(sock, Message("welcome", 0, finite_body(backend.spec()))):
        log.error("the edge daemon does not read; exiting")
        _shut_down(backend, sock, ctx)
    set_realtime(realtime_priority)
    loop = ControlLoop(backend, sock, hz, watchdog_periods, spin_s, daemon_timeout_s=daemon_timeout_s)
    code = 0
    try:
        loop.run()
    except SystemExit:
        log.warning("terminated: holding the robot")
    except BaseException:  # noqa: BLE001 - logged, the robot held, a non-zero exit for the daemon
        log.exception("the control loop crashed: holding the robot")
        code = 1
    finally:
        _shut_down(backend, sock, ctx, code)


def _send_or_give_up(sock: zmq.Socket, msg: Message, timeout_s: float = 10.0) -> bool:
    if not sock.poll(timeout_s * 1e3, zmq.POLLOUT):
        return False
    sock.send_multipart(encode(msg), flags=zmq.NOBLOCK)
    return True


def _shut_down(backend: EdgeBackend, sock: zmq.Socket, ctx: zmq.Context, code: int = 0,
               timeout_s: float = 1.5) -> None:  # fmt: skip
    """Hold, release the backend, and leave within ``timeout_s`` whatever it does: a driver
    or renderer that hangs (in a hold over a dead link, in its teardown) must not keep this
    process alive."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a late SIGTERM must not cut this short
    guard = threading.Timer(timeout_s, os._exit, args=(3,))
    guard.daemon = True
    guard.start()
    for step, call in (("hold", backend.hold), ("close", backend.close)):
        try:
            call()
        except Exception:  # noqa: BLE001
            log.exception("%s on shutdown failed", step)
        else:
            if step == "hold":
                log.info("shutting down: the robot is held")
    sock.close(0)
    ctx.term()
    logging.shutdown()
    os._exit(code)  # skip interpreter teardown (GL contexts' finalisers have hung it)
