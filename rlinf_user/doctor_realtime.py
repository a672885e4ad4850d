"""Host checks behind ``rlinf-user doctor --robot``: can this PC run a control loop in real
time (PREEMPT_RT kernel, SCHED_FIFO allowed at the loop's priority, CPU governor)."""

from __future__ import annotations

import glob
import os
import platform
import subprocess
import sys

from rlinf_user.doctor import Check

LIBFRANKA_RT_PRIORITY = 99  # libfranka runs its control thread at SCHED_FIFO's highest priority


def _kernel_is_realtime() -> tuple[bool, str]:
    """(PREEMPT_RT?, a description): ``/sys/kernel/realtime`` and ``uname -v``."""
    flag = ""
    try:
        with open("/sys/kernel/realtime") as f:
            flag = f.read().strip()
    except OSError:
        pass
    uname = platform.uname()
    rt = flag == "1" or "PREEMPT_RT" in uname.version.split()
    return rt, f"{uname.release} ({uname.version})"


def _rtprio_limit() -> str:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
    show = lambda v: "unlimited" if v == resource.RLIM_INFINITY else str(v)  # noqa: E731
    return show(soft) if soft == hard else f"{show(soft)} (hard {show(hard)})"


def sched_fifo_allowed(priority: int) -> tuple[bool, str]:
    """Try SCHED_FIFO at ``priority`` in a short-lived child process; (allowed, why not)."""
    code = (
        "import os, sys\n"
        "try:\n"
        "    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(sys.argv[1])))\n"
        "except OSError as err:\n"
        "    print(err.strerror or err); sys.exit(1)\n"
    )
    try:
        r = subprocess.run([sys.executable, "-S", "-c", code, str(priority)],
                           capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"could not test: {err}"
    return r.returncode == 0, (r.stdout or r.stderr).strip()


def check_rt_kernel(realtime: bool | None) -> Check:
    """PREEMPT_RT or not, judged against ``robot.realtime`` (None: the config is unknown)."""
    rt, kernel = _kernel_is_realtime()
    if rt:
        return Check("real-time kernel", "ok", f"PREEMPT_RT: {kernel}")
    fix = ("install a PREEMPT_RT kernel (Ubuntu: `sudo pro enable realtime-kernel`, or build one: "
           "libfranka's real-time kernel guide), or run degraded with robot.realtime=false")  # fmt: skip
    if realtime is False:
        return Check("real-time kernel", "warn",
                     f"not PREEMPT_RT: {kernel}; robot.realtime=false, so libfranka runs without "
                     "real-time guarantees (degraded: expect communication_constraints_violation "
                     "under load)", fix)  # fmt: skip
    return Check("real-time kernel", "fail",
                 f"not PREEMPT_RT: {kernel}; with robot.realtime=true libfranka refuses to connect "
                 "(\"Running kernel does not have realtime capabilities\")", fix)  # fmt: skip


def check_sched_fifo(realtime: bool | None, loop_priority: int = 0) -> Check:
    """Whether this user may run SCHED_FIFO threads (libfranka at 99, the control loop at
    ``realtime_priority``)."""
    limit = _rtprio_limit()
    fix = ("add the user to a `realtime` group with `@realtime - rtprio 99` in "
           "/etc/security/limits.conf (franky's installation guide), then log in again")  # fmt: skip
    ok, why = sched_fifo_allowed(LIBFRANKA_RT_PRIORITY)
    if not ok:
        detail = (f"SCHED_FIFO priority {LIBFRANKA_RT_PRIORITY} refused ({why}); "
                  f"RLIMIT_RTPRIO {limit}")  # fmt: skip
        if realtime is False:
            return Check("SCHED_FIFO", "warn", detail + "; robot.realtime=false does not need it", fix)
        return Check("SCHED_FIFO", "fail", detail + "; libfranka needs it with robot.realtime=true", fix)
    if loop_priority > 0:
        ok_loop, why_loop = sched_fifo_allowed(loop_priority)
        if not ok_loop:
            return Check("SCHED_FIFO", "warn",
                         f"realtime_priority={loop_priority} refused ({why_loop}); the control loop "
                         "falls back to normal scheduling", fix)  # fmt: skip
    who = "root" if os.geteuid() == 0 else f"RLIMIT_RTPRIO {limit}"
    return Check("SCHED_FIFO", "ok", f"allowed at priority {LIBFRANKA_RT_PRIORITY} ({who})")


def check_cpu_governor(root: str = "/sys/devices/system/cpu") -> Check:
    paths = sorted(glob.glob(os.path.join(root, "cpu[0-9]*", "cpufreq", "scaling_governor")))
    if not paths:
        return Check("CPU governor", "ok", "no cpufreq interface (fixed clock or a VM): nothing to set")
    counts: dict[str, int] = {}
    for path in paths:
        try:
            with open(path) as f:
                gov = f.read().strip()
        except OSError:
            gov = "unreadable"
        counts[gov] = counts.get(gov, 0) + 1
    detail = ", ".join(f"{g} on {n} CPU{'s' if n > 1 else ''}" for g, n in sorted(counts.items()))
    if set(counts) == {"performance"}:
        return Check("CPU governor", "ok", detail)
    return Check("CPU governor", "warn",
                 detail + ": frequency scaling adds latency to libfranka's 1 kHz loop",
                 "sudo cpupower frequency-set -g performance (until reboot; make it permanent in "
                 "the BIOS or a systemd unit)")  # fmt: skip
