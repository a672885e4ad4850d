"""Which build of the project a process runs: the version and a digest of its source files.

Every node of a run must run the same code: an env worker on a node with another checkout
would send rows its learner reads differently. The driver passes its identity to each
worker it starts, and a worker whose own differs refuses to start, naming both.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from rlinf_user import __version__

ANOTHER_BUILD = "another build of the project"


@lru_cache(maxsize=1)
def project_identity() -> str:
    """``<version>+<first 10 hex digits of the sha256 of the package's .py files>``."""
    import rlinf_user.policies as policies  # the policies package may live beside the core

    digest = hashlib.sha256()
    roots = sorted({Path(__file__).resolve().parent, Path(policies.__file__).resolve().parent})
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:10]}"


def check_same_build(driver: str | None) -> None:
    """Raises where this process runs another build than the run's driver."""
    mine = project_identity()
    if driver is not None and driver != mine:
        raise RuntimeError(f"{ANOTHER_BUILD}: this node runs rlinf-user {mine}, the run's driver {driver}; install "
                           "the same version on every node of the run")  # fmt: skip
