"""``policy=openpi_remote`` against a websocket server that speaks openpi's policy-server
wire format (metadata frame first, msgpack observations and actions with numpy arrays as
``__ndarray__`` maps, errors as a text frame then close 1011), written here independently
of the client."""

import threading

import msgpack
import numpy as np
import pytest
import torch

from rlinf_user.config.compose import compose_config
from rlinf_user.env.spec import EnvSpec, obs_to_torch
from rlinf_user.policies.base import build_policy
from rlinf_user.policies.openpi_client import OpenpiServerError, packb, unpackb

SPEC = EnvSpec(state_dim=8, cameras={"front": (24, 32), "wrist": (16, 16)}, instruction=True)


def server_decode(data: bytes):
    def hook(m):
        if m.get(b"__ndarray__"):
            return np.frombuffer(m[b"data"], dtype=m[b"dtype"]).reshape(m[b"shape"])
        return m

    return msgpack.unpackb(data, object_hook=hook)


def server_encode(obj) -> bytes:
    def default(a):
        return {b"__ndarray__": True, b"data": a.tobytes(), b"dtype": a.dtype.str, b"shape": list(a.shape)}

    return msgpack.packb(obj, default=default)


@pytest.fixture(scope="module")
def server():
    """An openpi-style server: chunk t of 10 = state[:8] * 0.1 * (t + 1); 'fail' as the
    prompt makes it answer with a traceback; 'short' with a 2-step chunk."""
    from websockets.sync.server import serve

    seen = []

    def handler(ws):
        ws.send(server_encode({"reset_pose": [0.0, 1.0]}))
        for frame in ws:
            obs = server_decode(frame)
            seen.append(obs)
            if obs.get("prompt") == "fail":
                ws.send("Traceback (most recent call last):\n  ValueError: bad image")
                ws.close(1011, "internal error")
                return
            n = 2 if obs.get("prompt") == "short" else 10
            state = obs["observation/state"].astype(np.float32)
            actions = np.stack([state[:8] * 0.1 * (t + 1) for t in range(n)])
            ws.send(server_encode({"actions": actions, "policy_timing": {"infer_ms": 1.0}}))

    srv = serve(handler, "127.0.0.1", 0, compression=None, max_size=None)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"ws://127.0.0.1:{srv.socket.getsockname()[1]}", seen
    srv.shutdown()


def obs(b=2, prompts=("pick up the cube", "push it")):
    rng = np.random.default_rng(0)
    return obs_to_torch({
        "state": rng.normal(size=(b, 8)).astype(np.float32),
        "images": {"front": rng.integers(0, 255, (b, 24, 32, 3), dtype=np.uint8), "wrist": rng.integers(0, 255, (b, 16, 16, 3), dtype=np.uint8)},
        "instruction": np.array(list(prompts)[:b]),
    })  # fmt: skip


def remote(url, *extra):
    return build_policy(compose_config(["policy=openpi_remote", f"policy.server={url}", *extra]).policy, SPEC)


def test_the_wire_format_round_trips_with_an_independent_codec():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = server_decode(packb({"x": a, "u": np.zeros((2, 2, 3), np.uint8), "s": "text"}))
    np.testing.assert_array_equal(back["x"], a)
    assert back["u"].dtype == np.uint8 and back["s"] == "text"
    np.testing.assert_array_equal(unpackb(server_encode({"actions": a}))["actions"], a)


# this server answers 8 columns for the 7 actions, up to 1.0 x state (beyond [-1, 1])
LENIENT = ("policy.surplus_actions=drop", "policy.out_of_range=clip")


