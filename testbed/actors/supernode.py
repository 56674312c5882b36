"""The actor of one supernode: it starts, drives and supervises the supernode's NPU processes.

It plays the node agent. Its :mod:`NPU host <testbed.actors.npu_host>` forks
one process per NPU (a spare has no rank yet); the actor keeps a socket to
each, fans every control call out to its NPUs and gathers their answers, so
the controller makes one Ray call per supernode, not one per rank. It
``SIGKILL``s an NPU when a fault asks (a real kill, from another process)
and records each death with the virtual time the NPU reported, so detection
can be modelled exactly. It sees an NPU die the moment its socket ends,
tells its other NPUs and every other supernode (the group abort), and
answers a call in flight on that NPU with :class:`ProcessDied`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from testbed.actors.npu_line import NPULine
from testbed.actors.rank_process import INFO, REFUSED, RELAY, RESULT, SIGNAL
from testbed.actors.rank_signals import RankSignals, hung
from testbed.actors.relay_lines import Item, RelayLines
from testbed.actors.shared_storage import read_marker
from testbed.actors.zombies import ZombieKeeper
from testbed.core.errors import ProcessDied, TestbedError

#: wall seconds a supernode waits for the end of a run's processes and lines before it gives up
#: being kept for another run
RECYCLE_S = 10.0


class Supernode(RankSignals, ZombieKeeper):
    """Host and supervisor of the NPUs of one supernode."""

    def __init__(self, index: int, ranks: list[int], spec: Any, on_node_address: bool = False) -> None:
        """Start the NPU host, then take on supernode ``index`` of a run (:meth:`begin`)."""
        import ray

        self.node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._spawn_lock = threading.Lock()
        self._line, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._host_proc = subprocess.Popen(
            [sys.executable, "-m", "testbed.actors.npu_host", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._wake_r, self._wake_w = os.pipe()
        self._alive: set[NPULine] = set()  # every process forked and not yet seen gone, of any run
        self.begin(index, ranks, spec, on_node_address)
        threading.Thread(target=self._pump, name="supernode", daemon=True).start()

    def begin(self, index: int, ranks: list[int], spec: Any, on_node_address: bool = False) -> int:
        """Take on supernode ``index`` of a run: no NPU yet, nothing recorded, new lines under the
        run's secret; with ``on_node_address`` (a multi-node Ray cluster) its NPUs listen on this Ray
        node's address instead of ``spec.host``. Returns this actor's pid."""
        import ray

        self.index = index
        self.ranks = list(ranks)
        self.guard_s = float(spec.guard_s)
        self.host = ray.util.get_node_ip_address() if on_node_address else spec.host  # type: ignore[no-untyped-call]
        self.topology = spec.topology
        self.run_id = spec.socket_dir  # new for each run: a late word of an earlier run is dropped
        with self._cond:
            self.children: dict[int, NPULine] = {}  # rank -> its process
            self.spares: list[NPULine] = []
            self.deaths: list[dict[str, Any]] = []
            self.notices: list[dict[str, Any]] = []  # preemption notices: the SIGTERMs sent
            self.refusals: list[dict[str, Any]] = []  # peers this supernode's listeners refused
            self.peers: dict[int, Any] = {}  # supernode -> its actor (the others)
            self.zombies.clear()
        # pickle on this line is safe: a socketpair has no address, and only the host holds its end
        with self._spawn_lock:
            self._line.sendall(pickle.dumps(("setup", list(sys.path), spec, index)))
            self._ending = False
        self.lines = RelayLines(
            index,
            self.host,
            spec.secret,
            spec.topology.world,
            self.deliver,
            self._deliver_by_ray,
            self._refused,
        )
        return os.getpid()

    def recycle(self) -> bool:
        """End this run: SIGKILL its NPU processes (spares and cut-off ones too), close its lines, and
        wait (at most :data:`RECYCLE_S`) until every one is seen gone, so that the actor can :meth:`begin`
        another run with nothing of this one left. False if it cannot promise that (its NPU host is
        gone, or something outlived the guard): the caller then ends the actor instead."""
        with self._spawn_lock:  # no fork of this run starts after this, nor lands unseen
            self._ending = True
        with self._cond:
            self.peers = {}  # deaths from now on are this run's end, not news for the other supernodes
            ending = list(self._alive)  # children, spares, cut-off and replaced ones alike
        for child in ending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        self.lines.close()
        deadline = time.monotonic() + RECYCLE_S
        with self._cond:
            while not all(c.ended for c in ending) and time.monotonic() < deadline:
                self._cond.wait(min(1.0, max(0.0, deadline - time.monotonic())))
        ended = all(c.ended for c in ending) and self.lines.ended(max(0.0, deadline - time.monotonic()))
        return ended and self._host_serves(max(0.1, deadline - time.monotonic()))

    def _host_serves(self, timeout: float) -> bool:
        """True if the NPU host answers on its line within ``timeout`` seconds (a SIGKILLed host may
        not have ended yet, but it answers no more)."""
        with self._spawn_lock:
            try:
                self._line.settimeout(timeout)
                self._line.sendall(pickle.dumps(("ping",)))
                return self._line.recv(16) == b"pong"
            except OSError:
                return False

    # --- processes -----------------------------------------------------------
    def _fork(self, rank: int | None) -> NPULine:
        t0 = time.monotonic()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._spawn_lock:
            if self._ending:
                mine.close()
                theirs.close()
                raise TestbedError(f"supernode {self.index}: its run is ending; no NPU starts", rank=rank)
            socket.send_fds(self._line, [pickle.dumps(("spawn", rank, self.host))], [theirs.fileno()])
            theirs.close()
            self._line.settimeout(self.guard_s)
            pid = int(pickle.loads(self._line.recv(4096)))
            child = NPULine(Connection(mine.detach()), pid, rank, self.run_id)
            child.forked_at = t0
            with self._cond:
                self._alive.add(child)
                if rank is None:
                    self.spares.append(child)
                else:
                    self.children[rank] = child
        os.write(self._wake_w, b"w")
        return child

    def _ready(self, children: list[NPULine]) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.guard_s
        with self._cond:
            while any(c.info is None and not c.dead for c in children):
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    break
        for c in children:
            if c.info is None:
                why = "died" if c.dead else f"did not answer within {self.guard_s:.0f} s"
                raise TestbedError(
                    f"supernode {self.index}: the NPU process of rank {c.rank} (pid {c.pid}) {why} at start",
                    rank=c.rank,
                )
        return [dict(c.info or {}, node=self.node_id) for c in children]

    def spawn(self, ranks: list[int]) -> list[dict[str, Any]]:
        """Start a process for each of ``ranks`` (at start, or replacing a dead one); their infos."""
        return self._ready([self._fork(r) for r in ranks])

    def start_spares(self, count: int) -> list[int]:
        """Start ``count`` hot-spare NPU processes (no rank yet); their pids."""
        spares = [self._fork(None) for _ in range(count)]
        self._ready(spares)
        return [c.pid for c in spares]

    def adopt(self, rank: int) -> dict[str, Any] | None:
        """Give ``rank`` to a spare of this supernode; its info, or None when no spare is left."""
        with self._cond:
            if not self.spares:
                return None
            child = self.spares.pop(0)
            child.rank, child.info = rank, None
            self.children[rank] = child
        out = self.run("adopt", {rank: (rank,)})[rank]
        ok, value = pickle.loads(out)[1:] if isinstance(out, bytes) else out
        if not ok:
            raise value or TestbedError(f"supernode {self.index}: the spare for rank {rank} did not answer")
        return dict(value, node=self.node_id)

    def set_peers(self, peers: dict[int, Any]) -> None:
        """The other supernodes' actors by index: each NPU death and relayed marker goes to them."""
        self.peers = dict(peers)

    def line_address(self) -> tuple[str, int, str]:
        """Where other supernodes connect to send this one relayed markers (and the challenge they
        prove the run's secret against)."""
        return self.lines.address

    def set_lines(self, addresses: dict[int, tuple[str, int, str]]) -> None:
        """The other supernodes' line addresses by index."""
        self.lines.set_addresses(addresses)

    def _deliver_by_ray(self, node: int, items: list[Item]) -> None:
        peer = self.peers.get(node)
        if peer is not None:
            peer.deliver.remote(items, self.run_id)

    # --- the line to every NPU ------------------------------------------------
    def _pump(self) -> None:
        """Read every NPU's socket: results, signal requests, and the end of a dead process."""
        watched = selectors.DefaultSelector()  # kept across reads: a wait set per message cost O(NPUs)
        watched.register(self._wake_r, selectors.EVENT_READ, None)
        while True:
            for key, _ in watched.select(timeout=1.0):
                child = key.data
                if child is None:  # woken: a process was added
                    os.read(self._wake_r, 4096)
                    self._watch_new(watched)
                    continue
                try:
                    data = child.conn.recv_bytes()
                except (EOFError, OSError):
                    watched.unregister(child.conn)
                    self._gone(child)
                    continue
                self._received(child, data)

    def _watch_new(self, watched: selectors.BaseSelector) -> None:
        """Watch the sockets of the processes started since the last call."""
        with self._cond:
            fresh = [c for c in self._alive if not c.dead and not c.watched]
        for child in fresh:
            child.watched = True
            watched.register(child.conn, selectors.EVENT_READ, child)

    def _received(self, child: NPULine, data: bytes) -> None:
        # pickled by the NPU process this supernode forked, over their socketpair: see rank_process
        kind, body = data[:1], data[1:]
        if kind == REFUSED:
            self._refused({**pickle.loads(body), "rank": child.rank, "pid": child.pid})
            return
        if kind == RELAY:
            self._relay(*pickle.loads(body))
            return
        if kind == SIGNAL:
            action, rank, t, step, point = pickle.loads(body)
            {"hang": self.freeze, "term": self.terminate}.get(action, self.kill)(rank, t, step, point)
            return
        with self._cond:
            if kind == INFO:  # ready: how long it took from the fork request is its start time
                child.info = {**pickle.loads(body), "start_s": time.monotonic() - child.forked_at}
            elif kind == RESULT:  # the call id leads the pickle: no need to unpickle the result here
                child.busy -= 1
                child.results[int.from_bytes(body[:8], "big")] = body[8:]
            self._cond.notify_all()

    def _gone(self, child: NPULine) -> None:
        with self._cond:
            child.dead = True
            self._cond.notify_all()
        with contextlib.suppress(OSError):
            child.conn.close()
        if child.rank is not None and child.run_id == self.run_id:  # news for its own run only
            address = child.info.get("address") if child.info else None
            self.mark_dead(child.rank, address)
            for peer in list(self.peers.values()):
                peer.mark_dead.remote(child.rank, address, child.run_id)
        with self._cond:
            child.ended = True  # told: a supernode kept for another run may begin it now
            self._alive.discard(child)
            self._cond.notify_all()

    def _relay(self, src: int, epoch: int, peers: list[int], kind: int, header: dict[str, Any]) -> None:
        """Route one marker from ``src`` to each of ``peers``: local NPUs now, the others' supernodes in
        one batch per supernode over its line (:class:`RelayLines`), the marker once per supernode."""
        by_node: dict[int, list[int]] = {}
        for dst in peers:
            by_node.setdefault(self.topology.supernode_of(dst), []).append(dst)
        local = by_node.pop(self.index, [])
        for node, dsts in by_node.items():
            if node in self.peers:
                self.lines.post(node, (src, epoch, kind, header, dsts))
        if local:
            self.deliver([(src, epoch, kind, header, local)])

    def deliver(self, items: list[Item], run_id: str | None = None) -> None:
        """Hand relayed markers ``(src, epoch, kind, header, dsts)`` to this supernode's NPUs ``dsts``:
        one message per NPU for the whole batch (none if they were sent in a run other than
        ``run_id``)."""
        if run_id is not None and run_id != self.run_id:
            return
        by_rank: dict[int, list[tuple[int, int, int, dict[str, Any]]]] = {}
        for src, epoch, kind, header, dsts in items:
            for dst in dsts:
                by_rank.setdefault(dst, []).append((src, epoch, kind, header))
        for dst, markers in by_rank.items():
            child = self.children.get(dst)
            if child is not None:
                child.tell(self._cond, markers=markers)

    def mark_dead(self, rank: int, address: list[Any] | None = None, run_id: str | None = None) -> None:
        """``rank``'s process (listening at ``address``, if known) died: every live NPU here stops
        waiting for it (unless it died in a run other than ``run_id``)."""
        if run_id is not None and run_id != self.run_id:
            return
        with self._cond:
            live = [c for c in self.children.values() if not c.dead and c.rank != rank]
        for c in live:
            c.tell(self._cond, dead=(rank, address))

    def run(self, method: str, args_by_rank: dict[int, tuple[Any, ...]]) -> dict[int, Any]:
        """Call ``method`` on each given rank's NPU at once; per rank, the pickled ``(id, ok, value)``
        the NPU answered, or ``(False, error)`` when it died, froze or did not answer in time."""
        call_id = next(self._ids)
        out: dict[int, Any] = {}
        sent: dict[int, NPULine] = {}
        for rank, args in args_by_rank.items():
            child = self.children.get(rank)
            if child is None or child.dead:
                out[rank] = (False, self._died(rank, child))
                continue
            try:
                child.send_call(self._cond, ("call", call_id, method, args))
                sent[rank] = child
            except OSError:
                out[rank] = (False, self._died(rank, child))
        deadline = time.monotonic() + self.guard_s
        with self._cond:
            while True:
                for rank, child in list(sent.items()):
                    if call_id in child.results:
                        out[rank] = child.results.pop(call_id)
                    elif child.dead:
                        out[rank] = (False, self._died(rank, child))
                    elif child.frozen is not None:
                        out[rank] = (False, hung(child.frozen))
                    else:
                        continue
                    del sent[rank]
                left = deadline - time.monotonic()
                if not sent or left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
        for rank in sent:
            out[rank] = (False, None)  # no answer within the guard: the cluster names it a hang
        return out

    def _died(self, rank: int, child: NPULine | None) -> ProcessDied:
        pid = child.pid if child is not None else None
        return ProcessDied(
            f"the process of rank {rank} (pid {pid}) on supernode {self.index} is gone", rank=rank, pid=pid
        )

    def _refused(self, refusal: dict[str, Any]) -> None:
        """Keep a peer that one of this supernode's listeners refused, for the journal."""
        with self._cond:
            self.refusals.append({**refusal, "supernode": self.index, "wall": time.time()})

    def _take(self, name: str) -> list[dict[str, Any]]:
        with self._cond:
            out: list[dict[str, Any]] = getattr(self, name)
            setattr(self, name, [])
        return out

    def take_refusals(self) -> list[dict[str, Any]]:
        """Peers refused by this supernode's listeners (its lines, its NPUs' data planes) since the
        last call."""
        return self._take("refusals")

    def take_deaths(self) -> list[dict[str, Any]]:
        """Deaths recorded since the last call."""
        return self._take("deaths")

    def take_notices(self) -> list[dict[str, Any]]:
        """Preemption notices (SIGTERMs) sent since the last call."""
        return self._take("notices")

    def pids(self) -> dict[int, int]:
        """Every live NPU process of this supernode by rank (spares under -1, -2, ...), and the host's."""
        with self._cond:
            out = {r: c.pid for r, c in self.children.items() if not c.dead}
            out.update({-1 - i: c.pid for i, c in enumerate(self.spares)})
        return out

    def storage_seen(self, storage: str) -> tuple[str | None, str]:
        """The storage marker's token as this node sees it (None: not at all), and this node's address."""
        return read_marker(storage), self.host

    def pid(self) -> int:
        """This supervisor's own process id."""
        return os.getpid()

    def node(self) -> str | None:
        """The Ray node this supervisor runs on."""
        return self.node_id

    def shutdown(self) -> None:
        """SIGKILL every NPU process and the NPU host (at the end of a run)."""
        with self._cond:
            pids = [c.pid for c in [*self.children.values(), *self.spares]]
        for pid in [*pids, self._host_proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._host_proc.wait(timeout=5.0)
        self.lines.close()
