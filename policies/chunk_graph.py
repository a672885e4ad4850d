"""A flow VLA's chunk as one CUDA-graph replay (``policy.cuda_graph``).

On a GPU at batch 1, a chunk of pi0 is bound by launching kernels from Python: the VLM over
the prefix, then K denoising steps of the action expert, each a few hundred small kernels.
Here the whole chunk (the cameras' preprocessing, the prefix pass, the K steps over its KV
cache, the un-normalisation; stochastic: the Flow-Noise chain, its log-density and the
value) is captured once per input shape into a CUDA graph whose inputs and outputs are
static buffers. Acting copies the observation into them and replays the graph: one launch,
no host synchronisation inside the chunk.

* **Shapes**: a batch is padded to the next power of two (its first row repeated; the
  outputs cut back), so a rollout server's varying batches meet a few graphs. Each new
  shape (batch bucket, prompt length, image size, kind) is captured once, and said once.
* **Falls back to the eager chunk, saying so once**, never replaying a graph that does not
  fit: a batch above ``max_batch``, more shapes than ``max_graphs``, a capture that fails
  (an operation a graph cannot hold). The graphs read the parameters' storage: weights
  loaded in place (the weight subscriber copies into a GPU policy's tensors) are what the
  next replay uses; a policy whose tensors were replaced (moved, re-typed, new adapters)
  drops its graphs and captures again.
* **Out of device memory while capturing** is raised as such (the rollout server halves
  its batch), and nothing half-captured is kept.

``backend="rerun"`` is the same machinery without a GPU: "capturing" runs the function on
the static buffers, "replaying" runs it again there. It is how the buffers, padding, keys,
fallbacks and invalidation are tested on a CPU; a user cannot ask for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")


def graph_mode(value) -> str:
    """``policy.cuda_graph`` as one of :data:`MODES` (YAML's true/false read as on/off)."""
    if value is None or value is True:
        return "auto" if value is None else "on"
    if value is False:
        return "off"
    mode = str(value).lower()
    if mode in ("true", "false"):
        return "on" if mode == "true" else "off"
    if mode not in MODES:
        raise ValueError(f"policy.cuda_graph={value!r}: one of {', '.join(MODES)}")
    return mode


def bucket(n: int) -> int:
    """The batch a graph is captured for: the next power of two."""
    return 1 << max(0, int(n) - 1).bit_length()


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with its first row repeated up to ``rows`` (real inputs, so the padding rows
    compute finite values nobody reads)."""
    n = x.shape[0]
    if n == rows:
        return x
    return torch.cat([x, x[:1].expand(rows - n, *x.shape[1:])], dim=0)


class Captured:
    """One shape's graph: static inputs, static outputs, and how to refill and replay.

    ``state``: tensors ``fn`` changes in place (a training step's weights and optimiser
    state). The capture's warm-up runs ``fn`` for real, so they are saved before it and put
    back after, in place: a captured step then changes them once per replay, as the eager
    step would (with the rerun backend the random-number state is put back too, so a replay
    draws what the eager step would have drawn)."""

    def __init__(self, fn: Callable, inputs: Sequence[torch.Tensor], backend: str, pool,
                 state: Callable[[], list[torch.Tensor]] | None = None):  # fmt: skip
        self.fn = fn
        self.inputs = [x.clone() for x in inputs]
        self.graph = None
        saved = [(t, t.detach().clone()) for t in state()] if state is not None else []
        rng = torch.random.get_rng_state() if backend != "cuda" else None
        if backend == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up (cuBLAS workspaces, lazy inits) off the capture
                for _ in range(2):
                    fn(*self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            _restore(saved)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = list(fn(*self.inputs))
        else:
            self.outputs = [o.detach().clone() for o in fn(*self.inputs)]
            _restore(saved)
            torch.random.set_rng_state(rng)

    @property
    def pool(self):
        return None if self.graph is None else self.graph.pool()

    def replay(self, inputs: Sequence[torch.Tensor], rows: int | None = None) -> list[torch.Tensor]:
        """The outputs for ``inputs`` (cut to ``rows`` where the batch was padded), copied
        out of the static buffers the next replay overwrites."""
        for static, x in zip(self.inputs, inputs):
            static.copy_(x)
        if self.graph is not None:
            self.graph.replay()
        else:
            for static, o in zip(self.outputs, self.fn(*self.inputs)):
                static.copy_(o)
        return [o.clone() if rows is None else o[:rows].clone() for o in self.outputs]


def _restore(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for t, copy in saved:
            t.copy_(copy)


class ChunkGraphs:
    """The captured chunks of one policy, keyed by kind and input shapes."""

    def __init__(self, max_batch: int = 64, max_graphs: int = 16, backend: str = "cuda"):
        if backend not in ("cuda", "rerun"):
            raise ValueError(f"chunk graphs: backend {backend!r} (cuda, or rerun for tests)")
        if backend == "cuda" and not torch.cuda.is_available():
            raise ValueError("policy.cuda_graph: CUDA graphs need a CUDA device, and this machine has none")
        self.max_batch, self.max_graphs, self.backend = int(max_batch), int(max_graphs), backend
        self.graphs: dict[tuple, Captured] = {}
        self.disabled: str | None = None  # why every chunk runs eagerly from now on
        self.fingerprint: tuple[int, ...] | None = None
        self.captures = 0  # graphs captured, re-captures included
        self.fallbacks = 0  # chunks run eagerly
        self._pool = None
        self._said: set[str] = set()

    def say(self, message: str, level: int = logging.WARNING) -> None:
        """Log ``message`` the first time only."""
        if message not in self._said:
            self._said.add(message)
            log.log(level, "%s", message)

    def run(self, kind: str, fn: Callable, inputs: Sequence[torch.Tensor], fingerprint: tuple[int, ...]) -> list[torch.Tensor] | None:
        """``fn(*inputs)`` (a tuple of tensors, batch first) by replay; None: run it eagerly
        (the reason said once). ``fingerprint``: the storage of the weights ``fn`` reads."""
        if self.disabled is not None:
            self.fallbacks += 1
            return None
        rows = int(inputs[0].shape[0])
        size = bucket(rows)
        if size > self.max_batch:
            self.say(f"cuda_graph: a batch of {rows} rows is above the captured sizes (at most {self.max_batch}); "
                     "such batches run eagerly")  # fmt: skip
            self.fallbacks += 1
            return None
        if fingerprint != self.fingerprint:
            if self.graphs:
                self.say("cuda_graph: the policy's tensors were replaced (moved or re-typed); its chunks are captured again",
                         logging.INFO)  # fmt: skip
            self.graphs.clear()
            self.fingerprint = fingerprint
        padded = [pad_rows(x, size) for x in inputs]
        key = (kind, size, tuple((tuple(x.shape[1:]), x.dtype, x.device) for x in padded))
        graph = self.graphs.get(key)
        if graph is None:
            if len(self.graphs) >= self.max_graphs:
                self.say(f"cuda_graph: {self.max_graphs} shapes captured already; a {kind} chunk of a new shape "
                         f"(batch {size}, inputs {[tuple(x.shape) for x in padded]}) runs eagerly")  # fmt: skip
                self.fallbacks += 1
                return None
            try:
                graph = Captured(fn, padded, self.backend, self._pool)
            except torch.OutOfMemoryError:
                raise  # the caller's to answer (the rollout server halves its batch)
            except Exception as err:  # noqa: BLE001 - an op a graph cannot hold: eager from now on
                if "out of memory" in str(err).lower():  # an OOM the capture's exit reported as its own error
                    raise torch.OutOfMemoryError(f"capturing the {kind} chunk: {err}") from err
                self.disabled = f"{type(err).__name__}: {err}"
                log.warning("cuda_graph: capturing the %s chunk failed (%s); this policy acts eagerly from now on",
                            kind, self.disabled, exc_info=log.isEnabledFor(logging.DEBUG))  # fmt: skip
                self.fallbacks += 1
                return None
            self._pool = self._pool if self._pool is not None else graph.pool
            self.graphs[key] = graph
            self.captures += 1
            log.info("cuda_graph: captured the %s chunk for batches of %d (prompt, images: %s)",
                     kind, size, [tuple(x.shape[1:]) for x in padded[1:]])  # fmt: skip
        return graph.replay(padded, rows)


def storage_fingerprint(module: torch.nn.Module) -> tuple[int, ...]:
    """Where every parameter and buffer of ``module`` lives (a graph reads those addresses)."""
    return tuple(t.data_ptr() for t in module.parameters()) + tuple(t.data_ptr() for t in module.buffers())


def refuse_unusable_graphs(policy, device: torch.device) -> None:
    """Where a policy will act on ``device``: ``policy.cuda_graph=on`` off a GPU is refused
    now, by name, rather than at the first chunk."""
    chunk_graphs = getattr(policy, "chunk_graphs", None)
    if chunk_graphs is not None:
        with torch.no_grad():
            chunk_graphs(torch.device(device))
