"""The env workers of a run: one slot per worker of each fleet member.

A slot is *running* (an actor exists), *waiting* (the node offering the member's
resources is not in the cluster: a robot PC that is down, or not started yet) or
*retired* (its worker kept failing while its node was up, or an elastic worker's node
left). A slot whose node leaves waits without counting as a failure and is started again
as soon as a node offering those resources joins; training goes on with the others
meanwhile. Only when a worker keeps failing on a node that is up is it given up on, and
the run stops only if no slot is left that could run.

Elastic workers (``placement.max_env_workers`` above ``num_env_workers``, a run without a
fleet): whenever the cluster has free CPUs for another worker (a node joined: the Ray
autoscaler, or a person's ``ray start --address=...``), one is added and feeds the learner
from its first rollout, up to that many; an added worker whose node leaves is retired,
its episodes' rows already sent kept. :attr:`WorkerPool.events` times each join (node
seen -> first rows back) and leave (node gone -> its workers retired).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from rlinf_user.env.spec import EnvSpec
from rlinf_user.identity import ANOTHER_BUILD, project_identity
from rlinf_user.runtime.orchestration.run_record import root_cause
from rlinf_user.runtime.rollout.fleet import Member, union_spec, wants_member_id
from rlinf_user.seeds import worker_seed

log = logging.getLogger(__name__)

MAX_RESTARTS = 5  # per slot, while its node is up
CHECK_EVERY_S = 2.0
NODE_GRACE_S = 3.0
START_TIMEOUT_S = 300.0  # a worker that cannot be placed (no free resources) by then  # how long a failed worker's node gets to be declared dead


class PoolError(RuntimeError):
    pass


@dataclass
class Slot:
    index: int  # the worker id: unique in the run
    member: Member
    actor: Any = None
    generation: int = 0
    status: str = "waiting"  # running | waiting | retired
    restarts: int = 0
    nodes: list[str] = field(default_factory=list)
    elastic: bool = False  # added while the run went on (placement.max_env_workers)
    started_at: float = 0.0  # monotonic time of its last start
    fed: bool = False  # its first rollout came back since its last start


def cluster_has(resources: dict[str, float]) -> bool:
    """Whether some node of the cluster offers every custom resource (total, not free)."""
    import ray

    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}
    if not custom:
        return True
    for node in ray.nodes():
        if node.get("Alive") and all(node.get("Resources", {}).get(k, 0) >= v for k, v in custom.items()):
            return True
    return False


class WorkerPool:
    def __init__(self, cfg, plan, weight_store, members: list[Member], actor_cls):
        self.cfg = cfg
        self.plan = plan
        self.weight_store = weight_store
        self.members = members
        self.actor_cls = actor_cls
        self.slots: list[Slot] = []
        for m in members:
            for _ in range(m.workers):
                self.slots.append(Slot(len(self.slots), m))
        self.spec: EnvSpec | None = None
        self.sink = None
        self.rollout = None  # the rollout server, when one acts for the workers
        self.reward_name: str | None = None  # the reward server's name, when the run has one
        self._last_check = 0.0
        fixed = sum(m.workers for m in members)
        self.max_workers = max(fixed, int(cfg.placement.get("max_env_workers", 0) or 0)) if len(members) == 1 else fixed
        self.growing = False  # set once every role of the run is placed (their CPUs are not spare)
        self.target: int | None = None  # live workers placement=auto's re-plan asked for (None: as many as fit)
        self.events: list[dict[str, Any]] = []  # elastic joins and leaves, timed
        self._nodes: dict[str, float] = {}  # alive node -> when it was first seen

    # -- spawning ---------------------------------------------------------------------------
    def _options(self, m: Member) -> dict[str, Any]:
        opts = self.plan.env_worker.actor_options()
        opts["num_cpus"] = m.num_cpus
        res = dict(m.resources)  # a member's own robot (the default member: env_worker's)
        if not res:  # no robot: the node group's share stays (placement.env_worker.group)
            grouped = {k for g in (self.plan.groups or {}).values() for k in g}
            res = {k: v for k, v in opts.get("resources", {}).items() if k in grouped}
        if res:
            opts["resources"] = res
        else:
            opts.pop("resources", None)
        return opts

    def _spawn(self, slot: Slot) -> None:
        slot.actor = self.actor_cls.options(**self._options(slot.member)).remote(
            self.cfg, worker_id=slot.index, weight_store=self.weight_store, sink=self.sink,
            seed=worker_seed(self.cfg.seed, slot.index, slot.generation), member=slot.member, fleet_spec=self.spec,
            rollout=self.rollout, reward_name=self.reward_name, driver_build=project_identity(),
        )  # fmt: skip
        slot.status = "running"
        slot.started_at, slot.fed = time.monotonic(), False

    def available(self, slot: Slot) -> bool:
        return cluster_has(self._options(slot.member).get("resources", {}))

    def start(self, wait_s: float = 120.0) -> dict[str, Any]:
        """Start every slot whose node is up, build the learner's spec from their envs and
        attach them to it. Waits up to ``wait_s`` for at least one node."""
        import ray

        deadline = time.monotonic() + wait_s
        while not any(self.available(s) for s in self.slots):
            if time.monotonic() > deadline:
                wanted = sorted({k for s in self.slots for k in self._options(s.member).get("resources", {})})
                raise PoolError(
                    f"no node offers the resources of any fleet member ({', '.join(wanted)}); start them with "
                    "`ray start --address=<head> --resources='{\"<name>\": 1}'` on the nodes that reach the robots"
                )
            time.sleep(1.0)
        for s in self.slots:
            if self.available(s):
                self._spawn(s)
            else:
                log.warning("fleet member %s: no node offers %s yet; it joins when one does", s.member.name, s.member.resources)
        running = [s for s in self.slots if s.status == "running"]
        specs: dict[int, EnvSpec] = {}
        for s in running:
            if s.member.index not in specs:
                try:
                    specs[s.member.index] = ray.get(s.actor.get_spec.remote(), timeout=START_TIMEOUT_S)
                except ray.exceptions.GetTimeoutError as err:
                    raise PoolError(
                        f"fleet member {s.member.name}: its worker did not start within {START_TIMEOUT_S:.0f} s "
                        f"(the cluster has no free {self._options(s.member)} for it?)"
                    ) from err
                except ray.exceptions.RayError as err:
                    env = s.member.env
                    raise PoolError(
                        f"fleet member {s.member.name}: the environment {env.backend}:{env.task} could not start: "
                        f"{root_cause(err)} (`rlinf-user doctor` lists what is missing)"
                    ) from err
        self.spec = union_spec(specs, len(self.members), wants_member_id(self.cfg, self.members))
        for s in running:
            ident = ray.get(s.actor.attach.remote(self.spec))
            s.nodes.append(ident["node"])
        return self.spec

    def set_sink(self, sink, wait: bool = True) -> None:
        """Where transitions go; workers started later get it at construction. Without
        ``wait`` the call queues behind each worker's rollouts (they keep unsent chunks)."""
        import ray

        self.sink = sink
        refs = [s.actor.set_sink.remote(sink) for s in self.slots if s.status == "running"]
        if wait:
            ray.get(refs)

    def set_rollout(self, server, wait: bool = True) -> None:
        """The rollout server acting for the workers (again after it was restarted)."""
        import ray

        self.rollout = server
        refs = [s.actor.set_rollout.remote(server) for s in self.slots if s.status == "running"]
        if wait:
            ray.get(refs)

    # -- failures and arrivals -------------------------------------------------------------
    def failed(self, slot: Slot, err: BaseException) -> bool:
        """A slot's worker died. Returns True when a replacement was started now."""
        import ray

        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone with its node
            pass
        slot.actor = None
        slot.generation += 1
        gone = self._node_gone(slot, err)
        if slot.elastic and gone:
            slot.status = "retired"  # an added worker leaves with its node; the others go on
            log.warning("elastic worker %d: its node left; %d env workers go on", slot.index, len(self.running()))
            self._left(slot)
            return False
        if gone or not self.available(slot):
            slot.status = "waiting"
            log.warning("fleet member %s (worker %d): its node left; waiting for it to come back", slot.member.name, slot.index)
            return False
        slot.restarts += 1
        if "does not fit this run's learner" in str(err) or ANOTHER_BUILD in str(err):
            slot.status = "retired"
            log.error("fleet member %s cannot join: %s", slot.member.name, root_cause(err))
        elif slot.restarts > MAX_RESTARTS:
            slot.status = "retired"
            log.error("fleet member %s (worker %d) failed %d times: retired (%s)", slot.member.name, slot.index,
                      slot.restarts, root_cause(err))  # fmt: skip
        if slot.status == "retired":
            if not any(s.status in ("running", "waiting") for s in self.slots):
                raise PoolError(f"every env worker failed or was retired (last: {root_cause(err)})")
            return False
        log.error("fleet member %s (worker %d) failed (%s); restarting it", slot.member.name, slot.index, root_cause(err))
        self._spawn(slot)
        return True

    @staticmethod
    def _node_gone(slot: Slot, err: BaseException, grace_s: float = NODE_GRACE_S) -> bool:
        """Whether the worker died with its node (which is not the worker's fault). The
        cluster may take a moment to declare a vanished node dead: ask for a few seconds."""
        import ray

        if "because its node has died" in str(err):
            return True
        if not slot.nodes:
            return False
        deadline = time.monotonic() + grace_s
        while True:
            alive = next((n.get("Alive") for n in ray.nodes() if n.get("NodeID") == slot.nodes[-1]), None)
            if alive is not True:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)

    def arrivals(self) -> list[Slot]:
        """Waiting slots whose node is now up, started (checked every few seconds). A
        member whose env does not fit the learner fails in its constructor and is retired
        by :meth:`failed` with the reason."""
        now = time.monotonic()
        if now - self._last_check < CHECK_EVERY_S:
            return []
        self._last_check = now
        started = []
        for slot in self.slots:
            if slot.status == "waiting" and self.available(slot):
                self._spawn(slot)
                log.info("fleet member %s (worker %d): its node is up; starting", slot.member.name, slot.index)
                started.append(slot)
        if self.growing and self.most() > len(self.slots) - sum(s.status == "retired" for s in self.slots):
            started += self._grow()
        return started

    def most(self) -> int:
        """The live workers the pool may grow to: ``max_workers``, or a re-plan's target."""
        return self.max_workers if self.target is None else min(self.max_workers, self.target)

    def set_target(self, n: int) -> list[Slot]:
        """A re-plan's worker count: above it, the workers last added are marked
        ``retiring`` (the loop retires each once its rollouts in flight came back, so no
        transition is lost); below it, workers are added as CPUs are free. Returns the
        slots marked."""
        self.target = max(1, int(n))
        live = [s for s in self.slots if s.status == "running"]
        marked = []
        # the workers added last go first; worker 0 (the one whose episodes are shown) stays
        order = sorted((s for s in live if s.index != 0), key=lambda s: (not s.elastic, -s.index))
        for slot in order[: max(0, len(live) - self.target)]:
            slot.status = "retiring"
            marked.append(slot)
        if marked:
            log.warning("re-plan: env workers %s retire once their rollouts in flight come back (%d go on)",
                        [s.index for s in marked], len(live) - len(marked))  # fmt: skip
        return marked

    def retire(self, slot: Slot, reason: str = "re-planned") -> None:
        """Retire a worker whose rollouts all came back (its rows are with the learner)."""
        import ray

        if slot.actor is not None:
            try:
                ray.get(slot.actor.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - best effort: its rows are sent already
                pass
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        slot.actor, slot.status = None, "retired"
        self.events.append({"event": "retire", "worker": slot.index, "reason": reason, "at": round(time.time(), 3)})

    def _grow(self) -> list[Slot]:
        """Elastic workers on the cluster's free CPUs, up to ``max_workers`` live ones."""
        import ray

        self._watch_nodes()
        member = self.members[0]
        need = float(self._options(member).get("num_cpus", 1.0) or 0.0)
        free = float(ray.available_resources().get("CPU", 0.0))
        live = len(self.slots) - sum(s.status == "retired" for s in self.slots)
        added = []
        while live < self.most() and free >= max(need, 1e-9):
            slot = Slot(len(self.slots), member, elastic=True)
            self.slots.append(slot)
            self._spawn(slot)
            free, live = free - need, live + 1
            added.append(slot)
            log.info("elastic: the cluster has a free CPU; env worker %d added (%d of at most %d)", slot.index, live,
                     self.most())  # fmt: skip
        return added

    def _watch_nodes(self) -> None:
        """When each alive node was first seen (a join's clock starts there)."""
        import ray

        now = time.monotonic()
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        for node in alive - set(self._nodes):
            self._nodes[node] = now
        for node in set(self._nodes) - alive:
            del self._nodes[node]

    def _left(self, slot: Slot) -> None:
        node = slot.nodes[-1] if slot.nodes else None
        seen = self._nodes.pop(node, None) if node else None
        self.events.append({"event": "leave", "worker": slot.index, "node": node, "at": round(time.time(), 3),
                            "alive_s": None if seen is None else round(time.monotonic() - seen, 2)})  # fmt: skip

    def note(self, slot: Slot, result: dict[str, Any]) -> None:
        node = result.get("node")
        if node and node not in slot.nodes:
            slot.nodes.append(node)
        if slot.elastic and not slot.fed:  # its first rows reached the learner
            slot.fed = True
            seen = self._nodes.get(node, slot.started_at)
            self.events.append({"event": "join", "worker": slot.index, "node": node, "at": round(time.time(), 3),
                                "join_to_first_rows_s": round(time.monotonic() - min(seen, slot.started_at), 2),
                                "start_to_first_rows_s": round(time.monotonic() - slot.started_at, 2)})  # fmt: skip

    # -- views ------------------------------------------------------------------------------
    def running(self) -> list[Slot]:
        return [s for s in self.slots if s.status == "running"]

    def status(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for s in self.slots:
            d = out.setdefault(s.member.name, {"running": 0, "waiting": 0, "retired": 0, "restarts": 0, "nodes": []})
            d["running" if s.status == "retiring" else s.status] += 1
            d["restarts"] += s.restarts
            d["nodes"] = sorted(set(d["nodes"]) | {n for n in s.nodes if n})
        return out

    def close(self) -> None:
        import ray

        for s in self.slots:
            if s.actor is not None:
                try:
                    ray.get(s.actor.close.remote(), timeout=10)
                except Exception:  # noqa: BLE001 - best effort on shutdown
                    pass
                try:
                    ray.kill(s.actor, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass
