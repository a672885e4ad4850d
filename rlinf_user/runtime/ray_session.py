"""Starting this process's Ray runtime: the one place that calls ``ray.init`` for a run, a
profile or a session (no other part of the package is imported here)."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def start_ray(kwargs: dict[str, Any]) -> bool:
    """``ray.init(**kwargs)`` unless this process already did; True when started here.
    Local runs need no Ray auth token and keep every worker's log lines."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if kwargs.get("address") in (None, "local"):
        lean_local_node()
    log.info("starting Ray: %s", kwargs)
    ray.init(**kwargs)
    return True


def lean_local_node() -> bool:
    """Defaults for the Ray nodes this process starts (``ray.init``, a cluster's local nodes).
    Their dashboard agent takes any free port, not Ray's fixed 52365: with a second Ray on the
    machine (a sim run beside a robot run) the agent otherwise retries that port for 3.4 s,
    and the raylet, and so ``ray.init``, waits for it (6.8 s instead of 3.0 measured). They
    start no autoscaler monitor: a node started here never autoscales, and the monitor's
    process cost half a CPU-second of every run's start (a ``ray start`` cluster keeps its
    own). ``ray.init`` has no argument for either, so this sets the defaults of Ray's node
    parameters; False where a Ray version names one differently (Ray's own default kept)."""
    port = _node_default("dashboard_agent_listen_port", 0)
    monitor = _node_default("no_monitor", True)
    return port and monitor


def _node_default(name: str, value: Any) -> bool:
    import inspect

    try:
        from ray._private.parameter import RayParams

        names = list(inspect.signature(RayParams.__init__).parameters)[1:]
        defaults = list(RayParams.__init__.__defaults__ or ())
        i = names.index(name) - (len(names) - len(defaults))
    except (ImportError, ValueError, AttributeError) as err:
        log.debug("Ray's node parameter %s left at its default: %s", name, err)
        return False
    if i < 0:
        return False
    defaults[i] = value
    RayParams.__init__.__defaults__ = tuple(defaults)
    return True
