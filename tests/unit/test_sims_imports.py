"""Importing the simulator backends has no side effects and loads no simulator."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import os, sys
import rlinf_user.env.contract, rlinf_user.env.base, rlinf_user.env.registry
import rlinf_user.env.vector
before = dict(os.environ)
import rlinf_user.sims.vulkan, rlinf_user.sims.maniskill, rlinf_user.sims.gym_hil
import rlinf_user.sims.robosuite
heavy = [m for m in ("torch", "sapien", "mani_skill", "mujoco", "gym_hil", "robosuite")
         if m in sys.modules]
assert not heavy, f"imported at module import time: {heavy}"
assert dict(os.environ) == before, "importing changed the environment"
"""


def test_backend_modules_import_lazily() -> None:
    subprocess.run([sys.executable, "-c", CODE], check=True, timeout=120)
