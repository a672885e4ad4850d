"""HG-DAgger sessions: the policy acts, a person gates in and corrects, the corrections are
aggregated with the demonstrations and the policy is retrained while the robot keeps going.

Acting side (this process, next to the env/robot): every step the newest published
policy proposes an action, the teleop device is read, and the :class:`InterventionGate`
decides who acts (ramped hand-over). Every step is recorded (LeRobotDataset, with
``intervention`` and ``policy_version``) and every step the human controlled is sent to
the learner as a label. Learner side (a Ray actor, :class:`BCLearner`): trains
continuously on demonstrations + corrections and publishes versions; the acting side
applies them between steps without waiting. With ``updates_per_episode`` it trains in
step instead: a fixed number of updates after each corrected episode while the robot
waits, so what a session learns does not depend on the machine's speed.

Evaluation episodes (``eval_episodes`` per round) run the policy with the human's hands
off, which measures autonomous success per policy version; without them, autonomous
success is counted on episodes in which nobody intervened.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlinf_user.env.spec import Col, obs_to_torch, stack_obs
from rlinf_user.evaluation import wilson
from rlinf_user.robots.teleop.command import DeviceDisconnected
from rlinf_user.teleop.gate import InterventionGate
from rlinf_user.teleop.record import Pacer, frame_values

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EpisodeLog:
    round: int
    episode: int
    kind: str  # "dagger" (human may intervene) | "eval" (hands off)
    policy_version: int  # in effect at the episode start
    steps: int
    intervention_steps: int
    takeovers: int
    success: bool
    wall_s: float
    dataset_index: int | None = None

    @property
    def intervention_rate(self) -> float:
        return self.intervention_steps / max(self.steps, 1)


class HGDaggerSession:
    def __init__(
        self,
        env,
        device,
        policy,
        subscriber,
        learner,
        spec: dict[str, Any],
        writer=None,
        task: str = "",
        ramp_steps: int = 3,
        rate_hz: float = 10.0,
        human: Callable | None = None,
        on_episode: Callable[[EpisodeLog], None] | None = None,
        updates_per_episode: int = 0,
    ):
        self.env = env
        self.device = device
        self.policy = policy
        self.subscriber = subscriber
        self.learner = learner
        self.spec = spec
        self.writer = writer
        self.task = task
        self.gate = InterventionGate(ramp_steps)
        self.rate_hz = rate_hz
        self.human = human  # a scripted human: called with (obs, policy_action) before each read
        self.on_episode = on_episode
        self.updates_per_episode = updates_per_episode  # > 0: train in step with the episodes
        self.log: list[EpisodeLog] = []
        self.cameras = list(env.observation_space["images"].spaces)

    def policy_chunk(self, obs: dict) -> list[np.ndarray]:
        """The policy's next contract actions: a chunk of its horizon (one for per-step policies)."""
        with torch.no_grad():
            out = self.policy.act(obs_to_torch(stack_obs([obs])), deterministic=True)
        return list(self.spec.expand_action(out.actions[0].float().numpy()))

    def episode(self, round_: int, index: int, kind: str, seed: int | None) -> EpisodeLog:
        obs, _ = self.env.reset(seed=seed)
        task = obs.get(Col.INSTRUCTION) or self.task  # the episode's language instruction is its task
        self.gate.reset()
        self.device.release()
        if self.human is not None and hasattr(self.human, "reset"):
            self.human.reset()
        self.subscriber.poll()
        version = self.subscriber.version
        takeovers0 = self.gate.takeovers
        seen: list[dict] = []  # the episode's observations, executed actions and which are labels
        executed: list[np.ndarray] = []
        labelled: list[bool] = []
        queue: list[np.ndarray] = []  # what is left of the policy's current chunk
        horizon = 1
        # a robot env that runs whole chunks at the edge: the next chunk is planned while
        # the last `lookahead` actions of this one run (env.edge.stream_chunks)
        planner = getattr(self.env, "unwrapped", self.env)
        lookahead = int(getattr(planner, "plan_lookahead", 0))
        steps = interventions = 0
        success = False
        t0 = time.monotonic()
        pacer = Pacer(self.rate_hz)
        lost = None
        while True:
            self.subscriber.poll()  # never blocks: new weights are applied between steps
            streaming = bool(lookahead and planner.streaming)
            fresh = None  # a new chunk for the edge, sent once the person's decision is known
            if not queue or (streaming and len(queue) <= min(lookahead, horizon - 1)):
                queue = self.policy_chunk(obs)
                horizon = len(queue)
                if lookahead and horizon > 1:
                    fresh = np.stack(queue)
            pa = queue.pop(0)
            if kind == "dagger" and self.human is not None:
                self.human(obs, pa)
            try:
                cmd = self.device.read()
            except DeviceDisconnected as exc:
                lost = exc
                break
            if kind == "eval":
                cmd.engaged = False  # hands off: the policy alone
            d = self.gate.step(pa, cmd, self.device)
            if d.intervention and lookahead and planner.streaming:
                planner.unplan()  # the person's actions replace the robot's schedule
            elif fresh is not None and not d.intervention:
                planner.plan(fresh)  # never while the person drives: no policy tick sneaks in
            paced = not (lookahead and planner.streaming)  # a streamed chunk: the robot sets the pace
            next_obs, reward, terminated, truncated, info = self.env.step(d.action)
            if "applied_action" in info:  # what the robot ran at this tick (streamed chunk)
                d.action = np.asarray(info["applied_action"], np.float32)
            success = bool(info.get("success", False))
            if self.writer is not None:
                self.writer.add_frame(
                    frame_values(obs, d.action, reward, terminated, truncated, success, d.intervention, self.subscriber.version),
                    {c: obs[Col.IMAGES][c] for c in self.cameras},
                )
            clean = bool(d.intervention and d.alpha >= 1.0)  # fully the human's action: a clean label
            if kind == "dagger":
                seen.append(obs)
                executed.append(np.asarray(d.human_action if clean else d.action, np.float32))
                labelled.append(clean)
            if d.intervention:
                interventions += 1
                queue = []  # after the person's step the policy plans again from what it sees
            steps += 1
            obs = next_obs
            if terminated or truncated:
                break
            if paced:
                pacer.wait()
        if any(labelled):
            self.learner.add_episode.remote(episode_arrays(seen, self.cameras), np.stack(executed), np.array(labelled), 1)
        if self.updates_per_episode and kind == "dagger" and lost is None:
            self._train_in_step()
        idx = None
        if self.writer is not None and steps:
            if lost is not None:
                self.writer.update_last_frame(**{"next.done": True, "next.truncated": True})
            outcome = "device_lost" if lost else ("success" if success else "failure")
            idx = self.writer.save_episode(
                task,
                extra={"success": success, "outcome": outcome, "hg_dagger_kind": kind, "round": round_},
            )
        entry = EpisodeLog(
            round_, index, kind, version, steps, interventions, self.gate.takeovers - takeovers0, success,
            time.monotonic() - t0, idx,
        )  # fmt: skip
        self.log.append(entry)
        if self.on_episode:
            self.on_episode(entry)
        if lost is not None:
            raise lost
        return entry

    def _train_in_step(self) -> None:
        """The robot waits while the learner trains ``updates_per_episode`` updates on
        everything so far (the corrections just sent included: one actor takes its calls
        in order) and publishes; the next episode acts with that version."""
        import ray

        ray.get(self.learner.train.remote(self.updates_per_episode))
        ray.get(self.learner.publish.remote())
        self.subscriber.sync()

    def run(self, rounds: int, episodes_per_round: int, eval_episodes: int = 0, seed: int = 0) -> list[EpisodeLog]:
        """Round 0 evaluates the policy cloned from the demonstrations alone (when there
        are evaluation episodes); rounds 1..``rounds`` are corrected episodes, each
        followed by its evaluation episodes."""
        n = 0
        for _ in range(eval_episodes):
            self.episode(0, n, "eval", seed + 100_000 + n)
            n += 1
        for r in range(1, rounds + 1):
            for _ in range(episodes_per_round):
                self.episode(r, n, "dagger", seed + n)
                n += 1
            for _ in range(eval_episodes):
                self.episode(r, n, "eval", seed + 100_000 + n)
                n += 1
        return self.log


