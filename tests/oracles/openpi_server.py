"""A policy server that behaves as openpi's ``WebsocketPolicyServer`` is documented to, for
the openpi client's tests; it encodes with ``openpi_client.msgpack_numpy`` itself.

Runs in an interpreter whose path holds ``.openpi-pkgs`` first (openpi-client 0.1.2 and the
numpy<2 it pins: ``scripts/install_openpi_env.sh``). openpi's own server module is not on
PyPI (it lives in the openpi repository beside JAX and a patched transformers), so the
protocol is followed here from its documentation and the client package:

* ``GET /healthz`` answers 200 ``OK`` over plain HTTP;
* on connect: one binary frame, the metadata (msgpack);
* per request: msgpack observation in, msgpack action dict out (``actions`` ``(H, A)`` plus
  ``server_timing``);
* an exception in the policy: its traceback as a text frame, then close with 1011.

The policy is a scripted expert for the reach sim (state = TCP, goal, goal - TCP): a chunk
of ``--horizon`` steps that walks to the goal at ``--max-translation`` metres per unit
action. Misbehaviour on purpose: ``--mode silent`` (accepts, never sends metadata),
``hang`` (stops answering after ``--after`` requests), ``fail`` (raises after ``--after``
requests), ``exit`` (the process exits after ``--after`` requests, as a crash or a
restart does); ``--columns`` pads the action dim, ``--scale`` multiplies the actions.
``--steerable`` serves the expert as ``scripts/serve_openpi_steerable.py`` serves an openpi
policy (its ``NoiseFromRequest`` wrapper, unchanged): the expert's ``infer(obs, noise=)``
adds ``NOISE_GAIN`` x the noise ``(horizon, columns)`` to its chunk, so a client's noise is
visible in the actions it gets back.

    python tests/oracles/openpi_server.py --port 0   # prints "ready <port>" when listening
"""

from __future__ import annotations

import argparse
import asyncio
import http
import os
import sys
import time
import traceback

import numpy as np
import websockets
import websockets.asyncio.server as ws_server
import websockets.frames
from openpi_client import msgpack_numpy


def expert(obs: dict, horizon: int, max_translation: float, columns: int, scale: float) -> np.ndarray:
    state = np.asarray(obs["observation/state"], np.float64)
    tcp, goal = state[:3].copy(), state[3:6]
    rows = []
    for _ in range(horizon):
        a = np.clip((goal - tcp) / max_translation, -1.0, 1.0)
        tcp += a * max_translation
        rows.append(a)
    actions = np.asarray(rows, np.float32) * scale
    if columns > actions.shape[1]:
        actions = np.concatenate([actions, np.zeros((horizon, columns - actions.shape[1]), np.float32)], axis=1)
    return actions


NOISE_GAIN = 0.25


class Expert:
    """The scripted expert with openpi's policy interface (``infer(obs, *, noise=None)``)."""

    def __init__(self, horizon: int, max_translation: float, columns: int, scale: float):
        self.args = (horizon, max_translation, columns, scale)
        self.metadata = {"server": "rlinf-user test oracle", "action_horizon": horizon}

    def infer(self, obs: dict, *, noise: np.ndarray | None = None) -> dict:
        actions = expert(obs, *self.args)
        if noise is not None:
            actions = np.clip(actions + NOISE_GAIN * noise, -1.0, 1.0).astype(np.float32)
        return {"actions": actions}


def _steerable(policy: Expert, horizon: int, columns: int):
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "serve_openpi_steerable.py")
    spec = importlib.util.spec_from_file_location("serve_openpi_steerable", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.NoiseFromRequest(policy, (horizon, columns))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--mode", choices=["normal", "silent", "hang", "fail", "exit"], default="normal")
    p.add_argument("--after", type=int, default=0, help="requests answered before the mode's misbehaviour")
    p.add_argument("--horizon", type=int, default=4)
    p.add_argument("--max-translation", type=float, default=0.02)
    p.add_argument("--columns", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--steerable", action="store_true")
    args = p.parse_args()
    served = 0
    policy = Expert(args.horizon, args.max_translation, args.columns, args.scale)
    if args.steerable:
        policy = _steerable(policy, args.horizon, args.columns)

    async def handler(ws: ws_server.ServerConnection) -> None:
        nonlocal served
        if args.mode == "silent":
            await asyncio.sleep(3600)
            return
        packer = msgpack_numpy.Packer()
        await ws.send(packer.pack(policy.metadata))
        while True:
            try:
                obs = msgpack_numpy.unpackb(await ws.recv())
                if served >= args.after and args.mode == "hang":
                    await asyncio.sleep(3600)
                if served >= args.after and args.mode == "exit":
                    os._exit(3)
                if served >= args.after and args.mode == "fail":
                    raise ValueError(f"the policy cannot take this observation (keys {sorted(obs)})")
                start = time.monotonic()
                reply = policy.infer(obs)
                served += 1
                reply["server_timing"] = {"infer_ms": 1000 * (time.monotonic() - start)}
                await ws.send(packer.pack(reply))
            except websockets.ConnectionClosed:
                break
            except Exception:
                await ws.send(traceback.format_exc())
                await ws.close(code=websockets.frames.CloseCode.INTERNAL_ERROR,
                               reason="Internal server error. Traceback included in previous frame.")  # fmt: skip
                raise

    def health(connection: ws_server.ServerConnection, request: ws_server.Request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        return None

    async def serve() -> None:
        async with ws_server.serve(handler, "127.0.0.1", args.port, compression=None, max_size=None,
                                   process_request=health) as server:  # fmt: skip
            port = server.sockets[0].getsockname()[1]
            print(f"ready {port}", flush=True)
            await server.serve_forever()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
