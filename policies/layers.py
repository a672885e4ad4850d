"""Building blocks: ensemble linear layers and batch renormalisation (CrossQ)."""

from __future__ import annotations

import math

import torch
from torch import nn


class EnsembleLinear(nn.Module):
    """``E`` independent linear layers applied in one batched matmul.

    Input ``(B, in)`` (shared by all members) or ``(E, B, in)``; output ``(E, B, out)``.
    """

    def __init__(self, ensemble: int, in_features: int, out_features: int):
        super().__init__()
        self.ensemble = ensemble
        self.weight = nn.Parameter(torch.empty(ensemble, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(ensemble, 1, out_features))
        bound = 1.0 / math.sqrt(in_features)
        for e in range(ensemble):
            nn.init.kaiming_uniform_(self.weight.data[e].T, a=math.sqrt(5))
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.ensemble, -1, -1)
        return torch.baddbmm(self.bias, x, self.weight)


class BatchRenorm(nn.Module):
    """Batch renormalisation (Ioffe 2017) over the batch axis of ``(..., B, F)`` inputs.

    Used by CrossQ critics. ``leading`` is the shape of any leading ensemble axes, each of
    which keeps its own statistics. Before ``warmup_steps`` it behaves as plain batch norm.
    """

    def __init__(
        self,
        features: int,
        leading: tuple[int, ...] = (),
        momentum: float = 0.01,
        eps: float = 1e-5,
        r_max: float = 3.0,
        d_max: float = 5.0,
        warmup_steps: int = 10_000,
    ):
        super().__init__()
        shape = (*leading, 1, features)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.momentum, self.eps = momentum, eps
        self.r_max, self.d_max, self.warmup = r_max, d_max, warmup_steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            mean = x.mean(dim=-2, keepdim=True)
            var = x.var(dim=-2, keepdim=True, unbiased=False)
            std = (var + self.eps).sqrt()
            # renormalised past the warm-up, plain batch norm before it: r = 1, d = 0 (chosen
            # on the device, so a captured update reads nothing back to the host)
            running_std = (self.running_var + self.eps).sqrt()
            renorm = self.steps >= self.warmup
            r = torch.where(renorm, (std.detach() / running_std).clamp(1 / self.r_max, self.r_max), 1.0)
            d = torch.where(renorm, ((mean.detach() - self.running_mean) / running_std).clamp(-self.d_max, self.d_max), 0.0)
            xhat = (x - mean) / std * r + d
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(var, self.momentum)
                self.steps += 1
        else:
            xhat = (x - self.running_mean) / (self.running_var + self.eps).sqrt()
        return xhat * self.weight + self.bias
