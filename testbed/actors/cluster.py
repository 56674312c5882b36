"""The cluster on Ray: one actor process per NPU, one supervising actor per supernode.

Ray is the control plane only: one actor call per rank per control action,
every wait bounded by a wall-clock guard. Data moves on the NPUs' own sockets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.actors.placement import Placement, ray_nodes
from testbed.actors.supernode import Supernode
from testbed.core.errors import HarnessHang, RankHung, TestbedError
from testbed.train.npu import NPU
from testbed.train.rank_spec import RankSpec


@dataclass(frozen=True)
class Outcome:
    """The result of one actor call: a value, or the error as Ray reported it."""

    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """True when the call returned normally."""
        return self.error is None


def unwrap(exc: BaseException) -> BaseException:
    """The testbed error inside a Ray task error, else the Ray error itself."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, TestbedError):
        return cause
    return exc


def is_death(exc: BaseException | None) -> bool:
    """True when Ray reports that the actor's process is gone."""
    return exc is not None and type(exc).__name__ in {"ActorDiedError", "ActorUnavailableError"}


def describe_ray_error(exc: BaseException) -> str:
    """The error's class and the first line of Ray's message, for the journal."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


@functools.cache
def _actor_class(cls: type) -> Any:
    """``cls`` as a Ray actor class: no CPU reserved (NPUs oversubscribe the host), never restarted
    by Ray (the testbed's recovery strategies decide what comes back, and a non-restartable actor's
    death is reported in milliseconds instead of after Ray's death-info wait), and two threads so
    that the controller can tell an NPU blocked in a collective that a peer died."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0, max_concurrency=2)(cls)  # type: ignore[call-overload]


class Cluster:
    """Supervisors and NPU actors of one topology."""

    def __init__(self, spec: RankSpec, guard_s: float = 120.0) -> None:
        # The NPUs' unix sockets live in a folder of this cluster's, removed by stop():
        # a SIGKILLed NPU never removes its own.
        self.socket_dir = tempfile.mkdtemp(prefix="tb-sock-", dir="/tmp")
        self.spec = dataclasses.replace(spec, socket_dir=self.socket_dir)
        self.topology = spec.topology
        self.guard_s = guard_s
        self.supervisors: list[Any] = []
        self.npus: dict[int, Any] = {}
        self.pids: dict[int, int] = {}
        self.addresses: dict[int, list[Any]] = {}
        self.nodes: dict[int, str | None] = {}  # rank -> the Ray node its process runs on
        self.spares: dict[int, list[Any]] = {}  # supernode -> hot-spare NPU actors not yet used
        self.placement: Placement | None = None  # on a multi-node Ray cluster: a bundle per supernode
        self.lost_nodes: dict[int, dict[str, Any]] = {}  # supernode -> the loss of its Ray node
        self.may_hang: set[int] = set()  # ranks armed to freeze themselves (the hang fault)
        self.frozen: dict[int, dict[str, Any]] = {}  # rank -> its supervisor's freeze record
        self.fault_hits: dict[str, int] = {}  # link fault id -> what it acted on, since last taken

    def _actor(self, cls: type, supernode: int, *args: Any) -> Any:
        """A new actor of ``cls`` for ``supernode`` (in its bundle when the run is placed)."""
        options = self.placement.options(supernode) if self.placement else {}
        return _actor_class(cls).options(**options).remote(*args)

    def _npu_actor(self, rank: int) -> Any:
        node = self.topology.supernode_of(rank)
        if node in self.lost_nodes:  # its Ray node is gone: a supervisor on the replacement node first
            self.supervisors[node] = self._actor(Supernode, node, node, self.topology.ranks_of(node))
            del self.lost_nodes[node]
        return self._actor(NPU, node, rank, self.spec, self.supervisors[node])

    def start(self) -> None:
        """Start every supervisor and NPU process (on a multi-node Ray cluster, each supernode on a
        node of its own); wait until all answer."""
        self.placement = Placement.reserve(self.topology.supernodes, self.guard_s)
        self.supervisors = [
            self._actor(Supernode, s, s, self.topology.ranks_of(s)) for s in range(self.topology.supernodes)
        ]
        self.npus = {r: self._npu_actor(r) for r in range(self.topology.world)}
        for rank, out in self.call("info").items():
            if out.error is not None:
                raise TestbedError(f"NPU rank {rank} failed to start: {describe_ray_error(out.error)}")
            self._registered(out.value)

    def _registered(self, info: dict[str, Any]) -> None:
        import ray

        rank = int(info["rank"])
        self.pids[rank] = int(info["pid"])
        self.addresses[rank] = info["address"]
        self.nodes[rank] = info.get("node")
        sup = self.supervisors[self.topology.supernode_of(rank)]
        ray.get(sup.register.remote(rank, self.pids[rank]), timeout=self.guard_s)

    def call(
        self,
        method: str,
        *args: Any,
        ranks: list[int] | None = None,
        per_rank: Callable[[int], tuple[Any, ...]] | None = None,
    ) -> dict[int, Outcome]:
        """Call ``method`` on every rank (or ``ranks``) at once; gather every outcome."""
        import ray

        targets = sorted(self.npus) if ranks is None else ranks
        refs = {
            r: getattr(self.npus[r], method).remote(*(per_rank(r) if per_rank else args)) for r in targets
        }
        rank_of = {ref: r for r, ref in refs.items()}
        out: dict[int, Outcome] = {}
        pending = list(refs.values())
        deadline = time.monotonic() + self.guard_s
        while pending:
            waiting = {rank_of[ref] for ref in pending}
            if waiting <= self.may_hang:  # only ranks armed to freeze are left: have they?
                frozen = self._frozen_among(waiting, pending, deadline)
                for ref in [p for p in pending if rank_of[p] in frozen]:
                    rank = rank_of[ref]
                    record = self.frozen[rank]
                    message = (
                        f"rank {rank} froze at {record['point']} of step {record['step']}; it answers nothing"
                    )
                    out[rank] = Outcome(error=RankHung(message, **record))
                    pending.remove(ref)
                if not pending:
                    break
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                stuck = sorted(rank_of[ref] for ref in pending)
                raise HarnessHang(
                    f"{method} on ranks {stuck} did not return within {self.guard_s:.0f} s of wall time",
                    method=method,
                    ranks=stuck,
                )
            rank = rank_of[ready[0]]
            try:
                out[rank] = Outcome(value=ray.get(ready[0], timeout=0))
            except Exception as exc:  # Ray reports actor death and remote errors here
                out[rank] = Outcome(error=unwrap(exc))
                if is_death(exc):
                    self._tell_survivors(rank, [rank_of[ref] for ref in pending])
        for outcome in out.values():
            self._count_hits(outcome)
        return dict(sorted(out.items()))

    def _count_hits(self, outcome: Outcome) -> None:
        """Add what a rank reports its link faults acted on (in a result, or on its error)."""
        if isinstance(outcome.value, dict):
            hits = outcome.value.get("fault_hits") or {}
        else:
            hits = getattr(outcome.error, "fields", {}).get("fault_hits") or {}
        for fault_id, n in hits.items():
            self.fault_hits[fault_id] = self.fault_hits.get(fault_id, 0) + int(n)

    def take_hits(self) -> dict[str, int]:
        """Every rank's link-fault hits since last taken, summed."""
        out, self.fault_hits = self.fault_hits, {}
        return dict(sorted(out.items()))

    def _frozen_among(self, ranks: set[int], refs: list[Any], deadline: float) -> set[int]:
        """Which of ``ranks`` their supervisors froze; empty as soon as one of ``refs`` returns instead."""
        import ray

        while time.monotonic() < deadline:
            for sup in self.supervisors:
                for record in ray.get(sup.take_hangs.remote(), timeout=self.guard_s):
                    self.frozen[int(record["rank"])] = record
            found = ranks & set(self.frozen)
            if found:
                return found
            ready, _ = ray.wait(refs, num_returns=1, timeout=0.05)
            if ready:
                return set()
        return set()

    def _tell_survivors(self, dead: int, waiting: list[int]) -> None:
        """Let the ranks still in the call stop waiting for ``dead`` (the group abort)."""
        for r in waiting:
            self.npus[r].mark_dead.remote(dead)

    def call_ok(self, method: str, *args: Any, **kw: Any) -> dict[int, Any]:
        """Like :meth:`call`, but raise the root cause if any rank failed.

        The root cause is the error a rank raised itself (``how="direct"``), not
        the copies its peers raised when the group was aborted.
        """
        results = self.call(method, *args, **kw)
        errors = [out.error for out in results.values() if out.error is not None]
        if errors:
            direct = [e for e in errors if isinstance(e, TestbedError) and e.fields.get("how") == "direct"]
            raise (direct or errors)[0]
        return {r: out.value for r, out in results.items()}

    def kill(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """Have ``rank``'s supervisor SIGKILL its process now."""
        import ray

        sup = self.supervisors[self.topology.supernode_of(rank)]
        record: dict[str, Any] = ray.get(sup.kill.remote(rank, t_virtual, step, point), timeout=self.guard_s)
        return record

    def deaths(self, expected: list[int] | None = None) -> list[dict[str, Any]]:
        """Deaths the supervisors recorded since last asked.

        With ``expected``, wait (at most the guard) until each of those ranks' death is
        recorded: Ray can report a killed actor before its supervisor, which waits for the
        process to be gone, has written the record.
        """
        import ray

        found: list[dict[str, Any]] = []
        for loss in self.lost_nodes.values():  # no supervisor is left to tell: the loss says it
            if not loss.get("reported"):
                loss["reported"] = True
                found.extend({**loss["record"], "rank": r, "pid": loss["pids"][r]} for r in loss["ranks"])
        deadline = time.monotonic() + self.guard_s
        while True:
            for node, sup in enumerate(self.supervisors):
                if node not in self.lost_nodes:
                    found.extend(ray.get(sup.take_deaths.remote(), timeout=self.guard_s))
            missing = set(expected or []) - {int(d["rank"]) for d in found}
            if not missing or time.monotonic() > deadline:
                return sorted(found, key=lambda d: d["rank"])
            time.sleep(0.02)

    def start_spares(self, per_supernode: int) -> dict[int, list[int]]:
        """Start ``per_supernode`` hot-spare NPU processes in each supernode; their pids by supernode."""
        import ray

        for node in range(self.topology.supernodes):
            sup = self.supervisors[node]
            self.spares[node] = [self._actor(NPU, node, None, self.spec, sup) for _ in range(per_supernode)]
        pids = {
            node: [int(p) for p in ray.get([a.pid.remote() for a in actors], timeout=self.guard_s)]
            for node, actors in self.spares.items()
        }
        return pids

    def replace_with_spare(self, rank: int) -> tuple[int, bool]:
        """Give ``rank`` to a spare of its supernode (else a new process); returns (pid, spare used)."""
        import ray

        spares = self.spares.get(self.topology.supernode_of(rank), [])
        if not spares:
            return self.replace(rank), False
        actor = spares.pop(0)
        self.npus[rank] = actor
        self._registered(ray.get(actor.adopt.remote(rank), timeout=self.guard_s))
        return self.pids[rank], True

    def replace(self, rank: int) -> int:
        """Start a new process for ``rank`` (the old one is dead); returns its pid."""
        import ray

        self.npus[rank] = self._npu_actor(rank)
        info = ray.get(self.npus[rank].info.remote(), timeout=self.guard_s)
        self._registered(info)
        return self.pids[rank]

    def lose_node(self, supernode: int, t_virtual: float, step: int) -> dict[str, Any]:
        """Take the Ray node of ``supernode`` down for real: its supervisor SIGKILLs the node's raylet,
        and with it every process of the node. Waits (at most the guard) until Ray reports it dead."""
        import ray

        if self.placement is None:
            raise TestbedError(
                f"losing the Ray node of supernode {supernode} needs each supernode on a Ray node of its "
                "own: run on a multi-node Ray cluster (--address), or use node_kill without scope: ray_node",
                supernode=supernode,
            )
        sup = self.supervisors[supernode]
        node_id = ray.get(sup.node.remote(), timeout=self.guard_s)
        if node_id == ray.get_runtime_context().get_node_id():
            raise TestbedError(
                f"supernode {supernode} shares the driver's Ray node {node_id[:8]}: losing it would end "
                "the run itself; give the head node no CPUs (ray start --head --num-cpus=0)",
                supernode=supernode,
            )
        ranks = list(self.topology.ranks_of(supernode))
        record = {"supernode": supernode, "t": t_virtual, "step": step, "point": "ray_node", "gone": True}
        self.lost_nodes[supernode] = {
            "record": record,
            "ranks": ranks,
            "pids": dict(self.pids),
            "node": node_id,
        }
        with contextlib.suppress(Exception):  # the supervisor dies with its node; it may not answer
            ray.get(sup.lose_node.remote(), timeout=self.guard_s)
        deadline = time.monotonic() + self.guard_s
        while time.monotonic() < deadline:
            if not any(n["NodeID"] == node_id and n["Alive"] for n in ray_nodes()):
                return {**record, "node": node_id, "ranks": ranks}
            time.sleep(0.1)
        raise HarnessHang(
            f"Ray still reports node {node_id[:8]} alive {self.guard_s:.0f} s after its raylet was killed"
        )

    def stop(self) -> None:
        """Kill every actor this cluster started, and give back its placement group."""
        import ray

        for actor in [*self.npus.values(), *(a for s in self.spares.values() for a in s), *self.supervisors]:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(actor, no_restart=True)
        self.npus, self.supervisors, self.spares = {}, [], {}
        if self.placement is not None:
            with contextlib.suppress(Exception):
                self.placement.release()
            self.placement = None
        shutil.rmtree(self.socket_dir, ignore_errors=True)
