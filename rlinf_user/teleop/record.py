"""Recording demonstrations: a person drives the env with a teleop device, episodes are
written to a LeRobotDataset as they finish.

Episode controls (device buttons/keys): ``success`` and ``failure`` end and save the
episode with that outcome; ``rerecord`` throws the current episode away and resets;
``stop`` ends the session (the current, unfinished episode is discarded). An episode the
env ends itself (terminated/truncated) is saved with the env's success flag. A device
that disconnects mid-episode saves what was recorded (marked truncated, outcome
``device_lost``), holds the robot, and ends the session with a clear error.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlinf_user.data.lerobot_writer import LeRobotWriter
from rlinf_user.env.spec import Col
from rlinf_user.robots.teleop.command import DeviceDisconnected, TeleopCommand
from rlinf_user.robots.teleop.device import Teleop

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EpisodeResult:
    index: int | None  # dataset episode index (None: discarded)
    outcome: str  # success | failure | timeout | rerecord | stop | device_lost
    steps: int
    success: bool
    seconds: float


@dataclasses.dataclass
class SessionStats:
    episodes: list[EpisodeResult] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def saved(self) -> list[EpisodeResult]:
        return [e for e in self.episodes if e.index is not None]

    def summary(self) -> dict[str, Any]:
        saved = self.saved
        return {
            "episodes_saved": len(saved),
            "successes": sum(e.success for e in saved),
            "discarded": len(self.episodes) - len(saved),
            "frames": sum(e.steps for e in saved),
            "error": self.error,
        }


def frame_values(obs, action, reward, terminated, truncated, success, intervention, policy_version) -> dict:
    return {
        "observation.state": obs[Col.STATE],
        "action": action,
        "next.reward": float(reward),
        "next.done": bool(terminated or truncated),
        "next.truncated": bool(truncated and not terminated),
        "next.success": bool(success),
        "intervention": bool(intervention),
        "policy_version": int(policy_version),
    }


class Pacer:
    """Holds a loop at ``hz`` (0: as fast as possible, e.g. a simulator in a test)."""

    def __init__(self, hz: float):
        self.period = 1.0 / hz if hz > 0 else 0.0
        self.next = time.monotonic()

    def wait(self) -> None:
        if not self.period:
            return
        self.next += self.period
        delay = self.next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            self.next = time.monotonic()


class Recorder:
    """Runs teleop episodes on ``env`` and writes them with ``writer``."""

    def __init__(
        self,
        env,
        device: Teleop,
        writer: LeRobotWriter,
        task: str,
        rate_hz: float = 10.0,
        max_steps: int | None = None,
        before_step: Callable[[dict], None] | None = None,
        on_episode: Callable[[EpisodeResult], None] | None = None,
    ):
        self.env = env
        self.device = device
        self.writer = writer
        self.task = task
        self.rate_hz = rate_hz
        self.max_steps = max_steps
        self.before_step = before_step  # e.g. a scripted human feeding device reports
        self.on_episode = on_episode
        self.cameras = list(env.observation_space["images"].spaces)

    def _hold(self, obs) -> None:
        """Keep the robot where it is (zero motion, gripper unchanged) after losing the device."""
        try:
            a = np.zeros(7, np.float32)
            a[6] = 1.0 if self._gripper > 0 else -1.0
            self.env.step(a)
        except Exception as exc:  # noqa: BLE001 - best effort; the edge watchdog holds anyway
            log.warning("could not send a hold command: %s", exc)

    def run(self, episodes: int, seed: int | None = None, episode_seed=None) -> SessionStats:
        """``episodes`` episodes; episode n resets with ``episode_seed(n)`` when given, else
        ``seed + n`` (None: the env's own stream)."""
        stats = SessionStats()
        for n in range(episodes):
            if episode_seed is not None:
                result = self.episode(seed=episode_seed(n))
            else:
                result = self.episode(seed=None if seed is None else seed + n)
            stats.episodes.append(result)
            if self.on_episode:
                self.on_episode(result)
            if result.outcome == "stop":
                break
            if result.outcome == "device_lost":
                stats.error = (
                    f"teleop device {self.device.name} disconnected; the episode so far was saved as episode "
                    f"{result.index} (outcome device_lost). Reconnect it and run again with dataset.resume=true."
                )
                break
        return stats

    def episode(self, seed: int | None = None) -> EpisodeResult:
        while True:  # re-record loops here
            obs, _ = self.env.reset(seed=seed)
            task = obs.get(Col.INSTRUCTION) or self.task  # the episode's language instruction is its task
            if not self.device.started and self.before_step is None:
                self.device.start()  # device input counts from when the robot is ready
            self.device.release()
            self.device.set_gripper(False)
            self._gripper = -1.0
            if hasattr(self.before_step, "reset"):
                self.before_step.reset()
            t0 = time.monotonic()
            pacer = Pacer(self.rate_hz)
            steps = 0
            outcome = None
            while True:
                if self.before_step:
                    self.before_step(obs)
                try:
                    cmd: TeleopCommand = self.device.read()
                except DeviceDisconnected as exc:
                    log.error("%s", exc)
                    self._hold(obs)
                    if steps == 0:
                        self.writer.discard_episode()
                        return EpisodeResult(None, "device_lost", 0, False, time.monotonic() - t0)
                    self._mark_last_truncated()
                    idx = self.writer.save_episode(task, extra=self._extra("device_lost", False, steps))
                    return EpisodeResult(idx, "device_lost", steps, False, time.monotonic() - t0)
                if "stop" in cmd.events:
                    self.writer.discard_episode()
                    return EpisodeResult(None, "stop", steps, False, time.monotonic() - t0)
                if "rerecord" in cmd.events:
                    log.info("re-recording: %d steps discarded", steps)
                    self.writer.discard_episode()
                    outcome = "rerecord"
                    break
                if steps and ({"success", "failure"} & cmd.events):
                    ok = "success" in cmd.events
                    self._mark_last_done(ok)
                    kind = "success" if ok else "failure"
                    idx = self.writer.save_episode(task, extra=self._extra(kind, ok, steps))
                    return EpisodeResult(idx, kind, steps, ok, time.monotonic() - t0)
                action = cmd.action()
                self._gripper = action[6]
                next_obs, reward, terminated, truncated, info = self.env.step(action)
                steps += 1
                limit = self.max_steps is not None and steps >= self.max_steps
                truncated = bool(truncated or (limit and not terminated))
                success = bool(info.get("success", False))
                self.writer.add_frame(
                    frame_values(obs, action, reward, terminated, truncated, success, True, -1),
                    {c: obs[Col.IMAGES][c] for c in self.cameras},
                )
                obs = next_obs
                if terminated or truncated:
                    kind = "success" if success else ("failure" if terminated else "timeout")
                    idx = self.writer.save_episode(task, extra=self._extra(kind, success, steps))
                    return EpisodeResult(idx, kind, steps, success, time.monotonic() - t0)
                pacer.wait()
            if outcome == "rerecord":
                continue

    def _extra(self, outcome: str, success: bool, steps: int) -> dict[str, Any]:
        return {"success": bool(success), "outcome": outcome, "teleop_device": self.device.kind}

    def _mark_last_done(self, success: bool) -> None:
        """The person ended the episode: its last frame is terminal with their verdict."""
        self.writer.update_last_frame(**{"next.done": True, "next.truncated": False, "next.success": success})

    def _mark_last_truncated(self) -> None:
        self.writer.update_last_frame(**{"next.done": True, "next.truncated": True})
