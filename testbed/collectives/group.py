"""A group (communicator) over a subset of ranks, on their endpoints.

A :class:`Group` runs collectives over its ranks, each on its rank's
:class:`~testbed.collectives.endpoint.Endpoint` (what the rank shares between
all its groups: the data plane, the virtual clock, the topology, the
timeouts, the link faults in force, the links already set up). The
algorithms (``ring``, ``mesh``, ...) use only its point-to-point ``send`` and
``recv``, which apply the clock's rules (:mod:`testbed.fabric.clock`) and the timeouts:

- Link setup (建链) is lazy, per (group, algorithm, link): the first message
  on a link pays the seeded setup time, which grows with the number of links
  the algorithm sets up at once. Past ``connect_timeout + 20 s`` the setup
  fails with :class:`LinkSetupTimeout`; a version mismatch between the two
  sides fails it with :class:`LinkSetupError` (HCCL EI0005).
- A receive that would wait past ``exec_timeout`` raises
  :class:`CollectiveTimeout` at ``wait_start + exec_timeout``: true when the
  link dropped the message, false when the message was only late.
- A dead peer raises :class:`PeerLost`.

Whoever raises first tells every other member of the group (an abort frame,
ordered after its data), and they raise the same error, marked ``how="abort"``,
so no rank waits for a message that will never come.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from testbed.collectives import netem_link
from testbed.collectives.endpoint import DEFAULT_VERSION, Endpoint, Hook, Received
from testbed.collectives.modelled import Modelled, scales
from testbed.core.errors import (
    CollectiveTimeout,
    DeviceFault,
    DeviceOOM,
    LinkSetupError,
    LinkSetupTimeout,
    PeerLost,
    Preempted,
    TestbedError,
    UnsupportedOperator,
)
from testbed.fabric.clock import link_setup_s
from testbed.fabric.dataplane import ABORT, DATA, DROP, SETUP_FAIL, Fold, PeerClosed
from testbed.topology.presets import LinkClass

#: HCCL adds 20 s of grace to HCCL_CONNECT_TIMEOUT before failing link setup.
HCCL_CONNECT_GRACE_S = 20.0

_ERRORS: dict[str, type[TestbedError]] = {
    cls.__name__: cls
    for cls in (
        CollectiveTimeout,
        DeviceFault,
        DeviceOOM,
        LinkSetupError,
        LinkSetupTimeout,
        PeerLost,
        Preempted,
        UnsupportedOperator,
    )
}

__all__ = ["DEFAULT_VERSION", "HCCL_CONNECT_GRACE_S", "Endpoint", "Group", "Hook", "Modelled", "abort_job"]


class Group:
    """A communicator: a sorted set of ranks that run collectives together."""

    def __init__(self, ep: Endpoint, name: str, ranks: list[int]) -> None:
        members = sorted(set(ranks))
        if ep.rank not in members:
            raise TestbedError(f"rank {ep.rank} is not in group '{name}' {members}", rank=ep.rank)
        self.ep = ep
        self.name = name
        #: the point each of its collectives fires as it starts (``tp.start``: a TP group's, say), where
        #: a link fault anchored to "the step's first TP collective" begins
        self.start_point = f"{name.split('@')[0]}.start"
        self.ranks = members
        self.seq = 0
        self.tag = ""
        self.op_name = ""
        self.algo = ""
        self.links_at_once = 1
        #: modelled bytes per byte moved, and job calls per call, of the collective in progress
        self.byte_scale = self.call_scale = 1.0
        self.untimed = False  # a send whose time the receiver charges itself (a job-timed pipeline)
        self._p2p: dict[tuple[int, int], int] = {}
        self._attempt = 0
        self.past_mid = False  # the collective in progress passed its middle (``allreduce.mid``)
        self.op_record: list[Any] | None = None  # the collective in progress, as ``Endpoint.ops_run`` has it

    @property
    def rank(self) -> int:
        """This rank (global numbering)."""
        return self.ep.rank

    @property
    def size(self) -> int:
        """Number of ranks in the group."""
        return len(self.ranks)

    @property
    def index(self) -> int:
        """This rank's position in the group."""
        return self.ranks.index(self.ep.rank)

    # --- collective context ----------------------------------------------------
    def _attempt_scope(self) -> str:
        """Counters restart with each attempt at a step, so that after a failed attempt (which
        ranks left at different points) every rank's tags agree again; frames of the failed
        attempt carry its number and are never taken for the new one's."""
        if self._attempt != self.ep.attempt:
            self._attempt, self.seq = self.ep.attempt, 0
            self._p2p.clear()
        return f"{self.name}#{self._attempt}."

    def begin(
        self, op_name: str, algo: str, links_at_once: int, byte_scale: float = 1.0, call_scale: float = 1.0
    ) -> None:
        """Start one collective: a fresh tag, the algorithm's link count for setup, and what it
        stands for (each byte moved as ``byte_scale`` bytes, each message as ``call_scale``)."""
        scope = self._attempt_scope()
        self.byte_scale, self.call_scale, self.untimed = byte_scale, call_scale, False
        self.seq += 1
        self.tag = f"{scope}{self.seq}"
        self.op_name, self.algo = op_name, algo
        self.past_mid = False
        self.links_at_once = max(1, links_at_once)
        self.ep.algorithms_run.append(f"{op_name}:{algo}")
        self.fire(self.start_point)

    def ended(self) -> None:
        """The collective in progress is over (done or failed): its record ends at this rank's clock."""
        if self.op_record is not None:
            self.op_record[5] = self.ep.clock.t
            self.op_record = None

    def fire(self, point: str) -> None:
        """Let an armed fault act at ``point`` (for instance ``allreduce.mid``)."""
        if point == "allreduce.mid":
            self.past_mid = True
        if self.ep.hook is not None:
            self.ep.hook(point)

    # --- point to point --------------------------------------------------------
    def _setup(self, dst: int, start: float, header: dict[str, Any]) -> float:
        """Set the link to ``dst`` up if this (group, algorithm) has not; returns when it is ready."""
        key = (self.name, self.algo, self.rank, dst)
        if key in self.ep.links_up:
            return start
        ep = self.ep
        ep.hit("setup_delay", self.rank, dst, start)
        ep.hit("version", self.rank, -1, start)
        seconds = link_setup_s(
            ep.topology.preset.link_setup, ep.seed, (ep.job_epoch, *key), self.links_at_once
        ) + ep.faults.setup_delay(self.rank, dst, start)
        limit = ep.connect_timeout_s + HCCL_CONNECT_GRACE_S
        if seconds > limit:
            t_fail = start + limit
            ep.dataplane.send(dst, SETUP_FAIL, {"tag": self.tag, "t": t_fail, "setup_s": seconds})
            ep.clock.advance_to(t_fail)
            raise self.origin(self._setup_timeout(self.rank, dst, seconds, t_fail, how="direct"))
        ep.links_up.add(key)
        ep.longest_setup_s = max(ep.longest_setup_s, seconds)
        header["setup"] = {"version": ep.reported_version(self.rank), "setup_s": seconds}
        return start + seconds

    def _setup_timeout(self, src: int, dst: int, seconds: float, t: float, how: str) -> LinkSetupTimeout:
        limit = self.ep.connect_timeout_s
        return LinkSetupTimeout(
            f"rank {self.rank}: link setup {src}->{dst} for {self.op_name}/{self.algo} in group "
            f"'{self.name}' needs {seconds:.1f} s, past the connect timeout {limit:g} s + "
            f"{HCCL_CONNECT_GRACE_S:g} s grace (HCCL EI0006); raise policy.timeouts.connect_s "
            "or warm the group up earlier",
            rank=self.rank,
            pair=[src, dst],
            setup_s=seconds,
            t=t,
            how=how,
            op=self.op_name,
            step=self.ep.step,
        )

    def send(self, dst: int, arr: np.ndarray) -> None:
        """Send ``arr`` to ``dst``: set the link up if needed, then charge the egress."""
        ep = self.ep
        data = np.ascontiguousarray(arr)
        header: dict[str, Any] = {"tag": self.tag, "dtype": data.dtype.str, "shape": data.shape}
        start = max(ep.clock.t, ep.clock.egress_free)
        ep.clock.egress_free = self._setup(dst, start, header)
        t_send = max(ep.clock.t, ep.clock.egress_free)
        base = ep.topology.link(self.rank, dst)
        factor, extra = ep.faults.degraded(self.rank, dst, t_send, ep.seed, f"{self.tag}:{self.rank}>{dst}")
        ep.hit("degrade", self.rank, dst, t_send)
        latency = (
            base.latency_s + extra if self.call_scale == 1.0 else (base.latency_s + extra) * self.call_scale
        )
        link = LinkClass(base.name, latency, base.bandwidth_Bps * factor)
        nbytes = data.nbytes if self.byte_scale == 1.0 else data.nbytes * self.byte_scale
        if self.byte_scale != 1.0 or self.call_scale != 1.0:
            header["modelled_bytes"], header["calls"] = nbytes, self.call_scale
        if netem_link.in_force(ep, dst, t_send):
            return netem_link.send(ep, dst, data, header, link, nbytes, self.call_scale, t_send)
        header["arrival"] = 0.0 if self.untimed else ep.clock.send(nbytes, link)
        # the time on the link, as both ends' timestamps would show it (computed as the rated time is,
        # so that a healthy link's equals its rating exactly)
        header["occupy"] = 0.0 if self.untimed else nbytes / link.bandwidth_Bps
        header["transfer"] = link.latency_s + header["occupy"]
        drop = ep.faults.dropped(self.rank, dst, t_send)
        if drop is not None:
            ep.hit("drop", self.rank, dst, t_send)
            ep.dataplane.send(dst, DROP, {"tag": self.tag, "t": t_send, "fault": drop.fault_id})
            return
        ep.dataplane.send(dst, DATA, header, data.data.cast("B") if data.nbytes else b"")

    def recv(self, src: int) -> np.ndarray:
        """Receive the next array from ``src`` in this collective; the clock advances to its arrival.

        The array owns its memory (nothing else refers to it): callers may keep or change it.
        """
        return self._receive(src, None)

    def recv_into(self, src: int, out: np.ndarray, fold: Fold | None = None) -> np.ndarray:
        """Receive the next array from ``src`` straight into ``out`` (same size and type), or through a
        fresh ``fold`` piece by piece as it arrives (``out`` then holds it only if it lands whole)."""
        got = self._receive(src, out, fold if self.ep.on_payload is None else None)  # a hook sees it whole
        if got is not out:
            raise TestbedError(
                f"rank {self.rank}: {self.op_name} expected {out.nbytes} bytes of {out.dtype} from rank "
                f"{src}, got {got.nbytes} bytes of {got.dtype}; the ranks disagree on the buffer",
                rank=self.rank,
            )
        if fold is not None and not fold.done:
            fold.apply(out.data.cast("B"), 0)
        return out

    def _receive(self, src: int, out: np.ndarray | None, fold: Fold | None = None) -> np.ndarray:
        ep = self.ep
        wait_start = ep.clock.t
        into = out.data.cast("B") if out is not None and out.flags.c_contiguous and out.nbytes else None
        try:
            kind, header, payload = netem_link.recv(ep, src, self.tag, into, ep.job_tag, fold)
        except PeerClosed:
            raise self.origin(self._peer_lost(src, wait_start, how="eof")) from None
        if kind == ABORT:
            raise self.origin(self._from_abort(header, wait_start))
        if kind == DROP:  # a dropped message, or a peer that froze: nothing will ever come
            ep.clock.advance_to(wait_start + ep.exec_timeout_s)
            why = header.get("why") or f"link {src}->{self.rank} dropped the message ({header['fault']})"
            raise self.origin(self._timeout(src, wait_start, True, why))
        if kind == SETUP_FAIL:
            t = max(wait_start, float(header["t"]))
            ep.clock.advance_to(t)
            raise self.origin(self._setup_timeout(src, self.rank, float(header["setup_s"]), t, how="direct"))
        sent = float(header["arrival"])
        plane = ep.topology.link(src, self.rank).name
        arrival = ep.clock.land(sent, float(header.get("occupy", 0.0)), plane, src)  # after its queue
        setup = header.get("setup")
        if setup is not None:
            self._check_versions(src, str(setup["version"]), arrival)
        if arrival - wait_start > ep.exec_timeout_s:
            ep.clock.advance_to(wait_start + ep.exec_timeout_s)
            late = arrival - wait_start
            raise self.origin(
                self._timeout(
                    src,
                    wait_start,
                    False,
                    f"the message arrives {late:.3f} s after the wait began; the peer is alive and only slow",
                )
            )
        wait = ep.clock.receive(arrival)
        ep.wait_by_op[self.op_name] = ep.wait_by_op.get(self.op_name, 0.0) + wait
        dtype = np.dtype(header["dtype"])
        nbytes = header.get("modelled_bytes", math.prod(header["shape"]) * dtype.itemsize)
        ep.observe(
            src, nbytes, float(header["transfer"]), wait, float(header.get("calls", 1.0)), arrival - sent
        )
        if out is not None and dtype == out.dtype and (payload is into or out.nbytes == len(payload) == 0):
            return self._seen(src, out, nbytes, float(header["transfer"]))
        got: np.ndarray = np.frombuffer(payload, dtype=dtype).reshape(header["shape"])
        return self._seen(src, got, nbytes, float(header["transfer"]))

    def _seen(self, src: int, arr: np.ndarray, nbytes: float, transfer_s: float) -> np.ndarray:
        """The array as the rank's payload hook leaves it (written back into ``arr`` if writeable)."""
        hook = self.ep.on_payload
        if hook is None:
            return arr
        half = "allgather" if self.past_mid else "reduce_scatter"
        seen = hook(Received(src, self.op_name, half, nbytes, transfer_s), arr)
        if seen is arr:
            return arr
        if arr.flags.writeable:
            arr[...] = seen
            return arr
        return seen

    def _check_versions(self, src: int, theirs: str, t: float) -> None:
        self.ep.hit("version", self.rank, -1, t)
        mine = self.ep.reported_version(self.rank)
        if theirs == mine:
            return
        self.ep.clock.advance_to(t)
        raise self.origin(
            LinkSetupError(
                f"rank {self.rank}: link setup {src}->{self.rank} in group '{self.name}' failed right after "
                f"connect (HCCL EI0005): rank {src} runs '{theirs}', rank {self.rank} runs '{mine}'; "
                "install the same communication stack and op parameters on every node",
                rank=self.rank,
                pair=[src, self.rank],
                versions={str(src): theirs, str(self.rank): mine},
                t=t,
                how="direct",
                op=self.op_name,
                step=self.ep.step,
            )
        )

    def send_to(
        self, dst: int, arr: np.ndarray, modelled: Modelled | None = None, timed: bool = True
    ) -> None:
        """Point-to-point send outside any collective (matched by :meth:`recv_from` in order), timed
        as the ``modelled`` job's messages if given; not ``timed``, the receiver does not wait for it in
        virtual time (it charges the modelled job's schedule instead)."""
        scope, self.untimed = self._attempt_scope(), not timed
        link = self.ep.topology.link(self.rank, dst)
        self.byte_scale, self.call_scale = scales(modelled, link.latency_s, arr.nbytes / link.bandwidth_Bps)
        n = self._p2p.get((self.rank, dst), 0) + 1
        self._p2p[(self.rank, dst)] = n
        self.tag, self.op_name, self.algo = f"{scope}p2p{self.rank}>{dst}#{n}", "send", "p2p"
        self.fire(self.start_point)
        self.send(dst, arr)

    def recv_from(self, src: int) -> np.ndarray:
        """Point-to-point receive of the next array ``src`` sent with :meth:`send_to`."""
        scope = self._attempt_scope()
        n = self._p2p.get((src, self.rank), 0) + 1
        self._p2p[(src, self.rank)] = n
        self.tag, self.op_name, self.algo = f"{scope}p2p{src}>{self.rank}#{n}", "recv", "p2p"
        self.fire(self.start_point)
        record = self.ep.record_op("recv", "p2p", self.name, 0, self.ep.clock.t)
        before = self.ep.link_obs.get(src, [0.0])[0]
        try:
            return self.recv(src).copy()
        finally:
            if record is not None:  # its bytes as the link saw them (the modelled job's)
                record[3], record[5] = self.ep.link_obs.get(src, [0.0])[0] - before, self.ep.clock.t

    # --- errors ------------------------------------------------------------------
    def _timeout(self, src: int, wait_start: float, true: bool, why: str) -> CollectiveTimeout:
        kind = "true" if true else "false"
        return CollectiveTimeout(
            f"rank {self.rank}: {self.op_name}/{self.algo} in group '{self.name}' at step {self.ep.step} "
            f"waited on rank {src} past the exec timeout of {self.ep.exec_timeout_s:g} s "
            f"({kind} timeout: {why})",
            rank=self.rank,
            peer=src,
            op=self.op_name,
            step=self.ep.step,
            true_timeout=true,
            wait_start=wait_start,
            t=self.ep.clock.t,
            how="direct",
        )

    def _peer_lost(self, peer: int, wait_start: float, how: str) -> PeerLost:
        return PeerLost(
            f"rank {self.rank}: peer rank {peer} lost during {self.op_name} in group '{self.name}' at step "
            f"{self.ep.step} ({how}); the wait began at virtual t={wait_start:.6f} s",
            rank=self.rank,
            peer=peer,
            wait_start=wait_start,
            how=how,
            op=self.op_name,
            step=self.ep.step,
        )

    def _from_abort(self, header: dict[str, Any], wait_start: float) -> TestbedError:
        """The error a neighbour raised, re-raised here as ``how="abort"`` at this rank's own time."""
        fields = dict(header["fields"])
        t = max(wait_start, float(fields.get("t", wait_start)))
        self.ep.clock.advance_to(t)
        origin = int(fields.get("origin", header["from"]))
        cause = str(fields.get("cause", header["message"]))
        fields.update(rank=self.rank, how="abort", wait_start=wait_start, t=t, origin=origin, cause=cause)
        message = f"rank {self.rank}: group '{self.name}' aborted after rank {origin} failed: {cause}"
        return _ERRORS.get(header["error"], TestbedError)(message, **fields)

    def origin(self, err: TestbedError) -> TestbedError:
        """Tell every other member that this collective failed, then hand back ``err`` to raise.

        Inside a training step the job-wide abort that follows tells them (a
        wait on a peer also ends on its job abort), so nothing is sent here: in
        a world of N ranks that all fail, two markers per pair made 2N(N-1).
        """
        if not self.ep.job_abort_follows:
            header = _abort_header(self.tag, self.rank, err)
            self.ep.dataplane.send_markers([m for m in self.ranks if m != self.rank], ABORT, header)
        return err


def _abort_header(tag: str, rank: int, err: TestbedError) -> dict[str, Any]:
    fields = {k: v for k, v in err.fields.items() if isinstance(v, (int, float, str, bool, list, dict))}
    return {"tag": tag, "error": type(err).__name__, "message": err.message, "fields": fields, "from": rank}


def abort_job(ep: Endpoint, peers: list[int], err: TestbedError) -> TestbedError:
    """This rank leaves the step with ``err``: end every wait on it, in any group; returns ``err``.

    A failure in one group must not leave ranks of its other groups waiting
    (a pipeline stage upstream, a DP peer): they receive the error, as the
    frameworks' job-level abort delivers it, and pass it on in turn.
    """
    header = _abort_header(ep.job_tag, ep.rank, err)
    ep.dataplane.send_markers([p for p in peers if p != ep.rank], ABORT, header)
    return err
