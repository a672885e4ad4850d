"""The reach task under a lab's own backend name (a plugin env backend)."""

from rlinf_user.sims.reach import ReachEnv


class LabReach(ReachEnv):
    pass
