"""A robot (or served simulator) behind the edge daemon, as a contract env.

``step`` sends one action and returns the observation the daemon takes at the next
control tick, so a step lasts one control period: the robot sets the pace. Reward and
success come from the training-side task (:mod:`rlinf_user.env.tasks`).

Network drops: a step that gets no reply in ``edge.timeout_s`` ends the episode as
*truncated* with ``info["edge_lost"] = True`` and the last good observation, so the
transitions collected so far stay valid; the next ``reset`` reconnects (retrying for
``edge.reconnect_s``) before homing the robot. The daemon holds the robot meanwhile.
"""

from __future__ import annotations

import io
import logging
import time
from typing import Any

import numpy as np
from gymnasium.envs.registration import EnvSpec

from rlinf_user.edge.client import EdgeClient, EdgeRefused, EdgeTimeout
from rlinf_user.edge.protocol import Message
from rlinf_user.env.base import ContractEnv
from rlinf_user.env.contract import ActionSpec, check_action, make_observation
from rlinf_user.env.tasks import make_task
from rlinf_user.netem import EmulatedLink, LinkSpec

log = logging.getLogger(__name__)


class EdgeUnavailableError(RuntimeError):
    pass


def _decode_jpeg(buf: np.ndarray) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(buf.tobytes())).convert("RGB"))


