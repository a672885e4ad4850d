"""The replay role: a persistent buffer (plus optional demo buffer) behind add/sample.

In ``collocated`` placement it lives inside the learner process; in ``disaggregated``
placement it is its own Ray actor. Either way env workers call ``add`` directly.

Human interventions (HIL-SERL): every transition carries an ``intervention`` flag. With
``interventions_as_demos`` the flagged transitions of the online buffer are also drawn on
the demo side of each batch, pooled with the loaded demonstrations in proportion to their
counts. They are not copied: the pool is the flag column of the online buffer, so it
survives a restart with the buffer's log, costs no memory, and an intervention stays a
demonstration as long as it stays in the online buffer.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_user.data.replay import ReplayBuffer, TransitionError, check_fits, keep_batch_memory
from rlinf_user.env.spec import Col
from rlinf_user.runtime.learning.ordered_sink import SenderOrder

log = logging.getLogger(__name__)


def interventions_as_demos(cfg) -> bool:
    iv = cfg.get("intervention")
    return bool(iv is not None and iv.enabled and iv.to_demos)


class ReplayService:
    def __init__(
        self,
        capacity: int,
        directory: str | None,
        demo_path: str | None = None,
        seed: int = 0,
        cameras: list[str] | None = None,
        interventions_as_demos: bool = False,
        keep_full_log: bool = False,
        segment_mb: float = 256.0,
        reward: dict | None = None,
        instruction: bool = False,
        nstep: int = 1,
        gamma: float = 0.99,
        frame_features: dict | None = None,
        expected: dict | None = None,
        embed_rows: Any = None,
    ):
        """``expected``: the row columns known before the first chunk
        (:func:`~rlinf_user.data.replay.expected_schema`); a capacity they cannot fit
        in is refused here, before any worker sends a row. ``embed_rows``: what adds a
        frozen base's embedding to each row as it is stored
        (:class:`~rlinf_user.policies.steered.RowEmbedder`, or ``{"policy", "spec"}`` to build
        this process's own), else None."""
        if expected is not None:
            check_fits(int(capacity), expected)
        keep_batch_memory()  # this process samples batches: their pages are reused, not faulted in again
        if isinstance(embed_rows, dict):
            from rlinf_user.policies.steered import RowEmbedder

            embed_rows = RowEmbedder.from_config(embed_rows["policy"], embed_rows["spec"])
        self.embed_rows = embed_rows
        self.buffer = ReplayBuffer(
            capacity, directory, keep_full_log=keep_full_log, segment_bytes=int(segment_mb * 2**20),
            nstep=nstep, gamma=gamma,
        )  # fmt: skip
        self.restored = self.buffer.restore()
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.demos: ReplayBuffer | None = None
        # how load_demos reads and prepares the demonstrations
        self._demo_cameras, self._demo_instruction = cameras, instruction
        self._nstep, self._gamma, self._relabel, self._frame_features = nstep, gamma, reward, frame_features
        if demo_path:
            self.load_demos(demo_path)
        self.order = SenderOrder()
        self.rejected = 0
        self.env_steps_stored = 0  # env steps of the rows stored (a chunk row: the steps it ran)
        self.interventions_as_demos = interventions_as_demos
        self._iv_index: np.ndarray | None = None  # positions of flagged transitions (cached)
        self.intervention_samples = 0  # intervention transitions drawn on the demo side

    def load_demos(self, demo_path: str) -> int:
        """The demonstrations the demo side of each batch samples (rewards relabelled by a
        classifier, frames encoded, rows embedded, as configured); their row count. Camera
        demonstrations take minutes on a CPU: a run calls this once the actor is placed, so
        that a long load is not taken for an actor that cannot be placed."""
        demos = load_demo_buffer(demo_path, self._demo_cameras, self._demo_instruction, nstep=self._nstep,
                                 gamma=self._gamma)  # fmt: skip
        if self._relabel and self._relabel.get("classifier"):
            relabel_rewards(demos, self._relabel)
            demos.recompute_nstep()
        if self._frame_features is not None:  # after relabelling: the classifier reads the frames
            demos = featurize_buffer(demos, self._frame_features)
        if self.embed_rows is not None:
            demos = embed_buffer(demos, self.embed_rows)
        with self.lock:
            self.demos = demos
        log.info("loaded %d demonstration rows from %s", demos.size, demo_path)
        return demos.size

    def add(self, chunk: dict[str, np.ndarray], sender: str | None = None, seq: int = 0, base: int = 0) -> int:
        """Store a worker's chunk; numbered chunks are stored in their sender's order
        (:mod:`rlinf_user.runtime.learning.ordered_sink`)."""
        return self.order.add(chunk, sender, seq, base, self._store)

    def _store(self, chunk: dict[str, np.ndarray]) -> int:
        if self.embed_rows is not None:  # before the lock: sampling goes on meanwhile
            try:
                chunk = self.embed_rows(chunk)
            except (KeyError, ValueError, RuntimeError) as err:
                self.rejected += 1
                log.error("rejected a transition chunk (nothing stored): its rows could not be embedded: %s", err)
                return 0
        with self.lock:
            try:
                flags = self.buffer.storage.get(Col.INTERVENTION)
                n = len(chunk[Col.REWARD]) if Col.REWARD in chunk else 0
                # the flagged positions change only if this chunk has flags or overwrites some
                overwrites = flags is not None and bool(
                    flags[(self.buffer.cursor + np.arange(n)) % self.buffer.capacity].any()
                )
                n = self.buffer.add(chunk)
                self.env_steps_stored += int(np.sum(chunk[Col.CHUNK_STEPS])) if Col.CHUNK_STEPS in chunk else n
                if flags is None or overwrites or bool(np.any(chunk.get(Col.INTERVENTION, False))):
                    self._iv_index = None
                return n
            except TransitionError as err:
                self.rejected += 1
                log.error("rejected a transition chunk (nothing stored): %s", err)
                return 0

    def _interventions(self) -> np.ndarray:
        """Buffer positions holding intervention transitions (lock held)."""
        if not self.interventions_as_demos or Col.INTERVENTION not in self.buffer.storage:
            return np.zeros(0, np.int64)
        if self._iv_index is None:
            self._iv_index = np.flatnonzero(self.buffer.storage[Col.INTERVENTION][: self.buffer.size])
        return self._iv_index

    def _demo_side(self, n: int, out: dict[str, np.ndarray]) -> None:
        """``n`` demonstration rows into ``out``: loaded demos and interventions pooled, each
        row drawn from the pool (lock held)."""
        iv = self._interventions()
        n_loaded = 0 if self.demos is None else self.demos.size
        k_iv = int(self.rng.binomial(n, len(iv) / (n_loaded + len(iv))))
        self.intervention_samples += k_iv
        if k_iv == 0:
            self.demos.gather(self.rng.integers(0, n_loaded, size=n), out)
        elif k_iv == n:
            self.buffer.gather(iv[self.rng.integers(0, len(iv), size=n)], out)
        else:  # a mix: gathered in two parts (interventions from the online buffer), shuffled
            order = self.rng.permutation(n)
            self.buffer.gather(iv[self.rng.integers(0, len(iv), size=k_iv)], {k: v[:k_iv] for k, v in out.items()})
            self.demos.gather(self.rng.integers(0, n_loaded, size=n - k_iv), {k: v[k_iv:] for k, v in out.items()})
            for v in out.values():
                v[:] = v[order]

    def sample(self, batch_size: int, num_batches: int = 1, demo_ratio: float = 0.0) -> dict[str, np.ndarray]:
        """``num_batches`` batches stacked on a new leading axis: ``(num_batches, B, ...)``.
        ``demo_ratio`` of each batch comes from demonstrations (and interventions) when
        there are any, as each batch's last rows; the rest from the online buffer. Each
        side is gathered straight into its rows of the batch (no joined copy: with image
        features a row is ~40 KB, and the join cost a collocated learner 15% of its time)."""
        n_demo = int(round(batch_size * demo_ratio))
        with self.lock:
            if self.buffer.size == 0:
                raise RuntimeError("cannot sample from an empty replay buffer")
            if n_demo and (0 if self.demos is None else self.demos.size) + len(self._interventions()) == 0:
                n_demo = 0
            cols = self.buffer.columns()
            if n_demo and self.demos is not None:
                demo_cols = self.demos.columns()
                cols = {k: (shape, np.result_type(dt, demo_cols[k][1])) for k, (shape, dt) in cols.items() if k in demo_cols}
            out = {k: np.empty((num_batches, batch_size, *shape), dtype) for k, (shape, dtype) in cols.items()}
            n_online = batch_size - n_demo
            for b in range(num_batches):  # each batch's rows are contiguous: gathered in place
                self.buffer.gather(self.rng.integers(0, self.buffer.size, size=n_online),
                                   {k: v[b, :n_online] for k, v in out.items()})  # fmt: skip
                if n_demo:
                    self._demo_side(n_demo, {k: v[b, n_online:] for k, v in out.items()})
        # which rows are demonstrations (an actor's BC term reads it): the last n_demo
        out[Col.FROM_DEMOS] = np.zeros((num_batches, batch_size), bool)
        out[Col.FROM_DEMOS][:, n_online:] = True
        return out

    def sample_demos(self, batch_size: int) -> dict[str, np.ndarray] | None:
        """A batch of demonstration transitions only (BC warm start); None without demos."""
        if self.demos is None:
            return None
        with self.lock:
            return self.demos.sample(batch_size, self.rng)

    def size(self) -> int:
        return self.buffer.size

    def steps_stored(self) -> int:
        """Env steps whose rows are stored here: what the learner's update-to-data budget may
        count the moment they land, before the rollout that sent them has returned."""
        return self.env_steps_stored

    def pid(self) -> int:
        import os

        return os.getpid()

    def where(self) -> dict[str, Any]:
        import ray

        return {"node": ray.get_runtime_context().get_node_id()}

    def stats(self) -> dict[str, Any]:
        return {
            "size": self.buffer.size,
            "total_added": self.buffer.total_added,
            "restored": self.restored,
            "rejected": self.rejected,
            "demos": 0 if self.demos is None else self.demos.size,
            "interventions": int(np.count_nonzero(self.buffer.storage[Col.INTERVENTION][: self.buffer.size]))
            if Col.INTERVENTION in self.buffer.storage
            else 0,
            "intervention_samples": self.intervention_samples,
            **self.order.stats(),
            **(
                {"log_bytes": self.buffer.log.size_bytes(), "log_deleted_segments": self.buffer.log.deleted_segments}
                if self.buffer.log is not None
                else {}
            ),
        }

    def close(self) -> None:
        self.buffer.close()


def reward_settings(cfg) -> dict | None:
    """The run's learned-reward settings (``reward.*``) as a plain dict, or None."""
    rw = cfg.get("reward")
    if rw is None or not rw.classifier:
        return None
    return {
        "classifier": str(rw.classifier), "threshold": rw.threshold, "success_reward": float(rw.success_reward),
        "ends_episode": bool(rw.get("ends_episode", False)),
    }  # fmt: skip


def relabel_rewards(buf: ReplayBuffer, reward: dict) -> None:
    """Give demonstrations the reward the online steps get: the success classifier's
    verdict on each transition's next observation (their recorded env reward is another
    scale, or absent on a robot). With ``ends_episode`` a classified success is also
    terminal, as it is online."""
    from rlinf_user.reward.classifier import SuccessClassifier

    model, state = SuccessClassifier.load(reward["classifier"])
    threshold = float(state["threshold"] if reward.get("threshold") is None else reward["threshold"])
    st = buf.storage
    missing = [k for k in model.cameras if f"next_obs/images/{k}" not in st]
    if missing:
        raise ValueError(f"demos: the reward classifier needs cameras {missing}, which the demonstrations lack")
    positives = 0
    for start in range(0, buf.size, 1024):
        end = min(buf.size, start + 1024)
        obs = {
            Col.STATE: st[Col.state(Col.NEXT_OBS)][start:end],
            Col.IMAGES: {k: st[f"next_obs/images/{k}"][start:end] for k in model.cameras},
        }
        success = model.probability(obs) >= threshold
        st[Col.REWARD][start:end] = reward["success_reward"] * success
        if reward.get("ends_episode", False):
            st[Col.TERMINATED][start:end] = np.maximum(st[Col.TERMINATED][start:end], success)
        positives += int(success.sum())
    log.info(
        "demos: rewards relabelled by the success classifier (%d of %d transitions successes)", positives, buf.size
    )


def featurize_buffer(buf: ReplayBuffer, settings: dict) -> ReplayBuffer:
    """The same transitions with the frozen encoder's maps in place of their frames
    (``policy.frame_features``); a buffer without frames is returned as it is."""
    from rlinf_user.policies.frame_features import FrameFeaturizer

    cols = {k: v[: buf.size] for k, v in buf.storage.items()}
    if not any("/images/" in k for k in cols):
        return buf
    t0 = time.perf_counter()
    out = ReplayBuffer(capacity=buf.size, nstep=buf.nstep.n if buf.nstep is not None else 1, gamma=buf.gamma)
    out.add(FrameFeaturizer(settings).columns(cols))
    log.info("demos: %d transitions' frames encoded by the frozen %s in %.1f s", buf.size, settings["encoder"],
             time.perf_counter() - t0)  # fmt: skip
    return out


def embed_buffer(buf: ReplayBuffer, embed_rows) -> ReplayBuffer:
    """The same transitions with the frozen base's embedding of their observations."""
    t0 = time.perf_counter()
    out = ReplayBuffer(capacity=buf.size, nstep=buf.nstep.n if buf.nstep is not None else 1, gamma=buf.gamma)
    out.add(embed_rows({k: v[: buf.size] for k, v in buf.storage.items()}))
    log.info("demos: %d transitions embedded by the frozen base in %.1f s", buf.size, time.perf_counter() - t0)
    return out


def load_demo_buffer(
    path: str, cameras: list[str] | None = None, instruction: bool = False, nstep: int = 1, gamma: float = 0.99
) -> ReplayBuffer:
    """Demonstrations from a LeRobotDataset v3.0 folder (``rlinf-user teleop`` output) or
    a replay log folder (a run's ``buffer/``). ``cameras``: image keys to load;
    ``instruction``: the env observes a language instruction, which a LeRobot episode's
    ``task`` supplies (a replay log stored its own)."""
    p = Path(path)
    if (p / "meta" / "info.json").exists():
        return _lerobot_demos(p, cameras or [], instruction, nstep, gamma)
    if (p / "buffer").is_dir():
        p = p / "buffer"
    if not p.is_dir() or not list(p.glob("seg-*.log")):
        raise FileNotFoundError(f"demos={path}: no replay log (seg-*.log) found there")
    demos = ReplayBuffer(capacity=10_000_000, directory=p, nstep=nstep, gamma=gamma)
    demos.restore()
    demos.log.close()
    demos.log = None  # read-only: never append to someone else's demos
    if demos.size == 0:
        raise ValueError(f"demos={path}: the log holds no transitions")
    return demos


def _add_missing_bonus(chunk: dict[str, np.ndarray], ep, bonus: float) -> int:
    """Adds ``bonus`` to the steps that ended the episode in success without it (a dataset
    recorded before recordings applied the run's shaping); returns how many."""
    if not bonus or "next.success" not in ep.columns:
        return 0
    rows = len(chunk[Col.REWARD])
    success = ep.columns["next.success"].astype(bool).reshape(-1)[:rows] & (chunk[Col.TERMINATED] > 0)
    short = success & (chunk[Col.REWARD] < bonus)
    chunk[Col.REWARD][short] += np.float32(bonus)
    return int(short.sum())


def _lerobot_demos(
    root: Path, cameras: list[str], instruction: bool = False, nstep: int = 1, gamma: float = 0.99
) -> ReplayBuffer:
    from rlinf_user.data.lerobot_format import REWARD_INFO_KEY
    from rlinf_user.data.lerobot_reader import LeRobotReader, episode_transitions

    reader = LeRobotReader(root)
    chunks = []
    policy_steps = repaired = 0
    recorded = reader.info.get(REWARD_INFO_KEY) or {}
    # a dataset without the mark was recorded before recorders applied the bonus
    bonus = 0.0 if recorded.get("bonus_applied") else float(recorded.get("success_bonus") or 0.0)
    for ep in reader.episodes(images=bool(cameras)):
        chunk = episode_transitions(ep, cameras, instruction)
        if chunk is None:
            continue
        repaired += _add_missing_bonus(chunk, ep, bonus)
        # one stream per episode, numbered by frame: n-step returns never cross an episode
        # or a gap where the policy's steps are left out
        rows = len(chunk[Col.REWARD])
        chunk[Col.ENV_ID] = np.full(rows, ep.index, np.int64)
        chunk[Col.STEP] = np.asarray(ep.columns["frame_index"], np.int64).reshape(-1)[:rows]
        # An HG-DAgger session (or an RL run's recording) holds the policy's own steps too:
        # only what the human did is a demonstration. Teleop datasets are all human.
        human = chunk[Col.INTERVENTION]
        policy_steps += int((~human).sum())
        if human.any():
            chunks.append({k: v[human] for k, v in chunk.items()})
    if not chunks:
        raise ValueError(
            f"demos={root}: no human-controlled transitions in {reader.num_episodes} episode(s) "
            "(demonstrations are the steps flagged `intervention`)"
        )
    if repaired:
        log.warning(
            "demos: %d success step(s) in %s hold no success bonus although the dataset says it was recorded "
            "with env.success_bonus=%g (recorded before recordings applied the run's reward shaping): added on load",
            repaired, root, bonus,
        )  # fmt: skip
    n = sum(len(c[Col.REWARD]) for c in chunks)
    demos = ReplayBuffer(capacity=n, nstep=nstep, gamma=gamma)
    for c in chunks:
        demos.add(c)
    log.info(
        "demos: %d human transitions from %d LeRobot episodes in %s (%d policy steps left out)",
        n, len(chunks), root, policy_steps,
    )  # fmt: skip
    return demos
