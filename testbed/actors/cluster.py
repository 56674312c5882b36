"""The cluster on Ray: one actor per supernode, hosting one OS process per NPU.

Ray is the control plane only: one actor call per supernode per control
action (the supernode fans it out to its NPUs), every wait bounded by a
wall-clock guard. Data moves on the NPUs' own sockets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from testbed.actors import janitor, supernode_pool
from testbed.actors.head_watch import HeadWatch, wait_one
from testbed.actors.outcome import Outcome, describe_ray_error, unwrap, values_or_raise
from testbed.actors.placement import Placement, ray_nodes
from testbed.actors.supernode import Supernode
from testbed.core.errors import HarnessHang, TestbedError
from testbed.train.rank_spec import RankSpec


@functools.cache
def _actor_class(cls: type) -> Any:
    """``cls`` as a Ray actor class: no CPU reserved (NPUs oversubscribe the host), never restarted
    by Ray (the testbed's recovery strategies decide what comes back), and several threads so that a
    supernode can be told of a death while it waits for its NPUs."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0, max_concurrency=8)(cls)  # type: ignore[call-overload]


class Cluster:
    """The supernode actors of one topology and the NPU processes they host."""

    def __init__(self, spec: RankSpec, guard_s: float = 120.0, pooled: bool = False) -> None:
        """``pooled``: take idle supernode actors of this Ray session, and keep them for the next run
        at the end (:mod:`~testbed.actors.supernode_pool`); for runs on a Ray instance that outlives
        them (a test session's, a suite's). A run placed on several Ray nodes never pools."""
        # The NPUs' unix sockets live in a folder of this cluster's that only this user can enter
        # (mkdtemp: 0700), removed by stop(), or by the NPU hosts when the run is killed: a
        # SIGKILLed NPU never removes its own socket.
        self.socket_dir = tempfile.mkdtemp(prefix="tb-sock-", dir="/tmp")
        janitor.keep(self.socket_dir)  # and by the janitor if this driver is SIGKILLed
        self.spec = dataclasses.replace(spec, socket_dir=self.socket_dir)
        self.topology = spec.topology
        self.guard_s = guard_s
        self.pooled = pooled
        self.supervisors: list[Any] = []
        self.npus: dict[int, int] = {}  # rank -> its supernode
        self.pids: dict[int, int] = {}
        self.addresses: dict[int, list[Any]] = {}
        self.nodes: dict[int, str | None] = {}  # rank -> the Ray node its process runs on
        self.start_s: dict[int, float] = {}  # rank -> wall seconds from its fork request to ready
        self.spares: dict[int, list[int]] = {}  # supernode -> pids of hot spares not yet used
        self.placement: Placement | None = None  # on a multi-node Ray cluster: a bundle per supernode
        self.lost_nodes: dict[int, dict[str, Any]] = {}  # supernode -> the loss of its Ray node
        self.fault_hits: dict[str, int] = {}  # link fault id -> what it acted on, since last taken
        self.fault_anchors: dict[str, float] = {}  # anchored link fault id -> when the last rank started it
        #: the watch on Ray's head, if any: every wait of this cluster ends soon after it is lost
        self.head: HeadWatch | None = None

    @property
    def keeps_supernodes(self) -> bool:
        """Whether this cluster takes idle supernode actors and keeps its own for the next run: when
        pooled, unless placed on several Ray nodes (a placement group per run)."""
        return self.pooled and self.placement is None

    def _supernode(self, node: int) -> Any:
        """A new supernode actor (in its bundle when the run is placed)."""
        options = self.placement.options(node) if self.placement else {}
        cls = _actor_class(Supernode).options(**options)
        return cls.remote(node, self.topology.ranks_of(node), self.spec, self.placement is not None)

    def _get(self, ref: Any) -> Any:
        import ray

        deadline = time.monotonic() + self.guard_s
        wait_one([ref], deadline, self.head)
        return ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))

    def start(self) -> None:
        """Start every supernode actor and its NPU processes (on a multi-node Ray cluster, each
        supernode on a node of its own); wait until all answer."""
        import ray

        self.placement = Placement.reserve(self.topology.supernodes, self.guard_s)
        if self.keeps_supernodes:
            self.supervisors = supernode_pool.supernodes(
                self.topology.supernodes,
                lambda sup, node: sup.begin.remote(node, self.topology.ranks_of(node), self.spec),
                self._supernode,
                self.guard_s,
            )
        else:
            self.supervisors = [self._supernode(s) for s in range(self.topology.supernodes)]
        self._introduce()
        refs = [sup.spawn.remote(self.topology.ranks_of(s)) for s, sup in enumerate(self.supervisors)]
        for node, ref in enumerate(refs):
            try:
                infos = ray.get(ref, timeout=self.guard_s)
            except Exception as exc:
                raise TestbedError(
                    f"the NPUs of supernode {node} failed to start: {describe_ray_error(unwrap(exc))}",
                    supernode=node,
                ) from None
            for info in infos:
                self._registered(info)
        self._connect_lines()

    def _introduce(self) -> None:
        """Tell each supernode actor the others (it relays each death of its NPUs to them)."""
        for node, sup in enumerate(self.supervisors):
            sup.set_peers.remote({n: p for n, p in enumerate(self.supervisors) if n != node})

    def _connect_lines(self) -> None:
        """Tell each live supernode actor where the others take relayed markers (their lines)."""
        import ray

        live = {n: sup for n, sup in enumerate(self.supervisors) if n not in self.lost_nodes}
        refs = [sup.line_address.remote() for sup in live.values()]
        addresses = dict(zip(live, ray.get(refs, timeout=self.guard_s), strict=True))
        done = [
            sup.set_lines.remote({n: a for n, a in addresses.items() if n != node})
            for node, sup in live.items()
        ]
        ray.get(done, timeout=self.guard_s)

    def _registered(self, info: dict[str, Any]) -> None:
        rank = int(info["rank"])
        self.npus[rank] = self.topology.supernode_of(rank)
        self.pids[rank] = int(info["pid"])
        self.addresses[rank] = info["address"]
        self.nodes[rank] = info.get("node")
        self.start_s[rank] = float(info.get("start_s", 0.0))

    def call(
        self,
        method: str,
        *args: Any,
        ranks: list[int] | None = None,
        per_rank: Callable[[int], tuple[Any, ...]] | None = None,
        sent: Callable[[], None] | None = None,
    ) -> dict[int, Outcome]:
        """Call ``method`` on every rank (or ``ranks``) at once, one Ray call per supernode; gather
        every outcome. ``sent`` is called once the calls are on their way (the ranks are at work)."""
        import ray

        targets = sorted(self.npus) if ranks is None else ranks
        by_node: dict[int, dict[int, tuple[Any, ...]]] = {}
        for r in targets:
            by_node.setdefault(self.topology.supernode_of(r), {})[r] = per_rank(r) if per_rank else args
        refs = {self.supervisors[n].run.remote(method, batch): n for n, batch in by_node.items()}
        if sent is not None:
            sent()
        out: dict[int, Outcome] = {}
        stuck: list[int] = []
        pending = list(refs)
        deadline = time.monotonic() + self.guard_s + 10.0
        while pending:
            ready, pending = wait_one(pending, deadline, self.head)
            if not ready:
                stuck.extend(r for ref in pending for r in by_node[refs[ref]])
                break
            node = refs[ready[0]]
            try:
                answers = ray.get(ready[0], timeout=0)
            except Exception as exc:  # the supernode's actor is gone (its Ray node was lost)
                for r in by_node[node]:
                    out[r] = Outcome(error=unwrap(exc))
                self._tell_survivors(list(by_node[node]), node)
                continue
            for r, answer in answers.items():
                if isinstance(answer, bytes):
                    _, ok, value = pickle.loads(answer)
                    out[r] = Outcome(value=value) if ok else Outcome(error=unwrap(value))
                elif answer[1] is None:
                    stuck.append(r)
                else:
                    out[r] = Outcome(error=answer[1])
        if stuck:
            raise HarnessHang(
                f"{method} on ranks {sorted(stuck)} did not return within {self.guard_s:.0f} s of wall time",
                method=method,
                ranks=sorted(stuck),
            )
        for outcome in out.values():
            self._count_hits(outcome)
        return dict(sorted(out.items()))

    def _count_hits(self, outcome: Outcome) -> None:
        """Add what a rank reports its link faults acted on (in a result, or on its error), and when it
        started the link faults anchored to a point of the step (the latest rank's, per fault)."""
        found = outcome.value if isinstance(outcome.value, dict) else getattr(outcome.error, "fields", {})
        for fault_id, n in (found.get("fault_hits") or {}).items():
            self.fault_hits[fault_id] = self.fault_hits.get(fault_id, 0) + int(n)
        for fault_id, t in (found.get("fault_anchors") or {}).items():
            self.fault_anchors[fault_id] = max(float(t), self.fault_anchors.get(fault_id, float(t)))

    def take_hits(self) -> dict[str, int]:
        """Every rank's link-fault hits since last taken, summed."""
        out, self.fault_hits = self.fault_hits, {}
        return dict(sorted(out.items()))

    def _tell_survivors(self, dead: list[int], lost: int) -> None:
        """Let every other supernode's NPUs stop waiting for the ``dead`` ranks (the group abort)."""
        for node, sup in enumerate(self.supervisors):
            if node != lost and node not in self.lost_nodes:
                for r in dead:
                    sup.mark_dead.remote(r, self.addresses.get(r), self.socket_dir)

    def call_ok(self, method: str, *args: Any, **kw: Any) -> dict[int, Any]:
        """Like :meth:`call`, but raise the root cause if any rank failed.

        The root cause is the error a rank raised itself (``how="direct"``), not
        the copies its peers raised when the group was aborted.
        """
        return values_or_raise(self.call(method, *args, **kw))

    def kill(self, rank: int, t_virtual: float, step: int, point: str) -> dict[str, Any]:
        """Have ``rank``'s supernode SIGKILL its process now."""
        sup = self.supervisors[self.topology.supernode_of(rank)]
        return dict(self._get(sup.kill.remote(rank, t_virtual, step, point)))

    def detach(self, rank: int, t_virtual: float, step: int) -> dict[str, Any]:
        """Give up ``rank``'s process, which runs on cut off (a zombie), so a new one may take the rank."""
        return dict(
            self._get(self.supervisors[self.topology.supernode_of(rank)].detach.remote(rank, t_virtual, step))
        )

    def zombie_call(self, rank: int, method: str, *args: Any) -> tuple[bool, Any]:
        """Call ``method`` on ``rank``'s detached process, then SIGKILL it; (ok, its value or error)."""
        sup = self.supervisors[self.topology.supernode_of(rank)]
        try:
            return tuple(self._get(sup.zombie_call.remote(rank, method, args)))
        finally:
            self._get(sup.end_zombie.remote(rank))

    def deaths(self, expected: list[int] | None = None) -> list[dict[str, Any]]:
        """Deaths the supernodes recorded since last asked.

        With ``expected``, wait (at most the guard) until each of those ranks' death is
        recorded: a call can report a killed NPU before its supernode, which waits for the
        process to be gone, has written the record.
        """
        found: list[dict[str, Any]] = []
        for loss in self.lost_nodes.values():  # no supervisor is left to tell: the loss says it
            if not loss.get("reported"):
                loss["reported"] = True
                found.extend({**loss["record"], "rank": r, "pid": loss["pids"][r]} for r in loss["ranks"])
        deadline = time.monotonic() + self.guard_s
        while True:
            for node, sup in enumerate(self.supervisors):
                if node not in self.lost_nodes:
                    found.extend(self._get(sup.take_deaths.remote()))
            missing = set(expected or []) - {int(d["rank"]) for d in found}
            if not missing or time.monotonic() > deadline:
                return sorted(found, key=lambda d: d["rank"])
            time.sleep(0.02)

    def notices(self) -> list[dict[str, Any]]:
        """Preemption notices (SIGTERMs) the supernodes sent since last asked, in virtual time order."""
        refs = [s.take_notices.remote() for n, s in enumerate(self.supervisors) if n not in self.lost_nodes]
        return sorted((d for ref in refs for d in self._get(ref)), key=lambda d: (d["t"], d["rank"]))

    def start_spares(self, per_supernode: int) -> dict[int, list[int]]:
        """Start ``per_supernode`` hot-spare NPU processes in each supernode; their pids by supernode."""
        refs = [sup.start_spares.remote(per_supernode) for sup in self.supervisors]
        self.spares = {node: [int(p) for p in self._get(ref)] for node, ref in enumerate(refs)}
        return {node: list(pids) for node, pids in self.spares.items()}

    def replace_with_spare(self, rank: int) -> tuple[int, bool]:
        """Give ``rank`` to a spare of its supernode (else a new process); returns (pid, spare used)."""
        node = self.topology.supernode_of(rank)
        if not self.spares.get(node) or node in self.lost_nodes:
            return self.replace(rank), False
        info = self._get(self.supervisors[node].adopt.remote(rank))
        if info is None:
            return self.replace(rank), False
        self.spares[node].pop(0)
        self._registered(info)
        return self.pids[rank], True

    def replace(self, rank: int) -> int:
        """Start a new process for ``rank`` (the old one is dead); returns its pid."""
        node = self.topology.supernode_of(rank)
        if node in self.lost_nodes:  # its Ray node is gone: a supernode on the replacement node first
            self.supervisors[node] = self._supernode(node)
            self.spares.pop(node, None)
            del self.lost_nodes[node]
            self._introduce()
            self._connect_lines()
        (info,) = self._get(self.supervisors[node].spawn.remote([rank]))
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
        node_id = self._get(sup.node.remote())
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

    def refusals(self) -> list[dict[str, Any]]:
        """Every peer the run's listeners refused since last asked (a connection that did not prove
        the run's secret, or sent bytes outside the wire format), oldest first."""
        import ray

        refs = [
            sup.take_refusals.remote() for n, sup in enumerate(self.supervisors) if n not in self.lost_nodes
        ]
        found = [r for batch in ray.get(refs, timeout=self.guard_s) for r in batch]
        return sorted(found, key=lambda r: float(r.get("wall", 0.0)))

    def storage_seen(self, storage: str) -> dict[int, tuple[str | None, str]]:
        """Per supernode: the storage marker's token as its node sees it, and the node's address."""
        refs = {node: sup.storage_seen.remote(storage) for node, sup in enumerate(self.supervisors)}
        return {node: tuple(self._get(ref)) for node, ref in refs.items()}

    def all_pids(self) -> list[int]:
        """Every process of this cluster: supernode actors, NPU hosts, NPUs and spares."""
        import ray

        refs = [
            (sup.pids.remote(), sup.pid.remote())
            for node, sup in enumerate(self.supervisors)
            if node not in self.lost_nodes
        ]
        out: list[int] = []
        for npus, own in refs:
            out.extend(ray.get(npus, timeout=self.guard_s).values())
            out.append(ray.get(own, timeout=self.guard_s))
        return out

    def stop(self) -> None:
        """End every process this cluster started, and give back its placement group."""
        import ray

        head_lost = self.head is not None and self.head.lost is not None
        live = [sup for node, sup in enumerate(self.supervisors) if node not in self.lost_nodes]
        if self.keeps_supernodes and not head_lost:
            with contextlib.suppress(Exception):  # Ray gone meanwhile: the folder goes all the same
                supernode_pool.keep_or_end(live)
        else:
            ends = []
            for sup in live:
                with contextlib.suppress(Exception):
                    ends.append(sup.shutdown.remote())
            with contextlib.suppress(Exception):
                ray.wait(ends, num_returns=len(ends), timeout=10.0)
            for sup in [] if head_lost else self.supervisors:  # without a head, a kill would wait on it
                with contextlib.suppress(Exception):  # already dead
                    ray.kill(sup, no_restart=True)
        self.npus, self.supervisors, self.spares = {}, [], {}
        if self.placement is not None and not head_lost:
            with contextlib.suppress(Exception):
                self.placement.release()
            self.placement = None
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        janitor.forget(self.socket_dir)
