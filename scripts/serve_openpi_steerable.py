"""Serve an openpi checkpoint whose initial flow noise the client chooses (``algo=dsrl`` over
``policy=openpi_remote``).

openpi's ``Policy.infer(obs, noise=...)`` integrates its flow from a given initial noise
(``action_horizon x action_dim``, the model's own space: 50 x 32 for pi0), but openpi's
``WebsocketPolicyServer`` calls ``infer(obs)`` only. :class:`NoiseFromRequest` wraps the
policy so that a request's ``noise`` entry reaches ``infer`` as ``noise=`` (a request
without it samples as usual), and adds ``noise_shape`` to the metadata frame, which the
client checks against its ``policy.noise_shape``. Everything else is openpi's own server.

Run it in openpi's environment (it imports nothing from rlinf-user), as openpi's
``scripts/serve_policy.py``::

    uv run python <rlinf-user>/scripts/serve_openpi_steerable.py \\
        --config pi0_libero --dir gs://openpi-assets/checkpoints/pi0_libero --port 8000

then, on the training side::

    rlinf-user train --robot franka algo=dsrl policy=openpi_remote policy.server=ws://<gpu-box>:8000 \\
        'policy.noise_shape=[50,32]' 'policy.request={observation/state: state, ...}'
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import numpy as np


class NoiseFromRequest:
    """An openpi policy (``infer(obs, *, noise=None)``, ``metadata``) whose noise comes in
    the request under ``key``, checked against ``shape``."""

    def __init__(self, policy: Any, shape: tuple[int, int], key: str = "noise"):
        self.policy, self.shape, self.key = policy, (int(shape[0]), int(shape[1])), key

    def infer(self, obs: dict) -> dict:
        noise = obs.pop(self.key, None)
        if noise is None:
            return self.policy.infer(obs)
        noise = np.asarray(noise, np.float32)
        if noise.shape != self.shape:
            raise ValueError(f"request {self.key!r} has shape {noise.shape}; this policy's flow takes {self.shape}")
        if not np.isfinite(noise).all():
            raise ValueError(f"request {self.key!r} holds non-finite values")
        return self.policy.infer(obs, noise=noise)

    @property
    def metadata(self) -> dict:
        return {**(getattr(self.policy, "metadata", None) or {}), "noise_shape": list(self.shape)}


def main() -> None:  # pragma: no cover - needs openpi (JAX or PyTorch) and a checkpoint
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="openpi training config name (pi0_libero, pi05_droid, ...)")
    p.add_argument("--dir", required=True, help="the checkpoint directory (local or gs://)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--default-prompt", default=None)
    p.add_argument("--noise-key", default="noise")
    args = p.parse_args()
    from openpi.policies import policy_config
    from openpi.serving import websocket_policy_server
    from openpi.training import config as openpi_config

    train_config = openpi_config.get_config(args.config)
    policy = policy_config.create_trained_policy(train_config, args.dir, default_prompt=args.default_prompt)
    shape = (train_config.model.action_horizon, train_config.model.action_dim)
    steerable = NoiseFromRequest(policy, shape, args.noise_key)
    logging.info("serving %s with noise %s from requests' %r", args.config, shape, args.noise_key)
    websocket_policy_server.WebsocketPolicyServer(policy=steerable, host="0.0.0.0", port=args.port,
                                                  metadata=steerable.metadata).serve_forever()  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    logging.basicConfig(level=logging.INFO, force=True)
    main()
