"""SAC with a lab's twist: each update also reports how many it has made (``lab_updates``),
so a run's log shows that this module, not a built-in one, trained."""

from dataclasses import dataclass

from rlinf_user.algorithms.sac import SAC, SACConfig


@dataclass
class LabSACConfig(SACConfig):
    name: str = "lab_sac"
    num_critics: int = 3


class LabSAC(SAC):
    config = LabSACConfig

    def update(self, batch):
        metrics = super().update(batch)
        metrics["lab_updates"] = float(self.num_updates)
        return metrics
