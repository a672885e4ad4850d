"""What the edge control loop drives: an arm (through the safety filter) or a simulator.

A backend is owned by the control-loop process. Each tick the loop calls ``observe()``;
when a command arrives it calls ``apply(action)`` once. A simulator served this way is
stepped in real time at the loop's rate, so the training side cannot tell it from a
robot.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import time
from typing import Any

import numpy as np

from rlinf_user.edge.ratelimit import LogThrottle
from rlinf_user.edge.safety import Breach, SafetyConfig, SafetyFilter
from rlinf_user.robots.arm import PROPRIO_NAMES, ArmDriver, ArmError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Tick:
    """One observation of the backend at a control tick (``stamp`` on ``time.monotonic``)."""

    state: np.ndarray
    stamp: float
    images: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    image_stamps: dict[str, float] = dataclasses.field(default_factory=dict)
    reward: float | None = None  # None: the task on the training side computes it
    terminated: bool = False
    success: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class EdgeBackend(abc.ABC):
    kind = "robot"

    @abc.abstractmethod
    def spec(self) -> dict[str, Any]:
        """``state_dim``, ``state_names``, ``cameras`` {name: [H, W]}, ``action`` spec, ``kind``."""

    @abc.abstractmethod
    def reset(self, seed: int | None, options: dict[str, Any]) -> Tick: ...

    @abc.abstractmethod
    def apply(self, action: np.ndarray) -> list[Breach]:
        """Apply one policy action now (raise ``UnsafeCommand`` to refuse it)."""

    @abc.abstractmethod
    def observe(self) -> Tick: ...

    @abc.abstractmethod
    def hold(self) -> None: ...

    def stop(self) -> None:
        self.hold()

    def close(self) -> None:  # noqa: B027 - optional hook, most backends have nothing to release
        pass

    def telemetry(self) -> dict[str, Any]:
        return {}


class ArmBackend(EdgeBackend):
    """An arm driver behind the safety filter. Rewards come from the training-side task."""

    def __init__(self, driver: ArmDriver, safety: SafetyConfig, description: str = "arm"):
        self.driver = driver
        self.safety = SafetyFilter(safety)
        self.description = description
        self.recoveries = 0
        self.box_events = LogThrottle(log, interval_s=5.0)
        self.driver.connect()

    def spec(self) -> dict[str, Any]:
        cfg = self.safety.cfg
        return {
            "kind": "robot",
            "description": self.description,
            "state_dim": len(PROPRIO_NAMES),
            "state_names": list(PROPRIO_NAMES),
            "cameras": {},
            "action": {
                "frame": "base",
                "max_translation": cfg.max_translation,
                "max_rotation": cfg.max_rotation,
                "active": [True] * 7,
                "target_mode": cfg.target_mode,
            },
            "workspace": [list(cfg.workspace_low), list(cfg.workspace_high)],
            "versions": self.driver.versions(),
        }

    def reset(self, seed: int | None, options: dict[str, Any]) -> Tick:
        """``options["home"]`` (default True): move to the reset pose. False starts the
        next episode where the arm is (held), e.g. a new goal for a reaching task."""
        try:
            current = self.driver.read()
            fault = current.error
        except ArmError as err:  # the link dropped (e.g. libfranka's UDP timeout)
            current, fault = None, str(err)
        if fault:  # a reflex or fault ended the last episode: recover first
            log.warning("arm reports %r: automatic error recovery", fault)
            self.recoveries += 1
            if not self.driver.recover():
                raise ArmError(f"the arm is in error ({fault}) and recovery failed: "
                               "check the robot (Desk) and reset again")  # fmt: skip
        elif options.get("home", True) is False and self.safety.home is not None:
            self.hold()
            return self._tick(self.driver.read())
        state = self.driver.home()
        self.safety.set_home(state.tcp_quaternion)
        self.safety.gripper_closed = False
        return self._tick(state)

    def apply(self, action: np.ndarray) -> list[Breach]:
        state = self.driver.read()
        command, breaches = self.safety.command(action, state)
        self.driver.track(command)
        return breaches

    def observe(self) -> Tick:
        """Read the arm; a measured TCP outside the workspace box is held back inside."""
        state = self.driver.read()
        tick = self._tick(state)
        event = self.safety.check_measured(state)
        if event is not None:
            self.box_events.warn("box exit", "safety box_exit: %s", event.detail)
            if not state.error:
                self.driver.track(self.safety.hold_inside(state))
            tick.info["safety"] = ["box_exit"]
        return tick

    def _tick(self, state) -> Tick:
        info = {"error": state.error} if state.error else {}
        return Tick(state.proprio(), state.stamp, info=info)

    def hold(self) -> None:
        self.driver.hold()
        self.safety.restart()

    def stop(self) -> None:
        self.driver.stop()

    def close(self) -> None:
        self.driver.close()

    def telemetry(self) -> dict[str, Any]:
        return {"safety": dict(self.safety.counts), "recoveries": self.recoveries,
                "box_worst_exit_mm": self.safety.worst_exit * 1e3, "target_mode": self.safety.cfg.target_mode}  # fmt: skip


class SimBackend(EdgeBackend):
    """A contract simulator stepped by the control loop: ``apply`` steps it once."""

    kind = "sim"

    def __init__(self, env, description: str = "sim"):
        from rlinf_user.edge.safety import SafetyFilter

        self.env = env
        self.description = description
        self.checker = SafetyFilter(SafetyConfig())
        self._last: Tick | None = None

    def spec(self) -> dict[str, Any]:
        env = self.env
        cams = {k: list(v.shape[:2]) for k, v in env.observation_space["images"].spaces.items()}
        a = env.action_spec
        return {
            "kind": "sim",
            "description": self.description,
            "state_dim": int(env.observation_space["state"].shape[0]),
            "state_names": [],
            "cameras": cams,
            "action": {
                "frame": a.frame,
                "max_translation": a.max_translation,
                "max_rotation": a.max_rotation,
                "active": list(a.active),
            },
            "max_episode_steps": int(env.max_episode_steps),
        }

    def _from(self, obs, reward=None, terminated=False, info=None) -> Tick:
        info = dict(info or {})
        success = bool(info.pop("success", False))
        stamps = obs["timestamps"]
        return Tick(
            obs["state"],
            time.monotonic(),
            dict(obs["images"]),
            {k: time.monotonic() for k in obs["images"]} if stamps else {},
            None if reward is None else float(reward),
            bool(terminated),
            success,
            {k: v for k, v in info.items() if isinstance(v, (bool, int, float, str))},
        )

    def reset(self, seed: int | None, options: dict[str, Any]) -> Tick:
        obs, info = self.env.reset(seed=seed)
        self._last = self._from(obs, 0.0, False, info)
        return self._last

    def apply(self, action: np.ndarray) -> list[Breach]:
        a, breaches = self.checker.check_action(action)
        obs, reward, terminated, _truncated, info = self.env.step(a.astype(np.float32))
        self._last = self._from(obs, reward, terminated, info)
        return breaches

    def observe(self) -> Tick:
        if self._last is None:
            raise RuntimeError("observe before reset")
        return self._last

    def hold(self) -> None:  # a simulator that is not stepped holds still
        pass

    def close(self) -> None:
        self.env.close()

    def telemetry(self) -> dict[str, Any]:
        return {"safety": dict(self.checker.counts)}