def test_acts_with_the_servers_chunks_and_sends_the_mapped_observation(server):
    url, seen = server
    p = remote(url, *LENIENT)
    o = obs()
    out = p.act(o)
    assert out.actions.shape == (2, 10, 7) and p.horizon == 10
    expected = np.stack([o["state"][0].numpy()[:7] * 0.1 * (t + 1) for t in range(10)]).clip(-1, 1)
    np.testing.assert_allclose(out.actions[0].numpy(), expected, rtol=1e-6)
    req = seen[-1]  # the second row's request: each key as the config maps it
    assert set(req) == {"observation/image", "observation/wrist_image", "observation/state", "prompt"}
    assert req["observation/image"].shape == (24, 32, 3) and req["observation/image"].dtype == np.uint8
    assert req["prompt"] == "push it" and req["observation/wrist_image"].shape == (16, 16, 3)
    assert remote(url, "policy.horizon=4", *LENIENT).act(obs(1)).actions.shape == (1, 4, 7)
    assert p.client.metadata == {"reset_pose": [0.0, 1.0]}


def test_server_errors_and_bad_replies_are_reported(server):
    url, _ = server
    with pytest.raises(OpenpiServerError, match=f"the openpi server at {url} failed: ValueError: bad image") as err:
        remote(url).act(obs(1, ["fail"]))
    assert err.value.details.startswith("Traceback (most recent call last)")  # the whole traceback, for the log
    with pytest.raises(OpenpiServerError, match=r"returned actions of shape \(2, 8\); need \(4"):
        remote(url, "policy.horizon=4").act(obs(1, ["short"]))
    with pytest.raises(OpenpiServerError, match="no openpi policy server at ws://127.0.0.1:9"):
        remote("ws://127.0.0.1:9")
    with pytest.raises(ValueError, match="policy.request maps 'images.side'"):
        remote(url, "policy.request={observation/image: images.side}")
    with pytest.raises(ValueError, match="needs policy.server"):
        build_policy(compose_config(["policy=openpi_remote"]).policy, SPEC)
    with pytest.raises(OpenpiServerError, match="returned 8 action columns; this env takes 7"):
        remote(url).act(obs(1))
    with pytest.raises(OpenpiServerError, match=r"returned actions up to .* in size; the env's actions are in \[-1, 1\]"):
        remote(url, "policy.surplus_actions=drop", "policy.horizon=10").act(obs(1))
    assert torch.is_tensor(remote(url, *LENIENT).act(obs(1)).actions)


def test_a_request_for_what_the_env_lacks_is_refused_before_connecting():
    """No server runs here: the mapping is checked against the env first."""
    plain = EnvSpec(state_dim=8, cameras={"front": (24, 32)})
    with pytest.raises(ValueError, match="maps 'prompt' to the instruction, but the env gives none"):
        build_policy(compose_config(["policy=openpi_remote", "policy.server=ws://127.0.0.1:9",
                                     "policy.request={prompt: instruction, observation/state: state}"]).policy, plain)  # fmt: skip
    with pytest.raises(ValueError, match="policy.request value 'joints'"):
        build_policy(compose_config(["policy=openpi_remote", "policy.server=ws://127.0.0.1:9",
                                     "policy.request={observation/state: joints}"]).policy, plain)  # fmt: skip
    with pytest.raises(ValueError, match="policy.out_of_range='wrap': refuse or clip"):
        build_policy(compose_config(["policy=openpi_remote", "policy.server=ws://127.0.0.1:9",
                                     "policy.request={observation/state: state}", "policy.out_of_range=wrap"]).policy, plain)  # fmt: skip


def test_a_request_mapping_given_replaces_the_default_whole():
    """The default asks for a front and a wrist camera; a mapping on the command line (an env
    with one camera) must not keep the default's wrist key."""
    from rlinf_user.policies.openpi_remote import DEFAULT_REQUEST

    given = "policy.request={observation/image: images.base_camera, observation/state: state, prompt: instruction}"
    cfg = compose_config(["policy=openpi_remote", "policy.server=ws://gpu-box:8000", given], sim="maniskill")
    assert dict(cfg.policy.request) == {"observation/image": "images.base_camera", "observation/state": "state",
                                        "prompt": "instruction"}  # fmt: skip
    default = compose_config(["policy=openpi_remote"], sim="maniskill").policy
    assert default.request is None and "observation/wrist_image" in DEFAULT_REQUEST