def episode_arrays(observations: list[dict], cameras: list[str]) -> dict[str, Any]:
    """An episode's observations as arrays (``state``, ``images``, ``instruction``)."""
    out: dict[str, Any] = {
        Col.STATE: np.stack([o[Col.STATE] for o in observations]).astype(np.float32),
        Col.IMAGES: {c: np.stack([o[Col.IMAGES][c] for o in observations]) for c in cameras},
    }
    if observations and Col.INSTRUCTION in observations[0]:
        out[Col.INSTRUCTION] = np.array([str(o[Col.INSTRUCTION]) for o in observations])
    return out


def round_summary(log: list[EpisodeLog]) -> list[dict[str, Any]]:
    """Per round: intervention rate (human-controlled steps / steps on dagger episodes;
    None for the demonstrations-only baseline, round 0) and autonomous success (eval
    episodes, else dagger episodes nobody intervened in)."""
    out = []
    for r in sorted({e.round for e in log}):
        dag = [e for e in log if e.round == r and e.kind == "dagger"]
        ev = [e for e in log if e.round == r and e.kind == "eval"]
        auto = ev if ev else [e for e in dag if e.intervention_steps == 0]
        out.append(
            {
                "round": r,
                "episodes": len(dag),
                "intervention_rate": round(sum(e.intervention_steps for e in dag) / max(1, sum(e.steps for e in dag)), 4)
                if dag
                else None,
                "takeovers": sum(e.takeovers for e in dag),
                "dagger_success": round(float(np.mean([e.success for e in dag])), 4) if dag else None,
                "autonomous_success": round(float(np.mean([e.success for e in auto])), 4) if auto else None,
                "autonomous_episodes": len(auto),
                "autonomous_ci95": list(wilson(sum(e.success for e in auto), len(auto))) if auto else None,
                "policy_versions": sorted({e.policy_version for e in log if e.round == r}),
            }
        )
    return out


def version_summary(log: list[EpisodeLog]) -> dict[int, dict[str, Any]]:
    """Autonomous success per policy version (eval episodes and intervention-free ones)."""
    out: dict[int, dict[str, Any]] = {}
    for e in log:
        if e.kind == "eval" or e.intervention_steps == 0:
            d = out.setdefault(e.policy_version, {"episodes": 0, "successes": 0})
            d["episodes"] += 1
            d["successes"] += int(e.success)
    for d in out.values():
        d["success_rate"] = round(d["successes"] / d["episodes"], 4)
    return out