class RemoteRobotEnv(ContractEnv):
    def __init__(self, client: EdgeClient, task: str, task_options: dict[str, Any],
                 cameras: list[str], max_episode_steps: int, seed: int | None = None,
                 hello_timeout_s: float = 10.0, reconnect_s: float = 60.0,
                 stream_chunks: bool = False, lookahead_s: float = 0.3, blend: int = 2):  # fmt: skip
        self.client = client
        self.stream_chunks, self.blend = bool(stream_chunks), int(blend)
        self._streaming = False  # an observed chunk is running: steps read its observations
        self._applied: np.ndarray | None = None  # what the robot ran at the current obs' tick
        self._tick: int | None = None  # the control tick of the current observation
        self.stream_gaps = 0  # streamed observations that did not follow their predecessor's tick
        task_options = dict(task_options)
        # home the robot every N-th reset only (others start where the arm is): resets are
        # the slow part of real-robot data collection
        self.home_every = max(1, int(task_options.pop("home_every", 1)))
        self._resets = 0
        self.reconnect_s = reconnect_s
        self.link: EmulatedLink | None = None  # an emulated long link to the daemon, if configured
        self.max_episode_steps = int(max_episode_steps)
        self._rng = np.random.default_rng(seed)
        try:
            spec = client.hello(timeout_s=hello_timeout_s)
        except EdgeTimeout as err:
            client.close(say_bye=False)
            raise EdgeUnavailableError(
                f"no edge daemon answered at {client.host}:{client.port} within "
                f"{hello_timeout_s:.0f} s: is `rlinf-user edge` running on the robot PC, and are "
                "env.edge.host/port right?"
            ) from err
        except Exception:
            client.close(say_bye=False)
            raise
        self.edge_spec = spec
        # a physical robot (and a served sim on the wall clock) stamps real capture times:
        # the same seed and actions never give bit-identical observations
        self.spec = EnvSpec("rlinf-user/EdgeRobot-v0", nondeterministic=True,
                            max_episode_steps=self.max_episode_steps)  # fmt: skip
        self.task = make_task(task, spec, task_options)
        available = dict(spec.get("cameras") or {})
        missing = [c for c in cameras if c not in available]
        if missing:
            client.close()
            raise ValueError(f"edge has no camera(s) {missing}; it serves {sorted(available)}")
        self.camera_names = list(cameras)
        a = spec["action"]
        active = tuple(bool(x) for x in a["active"])
        if self.task.active is not None:
            active = tuple(x and y for x, y in zip(active, self.task.active))
        self.action_spec = ActionSpec(a["frame"], a["max_translation"], a["max_rotation"], active)
        self.period = 1.0 / float(spec["control_hz"])
        # steps before a chunk runs out at which the next one is asked for (0: when it has)
        self.plan_lookahead = int(np.ceil(lookahead_s / self.period)) if self.stream_chunks else 0
        self.step_timeout_s = max(client.timeout_s, 5 * self.period)
        self._init_spaces(int(spec["state_dim"]) + self.task.extra_dim,
                          {c: tuple(available[c]) for c in self.camera_names})  # fmt: skip
        self._lost = False
        self._last_obs: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, cfg, seed=None):
        edge = cfg.edge
        if edge is None:
            raise ValueError("a robot env needs env.edge (host, port)")
        host, port, link = edge.host, int(edge.port), None
        spec = LinkSpec.from_config(edge.get("link"))
        if spec is not None:  # through an emulated long link living in this process
            # the controller's socket (the daemon's default, port + 2) travels the same link; a
            # daemon with another control_port is reached on its public port alone
            link = EmulatedLink(host, port, spec, offsets=(2,))
            host, port = link.host, link.port
        client = EdgeClient(
            host, port,
            server_public_key=edge.server_public_key, client_secret_key=edge.client_secret_key,
            timeout_s=float(edge.timeout_s), heartbeat_s=float(edge.heartbeat_s),
        )  # fmt: skip
        env = cls(client, cfg.task, dict(cfg.kwargs or {}), list(cfg.cameras),
                  cfg.max_episode_steps, seed, float(edge.hello_timeout_s),
                  float(edge.reconnect_s), bool(edge.get("stream_chunks", False)),
                  float(edge.get("lookahead_s", 0.3)), int(edge.get("blend", 2)))  # fmt: skip
        env.link = link
        return env

    @classmethod
    def validate_config(cls, env_cfg) -> None:
        if env_cfg.task not in ("reach", "edge"):
            raise ValueError(f"robot task {env_cfg.task!r} unknown; available: reach, edge")
        if env_cfg.edge is not None:
            LinkSpec.from_config(env_cfg.edge.get("link"))  # names a bad key or value before anything starts

    # -- contract ------------------------------------------------------------------
    def _obs(self, msg: Message) -> dict[str, Any]:
        state = np.asarray(msg.arrays["state"], dtype=np.float32)
        images, stamps = {}, dict(msg.body.get("image_stamps") or {})
        for name in self.camera_names:
            if f"image/{name}" in msg.arrays:
                images[name] = np.array(msg.arrays[f"image/{name}"])
            elif f"jpeg/{name}" in msg.arrays:
                images[name] = _decode_jpeg(msg.arrays[f"jpeg/{name}"])
            else:
                raise EdgeRefused("camera", f"camera {name!r} sent no frame")
        images = self.task.draw(images, state)
        return make_observation(self.task.observe(state), images, float(msg.body["stamp"]), stamps)

    def _reconnect(self) -> None:
        deadline = time.monotonic() + self.reconnect_s
        attempt = 0
        while True:
            attempt += 1
            self.client.reconnect()
            try:
                self.client.hello(timeout_s=min(2.0, self.reconnect_s))
                log.info("reconnected to the edge daemon (attempt %d)", attempt)
                self._lost = False
                return
            except (EdgeTimeout, EdgeRefused) as err:
                # busy: without CURVE keys the daemon waits for the lost connection to go
                # silent (peer_timeout_s) before this client may take control again
                if isinstance(err, EdgeRefused) and err.code != "busy":
                    raise
                if time.monotonic() > deadline:
                    raise EdgeUnavailableError(
                        f"the edge daemon at {self.client.host}:{self.client.port} stayed "
                        f"unreachable for {self.reconnect_s:.0f} s"
                    ) from None
                log.warning("edge unreachable or busy, retrying (attempt %d)", attempt)
                time.sleep(0.2)

    def _take_control_and_reset(self, seed):
        """Control was lost (the daemon heard nothing from this client for its peer timeout, or
        another client took the robot meanwhile): say hello again until a reset is accepted,
        for up to ``reconnect_s``; another client in control ends it (its hello is refused
        as busy)."""
        deadline = time.monotonic() + self.reconnect_s
        attempt = 0
        while True:
            attempt += 1
            self.client.hello()
            try:
                return self.client.reset(seed, home=True)
            except EdgeRefused as err:
                if err.code != "not_controller" or time.monotonic() > deadline:
                    raise
                log.warning("the edge daemon refused the reset after hello (%s); asking for control again "
                            "(attempt %d)", err, attempt)  # fmt: skip
                time.sleep(0.2)

    def _reset(self, seed):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if self._lost:
            self._reconnect()
        home = self._resets % self.home_every == 0 or seed is not None
        self._resets += 1
        self._streaming = False
        self.client.end_stream()  # the reset ends the daemon's schedule and its stream
        try:
            msg = self.client.reset(seed, home=home)
        except EdgeTimeout:
            self._lost = True
            raise
        except EdgeRefused as err:
            if err.code != "not_controller":
                raise
            msg = self._take_control_and_reset(seed)
        self.task.reset(self._rng, msg.arrays["state"])
        self._last_obs = self._obs(msg)
        self._streaming, self._applied, self._tick = False, None, msg.body.get("tick")
        return self._last_obs, {"success": False}

    # -- chunks streamed to the edge ----------------------------------------------
    def plan(self, actions: np.ndarray) -> None:
        """Hand the daemon a chunk computed from the current observation: it runs action
        ``k`` at the ``k+1``-th tick after that observation's (actions already late are
        dropped there, the seam is blended) and streams every tick back, so the following
        :meth:`step` calls read what the robot did instead of commanding it."""
        if not self.stream_chunks or self._lost:
            return
        actions = np.stack([check_action(a) for a in actions])  # as step() takes each: finite, clipped
        try:
            ack = self.client.chunk(actions, start_tick=self._tick, blend=self.blend, observe=True,
                                    timeout_s=self.step_timeout_s)  # fmt: skip
        except (EdgeTimeout, EdgeRefused) as err:
            log.warning("chunk not taken by the edge (%s): stepping one action at a time", err)
            self._streaming = False
            return
        self._streaming = ack.body.get("queued", 0) > 0

    @property
    def streaming(self) -> bool:
        return self._streaming

    def unplan(self) -> None:
        """Steps command the robot again (a person took over): the next ``act`` replaces
        the daemon's schedule."""
        self._streaming = False
        self.client.end_stream()

    def _step(self, action):
        try:
            if self._streaming:
                msg = self.client.next_streamed(timeout_s=self.step_timeout_s)
            else:
                self.client.end_stream()
                msg = self.client.act(action, timeout_s=self.step_timeout_s)
        except (EdgeTimeout, EdgeRefused) as err:
            code = err.code if isinstance(err, EdgeRefused) else "timeout"
            if code not in ("timeout", "not_controller", "backend", "overloaded"):
                raise
            log.warning("edge lost mid-episode (%s): truncating the episode", err)
            # a robot fault or a busy loop keeps the connection: the next reset recovers on it
            self._lost = code in ("timeout", "not_controller")
            self._streaming = False
            return self._last_obs, 0.0, False, {"success": False, "edge_lost": True, "truncate": True}
        info = {}
        tick = msg.body.get("tick")
        if msg.body.get("stream") and self._tick is not None and tick is not None and tick != self._tick + 1:
            # ticks lost between the edge and here (a full socket queue dropped them): this
            # transition spans more than one control period, so it is flagged, and steps
            # command the robot one action at a time until the next chunk
            self.stream_gaps += 1
            info["stream_gap"] = int(tick - self._tick - 1)
            log.warning("streamed ticks %d-%d never arrived: stepping one action at a time until the next chunk",
                        self._tick + 1, tick - 1)  # fmt: skip
            self.client.end_stream()
            self._streaming = False
        if msg.body.get("stream"):
            # this obs ends the transition that began at the previous one, whose tick ran
            # ``self._applied`` (nothing: the robot held); this tick's action starts the next
            applied = self._applied if self._applied is not None else np.zeros(len(action), np.float32)
            info["applied_action"] = applied
            ran = msg.body.get("plan")
            self._applied = None if ran is None else np.asarray(ran["applied"], np.float32)
            if msg.body.get("dry"):
                self._streaming = False
        else:
            self._applied = None
        reward, terminated, success = self.task.evaluate(msg.arrays["state"], msg.body)
        self._last_obs = self._obs(msg)
        self._tick = tick
        info.update(success=success, edge_tick=self._tick)
        if msg.body.get("breaches"):
            info["safety"] = list(msg.body["breaches"])
        if msg.body.get("stale_cameras"):  # frames older than the edge's frame_max_age_s
            info["stale_cameras"] = list(msg.body["stale_cameras"])
        return self._last_obs, reward, terminated, info

    def telemetry(self) -> dict[str, Any]:
        return self.client.telemetry()

    def close(self):
        self.client.close()
        if self.link is not None:
            self.link.close()
