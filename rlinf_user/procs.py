"""Process hygiene for the edge: children die with their parent, leftovers are found.

* :func:`die_with_parent` asks Linux to signal this process when its parent dies
  (``PR_SET_PDEATHSIG``), so a ``kill -9`` of ``rlinf-user edge`` never orphans the control
  loop or franky-sim. Elsewhere it is a no-op and the callers' own parent checks apply.
* :func:`port_holder` names the process that listens on a TCP port (from ``/proc``), so a
  start-up error can say exactly what holds it.
* :func:`clean_stale_ipc_dirs` removes the IPC folders of daemons that no longer run.
* :func:`raise_fd_limit` lifts the soft limit on open files to what the process may have.
* :func:`free_ports` finds ``n`` consecutive free ports for a daemon (tests, benchmarks).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import struct
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
IPC_PREFIX = "rlinf-edge-"


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _local_ipv4(field: str) -> str:
    """``"2100007F"`` (little-endian hex from ``/proc/net/tcp``) -> ``"127.0.0.33"``."""
    return socket.inet_ntoa(struct.pack("<I", int(field, 16)))


def _listening_inodes(port: int, host: str | None) -> set[str]:
    """Inodes of the sockets listening on ``port``: on ``host`` or a wildcard address when given."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) <= 9 or parts[3] != "0A":  # state 0A: LISTEN
                continue
            addr, port_hex = parts[1].rsplit(":", 1)
            if int(port_hex, 16) != port:
                continue
            if host is not None and set(addr) != {"0"}:  # a wildcard listener serves every host
                if table.endswith("tcp6") or _local_ipv4(addr) != host:
                    continue
            inodes.add(parts[9])
    return inodes


def port_holder(port: int, host: str | None = None) -> str | None:
    """``"pid 123 (python -m franky_sim.run_server ...)"`` for the listener on ``host:port``.

    With ``host`` given, only a listener bound to that IPv4 address (or to every address)
    counts: loopback aliases (127.0.0.x) each have their own port 1337.
    """
    inodes = _listening_inodes(port, host)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    return f"pid {pid} ({cmd.strip()[:160]})"
            except OSError:
                continue
    return "a process this user cannot inspect"


def free_ports(n: int = 3, host: str = "127.0.0.1") -> int:
    """A base port with ``n`` consecutive free ports on ``host`` (a daemon serves ``port``,
    ``port+1`` and ``port+2``)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = [socket.socket() for _ in range(n)]
        try:
            for k, t in enumerate(socks):
                t.bind((host, base + k))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError(f"no {n} consecutive free ports on {host}")


def raise_fd_limit(cap: int = 1 << 16) -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit (at most ``cap``): a service
    started with the usual 1,024 would run out of descriptors under a connection flood long
    before it runs out of anything else. Returns (old soft limit, new soft limit)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as err:
            log.warning("could not raise the open-file limit from %d: %s", soft, err)
            return soft, soft
        return soft, want
    return soft, soft


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _dead_sockets_only(d: Path) -> bool:
    import socket

    for p in d.iterdir():
        if not p.is_socket():
            return False
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(p))
                return False  # somebody still serves it
            except OSError:
                pass
    return True


def make_ipc_dir() -> str:
    """A private folder for the daemon's IPC socket, named after this process."""
    clean_stale_ipc_dirs()
    return tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-")


def clean_stale_ipc_dirs() -> int:
    """Remove ``rlinf-edge-<pid>-*`` folders whose daemon is gone; returns how many."""
    removed = 0
    root = Path(tempfile.gettempdir())
    for d in root.glob(f"{IPC_PREFIX}*"):
        pid = d.name[len(IPC_PREFIX):].split("-", 1)[0]
        if not d.is_dir() or (pid.isdigit() and _alive(int(pid))):
            continue
        if not pid.isdigit() and not _dead_sockets_only(d):
            continue  # a folder of an older release: removed only when nothing listens in it
        shutil.rmtree(d, ignore_errors=True)
        removed += not d.exists()
    if removed:
        log.info("removed %d IPC folder(s) left by edge daemons that no longer run", removed)
    return removed
