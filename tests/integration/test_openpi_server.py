"""``rlinf-user eval ... policy=openpi_remote`` against an openpi-style policy server in a
process of its own, encoding with openpi-client's own ``msgpack_numpy``
(``tests/oracles/openpi_server.py``, its packages from ``scripts/install_openpi_env.sh``):
the way a real server succeeds, fails, hangs, restarts or is not there at all, each ending in
a finished evaluation or one ``error:`` line, with the finished episodes kept."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from side_envs import wait_for_side_envs

from rlinf_user.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PKGS = ROOT / ".openpi-pkgs"
SERVER = ROOT / "tests" / "oracles" / "openpi_server.py"

pytestmark = pytest.mark.side_env


@pytest.fixture(autouse=True)
def _openpi_client_installed(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # the console's lines unwrapped, as a wide terminal shows them
    wait_for_side_envs()
    if not (PKGS / "openpi_client").is_dir():
        pytest.skip("openpi-client not installed (bash scripts/install_openpi_env.sh)")


class Server:
    """The oracle server process; ``port`` once it says it is listening."""

    def __init__(self, *args: str, port: int = 0):
        env = {**os.environ, "PYTHONPATH": str(PKGS)}
        self.proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port), *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            self.proc.kill()
            raise AssertionError(f"the oracle server did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.port = int(line.split()[1])
        self.url = f"ws://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def serve():
    started: list[Server] = []

    def start(*args: str, port: int = 0) -> Server:
        started.append(Server(*args, port=port))
        return started[-1]

    yield start
    for s in started:
        s.close()


def evaluate(capsys, tmp_path: Path, url: str, *extra: str, episodes: int = 10) -> tuple[int, str, dict | None]:
    """``rlinf-user eval --sim reach`` of the server's policy: exit status, stderr, eval.json."""
    out = tmp_path / "eval"
    rc = main(["eval", "--sim", "reach", "policy=openpi_remote", f"policy.server={url}",
               "policy.request={observation/state: state}", "--episodes", str(episodes), "--video-episodes", "0",
               "--out", str(out), "eval_envs=1", *extra])  # fmt: skip
    err = capsys.readouterr().err
    path = out / "eval.json"
    return rc, err, json.loads(path.read_text()) if path.exists() else None


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def test_the_readme_command_runs_against_the_server_with_overrides_after_out(serve, capsys, tmp_path):
    """The request given replaces the default (no cameras, no instruction on reach), and a
    key=value after --out is taken. The scripted expert succeeds in every episode."""
    s = serve("--horizon", "4")
    rc, err, result = evaluate(capsys, tmp_path, s.url)
    assert rc == 0, err
    assert result["complete"] and result["episodes"] == 10 and result["success_rate"] == 1.0, result
    assert result["distinct_initial_states"] == 10 and result["horizon"] == 4 and not result["interrupted"]


def test_a_failing_server_ends_in_one_error_line_and_the_finished_episodes_are_kept(serve, capsys, tmp_path):
    s = serve("--mode", "fail", "--after", "12")
    rc, err, result = evaluate(capsys, tmp_path, s.url)
    assert rc == 1 and "Traceback" not in err, err
    (line,) = error_lines(err)
    assert s.url in line and "ValueError: the policy cannot take this observation" in line, line
    assert result["complete"] is False and 1 <= result["episodes"] < 10 and result["success_rate"] == 1.0, result
    log = (tmp_path / "eval" / "eval.log").read_text()
    assert "Traceback (most recent call last)" in log and "raise ValueError" in log


@pytest.mark.parametrize(
    ("mode", "extra", "said"),
    [("silent", "policy.timeouts.metadata_s=1", "sent no metadata within 1 s"),
     ("hang", "policy.timeouts.infer_s=1", "did not answer an inference within 1 s")],
    ids=["no-metadata", "infer-hangs"],
)  # fmt: skip
def test_a_server_that_never_answers_times_out(serve, capsys, tmp_path, mode, extra, said):
    s = serve("--mode", mode)
    rc, err, _ = evaluate(capsys, tmp_path, s.url, extra)
    assert rc == 1 and "Traceback" not in err, err
    (line,) = error_lines(err)
    assert said in line and s.url in line, line


