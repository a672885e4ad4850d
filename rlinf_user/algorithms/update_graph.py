"""The SAC family's update captured whole in a CUDA graph (``algo.update_graph``).

On a GPU an image-SAC update at batch 256 is bound by launching its kernels (about 50 ms
whatever the precision on an H100: two cameras' encoders, the critic ensemble, the actor,
three Adam steps, the targets' Polyak step). Captured, an update is a copy of the batch into
static buffers and one replay.

* **What is captured**: :meth:`rlinf_user.algorithms.sac.SAC.update_on_device`, the update's
  device work with its metrics as tensors; the host's part (counting updates, the actor's
  schedule, the scheduled temperature) stays outside. One graph per phase (critics only,
  or critics, actor and temperature) and batch layout.
* **When**: a phase is captured at its second update, once its first (eager) update has
  made the optimisers' state; the capture's warm-up runs the update for real, so the
  weights and optimiser state are saved before it and put back after. Every update then
  changes the weights once, as the eager one does.
* **Refused or eager, said once**: off a GPU (``on``), with data-parallel replicas (their
  gradients are all-reduced between the backward and the step), for an algorithm whose
  update reads values back to the host (DSRL), after ``max_graphs`` layouts, and after a
  capture that fails.
* The optimisers are made capturable (their step counts on the device) and a scheduled
  actor rate becomes a device tensor the schedule fills.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from rlinf_user.policies.chunk_graph import Captured, graph_mode

log = logging.getLogger(__name__)
ADAM_STEP = "step"  # Adam's step count in an optimiser's per-parameter state (not a column)


def flatten(tree: Any, path: tuple = ()) -> tuple[list[torch.Tensor], tuple]:
    """The tensors of a nested dict in a fixed order, and a hashable layout (paths, shapes,
    dtypes; other values kept as they are) to rebuild it and to key graphs by."""
    if isinstance(tree, dict):
        leaves, layout = [], []
        for k in sorted(tree):
            sub, sub_layout = flatten(tree[k], (*path, k))
            leaves += sub
            layout.append((k, sub_layout))
        return leaves, ("dict", tuple(layout))
    if isinstance(tree, torch.Tensor):
        return [tree], ("tensor", tuple(tree.shape), tree.dtype, str(tree.device))
    return [], ("value", tree)


def unflatten(layout: tuple, leaves: list[torch.Tensor]) -> Any:
    it = iter(leaves)

    def build(node):
        kind = node[0]
        if kind == "dict":
            return {k: build(sub) for k, sub in node[1]}
        if kind == "tensor":
            return next(it)
        return node[1]

    return build(layout)


class UpdateGraphs:
    """The captured updates of one algorithm (a :class:`rlinf_user.algorithms.sac.SAC`)."""

    def __init__(self, algo, mode: str = "on", backend: str = "cuda", max_graphs: int = 8):
        if backend not in ("cuda", "rerun"):
            raise ValueError(f"update graphs: backend {backend!r} (cuda, or rerun for tests)")
        self.algo, self.backend, self.max_graphs = algo, backend, int(max_graphs)
        self.graphs: dict[tuple, tuple[Captured, list[str]]] = {}
        self.eager_phases: set[bool] = set()  # phases that ran an eager update already
        self.disabled: str | None = None
        self.captures = self.replays = 0
        self._pool = None
        self._said: set[str] = set()
        if not getattr(type(algo), "capturable_update", False):
            self.disabled = f"algo={algo.cfg.name}'s update reads values back to the host; it runs eagerly"
        elif backend == "cuda":
            self._capturable_optimisers()

    @classmethod
    def for_algorithm(cls, algo, setting, device) -> UpdateGraphs | None:
        """From ``algo.update_graph`` (auto: on a CUDA device; on: refused elsewhere; off)."""
        mode = graph_mode(setting)
        device = torch.device(device)
        if mode == "off" or (mode == "auto" and device.type != "cuda"):
            return None
        if device.type != "cuda":
            raise ValueError(f"algo.update_graph=on: CUDA graphs need a CUDA device, and this learner runs on {device}; "
                             "use algo.update_graph=auto (graphs on a GPU, eager elsewhere) or off")  # fmt: skip
        return cls(algo, mode)

    def _capturable_optimisers(self) -> None:
        for opt in self.algo.optimizers():
            for group in opt.param_groups:
                group["capturable"] = True
                dev = group["params"][0].device
                if self.algo.cfg.final_actor_lr is not None and opt is self.algo.actor_opt:
                    group["lr"] = torch.tensor(float(group["lr"]), device=dev)  # the schedule fills it
            for param, state in opt.state.items():  # a capturable step count lives on the device
                step = state.get(ADAM_STEP)
                if isinstance(step, torch.Tensor):
                    state[ADAM_STEP] = step.to(device=param.device, dtype=torch.float32)

    def say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.warning("%s", message)

    def state(self) -> list[torch.Tensor]:
        """Every tensor an update changes in place: weights, buffers, optimiser state."""
        algo, out, seen = self.algo, [], set()
        for m in algo._modules.values():
            if m is None:
                continue
            for t in [*m.parameters(), *m.buffers()]:
                if id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
        out.append(algo.log_alpha)
        for opt in algo.optimizers():
            for state in opt.state.values():
                out += [v for v in state.values() if isinstance(v, torch.Tensor)]
            for group in opt.param_groups:
                if isinstance(group["lr"], torch.Tensor):
                    out.append(group["lr"])
        return out

    def run(self, batch: dict[str, Any], actor: bool) -> dict[str, torch.Tensor] | None:
        """The update's metrics (tensors) from a replay, or None: run it eagerly."""
        algo = self.algo
        if self.disabled is None and algo.grad_world > 1:
            self.disabled = "algo.update_graph: data-parallel replicas all-reduce their gradients inside the update"
        if self.disabled is not None:
            self.say(f"{self.disabled}; updates run eagerly")
            return None
        if actor not in self.eager_phases:  # its optimisers' state is made by an eager update first
            self.eager_phases.add(actor)
            return None
        leaves, layout = flatten(batch)
        try:
            key = (actor, layout)
            entry = self.graphs.get(key)
        except TypeError:  # a column that is no tensor (an instruction's text): tokenised on the host
            self.say("algo.update_graph: batches with columns that are not tensors (instructions) run eagerly")
            return None
        if entry is None:
            if len(self.graphs) >= self.max_graphs:
                self.say(f"algo.update_graph: {self.max_graphs} batch layouts captured already; a new one runs eagerly")
                return None
            names: list[str] = []

            def step(*xs):
                metrics = algo.update_on_device(unflatten(layout, list(xs)), actor)
                names[:] = list(metrics)
                return [m if isinstance(m, torch.Tensor) else torch.tensor(float(m)) for m in metrics.values()]

            try:
                graph = Captured(step, leaves, self.backend, self._pool, state=self.state)
            except torch.OutOfMemoryError:
                raise
            except Exception as err:  # noqa: BLE001 - an op a graph cannot hold: eager from now on
                self.disabled = f"algo.update_graph: capturing the update failed ({type(err).__name__}: {err})"
                log.warning("%s; updates run eagerly from now on", self.disabled)
                return None
            self._pool = self._pool if self._pool is not None else graph.pool
            entry = self.graphs[key] = (graph, list(names))
            self.captures += 1
            log.info("algo.update_graph: captured the %s update", "critic + actor" if actor else "critic")
        graph, names = entry
        self.replays += 1
        return dict(zip(names, graph.replay(leaves)))