class WebApp(http.server.BaseHTTPRequestHandler):
    """Some other service on the port: HTTP/1.1, 404 for every path."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 - http.server's name
        body = b"not found"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_an_http_server_on_the_port_is_named_as_not_a_policy_server(capsys, tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WebApp)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        rc, err, _ = evaluate(capsys, tmp_path, f"ws://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
    assert rc == 1 and "Traceback" not in err, err
    (line,) = error_lines(err)
    assert "answered HTTP 404, not a websocket handshake" in line and "openpi policy server" in line, line
    with socket.socket() as sock:  # and a port where nothing listens
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    rc, err, _ = evaluate(capsys, tmp_path, f"ws://127.0.0.1:{free}")
    assert rc == 1 and f"no openpi policy server at ws://127.0.0.1:{free}" in error_lines(err)[0], err


def test_a_restarted_server_is_reconnected_and_the_evaluation_goes_on(serve, capsys, tmp_path):
    """The server exits after 12 answers (a crash or a restart) and comes back on its port:
    the episode in flight ends truncated and runs again, and every episode is evaluated."""
    first = serve("--mode", "exit", "--after", "12")
    again: list[Server] = []

    def restart() -> None:
        first.proc.wait()
        again.append(serve(port=first.port))

    watcher = threading.Thread(target=restart, daemon=True)
    watcher.start()
    rc, err, result = evaluate(capsys, tmp_path, first.url)
    watcher.join(timeout=30)
    assert rc == 0, err
    assert result["complete"] and result["episodes"] == 10 and result["success_rate"] == 1.0, result
    assert len(result["interrupted"]) == 1 and result["distinct_initial_states"] == 10, result
    lost = result["interrupted"][0]
    assert lost["episode"] in [r["episode"] for r in result["per_episode"]]  # run again in full


def test_a_server_gone_for_good_stops_with_what_was_finished(serve, capsys, tmp_path):
    s = serve("--mode", "exit", "--after", "12")
    rc, err, result = evaluate(capsys, tmp_path, s.url, "policy.timeouts.reconnect_s=2")
    assert rc == 1 and "Traceback" not in err, err
    (line,) = error_lines(err)
    assert "did not come back within 2 s" in line and "finished episodes kept in" in line, line
    assert result["complete"] is False and 1 <= result["episodes"] < 10, result


@pytest.mark.parametrize(
    ("args", "refused", "allowed"),
    [(["--columns", "5"], "returned 5 action columns; this env takes 3", "policy.surplus_actions=drop"),
     (["--scale", "3"], "returned actions up to 3 in size", "policy.out_of_range=clip")],
    ids=["surplus-columns", "out-of-range"],
)  # fmt: skip
def test_surplus_or_out_of_range_actions_are_refused_unless_configured(serve, capsys, tmp_path, args, refused, allowed):
    s = serve(*args)
    rc, err, _ = evaluate(capsys, tmp_path, s.url, episodes=2)
    assert rc == 1 and refused in error_lines(err)[0], err
    rc, err, result = evaluate(capsys, tmp_path, s.url, allowed, episodes=2)
    assert rc == 0 and result["episodes"] == 2, err


def _steered_cfg(url: str, *extra: str):
    from rlinf_user.config.compose import compose_config

    return compose_config(["algo=dsrl", "policy=openpi_remote", f"policy.server={url}",
                           "policy.request={observation/state: state}", "policy.noise_shape=[4,3]",
                           "algo.noise_hidden=[32,32]", *extra], sim="reach")  # fmt: skip


def test_a_served_flow_is_steered_through_the_noise_it_is_sent(serve):
    """algo=dsrl over policy=openpi_remote: the noise the steered policy chooses travels in each
    request to a server wrapped as scripts/serve_openpi_steerable.py wraps openpi's policy,
    and comes back in the actions (the oracle adds NOISE_GAIN x noise to its expert's chunk)."""
    import numpy as np
    import torch

    from rlinf_user.config.compose import validate
    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import Col, EnvSpec, obs_to_torch, stack_obs
    from rlinf_user.policies.base import build_policy

    s = serve("--steerable", "--horizon", "4")
    cfg = _steered_cfg(s.url)
    validate(cfg)  # no base_checkpoint: the weights are the server's
    env = make_env(cfg.env, seed=0)
    spec = EnvSpec.of_env(env)
    obs = obs_to_torch(stack_obs([env.reset(seed=k)[0] for k in range(3)]))
    env.close()
    steered = build_policy(cfg.policy, spec)
    base = steered.base
    assert base._client is None  # built for its shapes (as the learner does): not connected yet
    try:
        plain = base.act(obs).actions
        noise = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (3, 4, 3)), dtype=torch.float32)
        torch.testing.assert_close(base.act_from_noise(obs, noise), (plain + 0.25 * noise).clamp(-1, 1))
        torch.testing.assert_close(base.act_from_noise(obs, torch.zeros(3, 4, 3)), plain)
        out = steered.act(obs)
        u = out.extras[Col.NOISE]
        assert u.shape == (3, 12) and out.actions.shape == (3, 4, 3)
        torch.testing.assert_close(out.actions, (plain + 0.25 * 1.5 * u.view(3, 4, 3)).clamp(-1, 1))
    finally:
        base.close()


def test_a_server_that_takes_no_noise_or_another_shape_is_refused_when_first_used(serve):
    from omegaconf import OmegaConf

    from rlinf_user.config.compose import ConfigError, validate
    from rlinf_user.env.registry import make_env
    from rlinf_user.env.spec import EnvSpec
    from rlinf_user.policies.base import build_policy
    from rlinf_user.policies.openpi_client import OpenpiServerError

    env = make_env(_steered_cfg("ws://unused:1").env, seed=0)
    spec = EnvSpec.of_env(env)
    env.close()

    def connected(url):  # the served base as the env worker's first act connects it
        return build_policy(OmegaConf.merge(_steered_cfg(url).policy.base, {"connect": "now"}), spec)

    plain = serve("--horizon", "4")
    with pytest.raises(OpenpiServerError, match=r"takes no noise \(start it with scripts/serve_openpi_steerable.py\)"):
        connected(plain.url)
    other = serve("--steerable", "--horizon", "8")
    with pytest.raises(OpenpiServerError, match=r"policy.noise_shape=\[4, 3\], but .* takes noise of shape \[8, 3\]"):
        connected(other.url)
    with pytest.raises(ConfigError, match="needs policy.noise_shape"):
        validate(_steered_cfg(plain.url, "policy.noise_shape=null"))
