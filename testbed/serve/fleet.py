"""A serving fleet: instances behind a router, on one virtual clock, with instances lost.

The router sends each arriving request to the instance with the fewest
requests outstanding (the lowest index on a tie). Time advances event by
event: the next arrival, or the iteration of the instance whose clock is
earliest, so the run is the same every time for one stream and seed.

An instance lost at a virtual time (its NPU killed) loses the iteration in
flight; the router notices ``detect_s`` later and sends every request the
instance held to the others, with the tokens already streamed to their
clients, which the new instance recomputes into its cache and does not
generate again. So none is lost and every output is the one an undisturbed
run gives; only latency pays. :class:`Outcome` is each request's record.

Under an :class:`~testbed.serve.autoscale.AutoscalePolicy` only the running
instances take requests, and the fleet starts and stops them on load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from testbed.core.errors import TestbedError
from testbed.serve.autoscale import AutoscalePolicy, Scaler, Scaling
from testbed.serve.disaggregation import Handoffs, Pools
from testbed.serve.records import Iteration
from testbed.serve.requests import Request


@dataclass(frozen=True)
class Outcome:
    """One request's record: where it ran last, what it generated and when, how it ended."""

    id: str
    arrival_s: float
    prompt_tokens: int
    tokens: tuple[int, ...]
    times: tuple[float, ...]
    #: ``done``; ``failed`` (``error`` names why: a KV-cache OOM's request, length and cache); or
    #: ``rejected`` by admission control before it was admitted anywhere
    status: str
    instance: str
    preemptions: int = 0
    #: instances it was moved off when they were lost
    moved: int = 0
    error: dict[str, object] | None = None

    @property
    def ttft_s(self) -> float | None:
        """Time to its first token."""
        return self.times[0] - self.arrival_s if self.times else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with fewer than two)."""
        if len(self.times) < 2:
            return None
        return (self.times[-1] - self.times[0]) / (len(self.times) - 1)

    @property
    def finish_s(self) -> float | None:
        """When its last token came."""
        return self.times[-1] if self.times else None


#: what a fleet tells its observer: (event kind, fields)
Observer = Callable[[str, dict[str, object]], None]


class Server(Protocol):
    """What the fleet needs of an instance: in this process (:class:`Instance`) or on an NPU."""

    name: str

    def submit(self, request: Request, tokens: tuple[int, ...] = (), state: object = None) -> None:
        """Queue a request, with the tokens it already streamed (and its cache, sent by a
        prefill instance)."""

    def advance(self, now: float, until: float) -> list[Iteration]:
        """Iterations from ``now`` while busy and before ``until``; raises :class:`InstanceLost` if
        the instance dies (what it returned before stands)."""


class InstanceLost(TestbedError):
    """A serving instance died (its NPU was killed) during an iteration; ``at_s``: when."""


class Fleet:
    """``instances`` serving ``requests``; ``losses`` maps an instance's name to the virtual time
    it is lost (an instance in this process; one on an NPU dies for real and says when);
    ``detect_s``: how long the router takes to notice."""

    def __init__(
        self,
        instances: list[Server],
        requests: Iterable[Request],
        losses: dict[str, float] | None = None,
        detect_s: float = 0.0,
        observe: Observer | None = None,
        max_outstanding: int | None = None,
        autoscale: AutoscalePolicy | None = None,
        pools: Pools | None = None,
    ) -> None:
        if not instances:
            raise TestbedError("a serving fleet needs at least one instance; give serve.instances >= 1")
        self.instances = {i.name: i for i in instances}
        self.clock = {i.name: 0.0 for i in instances}
        self.held: dict[str, dict[str, Request]] = {i.name: {} for i in instances}
        #: (when the router can route it, the request): its arrival, or for a request moved off a
        #: lost instance when the loss is noticed (the request keeps its arrival: its place in line)
        self.pending = sorted(((r.arrival_s, r) for r in requests), key=lambda p: p[0])
        self.order = {i.name: k for k, i in enumerate(instances)}
        self.losses = dict(losses or {})
        self.detect_s = detect_s
        self.streams: dict[str, list[tuple[int, float]]] = {}
        self.preemptions: dict[str, int] = {}
        self.moved: dict[str, int] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.observe = observe or (lambda kind, fields: None)
        #: admission control: an arrival that finds every instance holding this many is rejected
        self.max_outstanding = max_outstanding
        #: which instances run, under an autoscaling policy (None: all of them, always)
        self.scaler = None if autoscale is None else Scaler(autoscale, [i.name for i in instances])
        #: requests waiting at the router for an instance to come up (autoscaling)
        self.buffered: set[str] = set()
        #: when the router noticed each instance lost
        self.noticed: dict[str, float] = {}
        #: prefill/decode disaggregation: the caches on their way between the pools
        self.handoffs = None if pools is None else Handoffs(pools)
        if self.handoffs is not None and self.scaler is not None:
            raise TestbedError("autoscaling disaggregated pools is not modelled yet; drop one of the two")

    def run(self) -> dict[str, Outcome]:
        """Serve every request to its end; each one's outcome by id."""
        while self.pending or any(self.held.values()):
            busy = [n for n, held in self.held.items() if held]
            soonest = min(busy, key=lambda n: (self.clock[n], self.order[n])) if busy else None
            if self.pending and (soonest is None or self.pending[0][0] <= self.clock[soonest]):
                self._route(*self.pending.pop(0))
            elif soonest is not None:
                self._advance(soonest, self._until(soonest))
        return dict(sorted(self.outcomes.items()))

    def _until(self, name: str) -> float:
        """How far instance ``name`` may run: to the next request the router has; a decode instance
        no further than any busy prefill instance's clock either, since a cache it hands on later
        must not find the decode instance already past it."""
        until = self.pending[0][0] if self.pending else math.inf
        if self.handoffs is None or name in self.handoffs.pools.prefill:
            return until
        prefilling = [self.clock[n] for n in self.handoffs.pools.prefill if self.held.get(n)]
        capped = min([until, *prefilling])
        return capped if capped > self.clock[name] else until

    def _route(self, ready_s: float, r: Request) -> None:
        if not self.instances:
            raise TestbedError(f"request {r.id}: every serving instance is lost; keep at least one")
        if self.handoffs is not None and self._deliver(ready_s, r):
            return
        names = self._running(ready_s)
        if self.handoffs is not None:
            names = self.handoffs.pool(bool(self.streams.get(r.id)), names)
        if not names:  # every running instance is still starting: the request waits for the first
            return self._later(self.scaler.next_ready() if self.scaler else math.inf, r)
        if self.scaler is not None and self._buffer(ready_s, r, names):
            return
        self.buffered.discard(r.id)
        name = min(names, key=lambda n: (len(self.held[n]), self.order[n]))
        full = self.max_outstanding is not None and len(self.held[name]) >= self.max_outstanding
        if full and r.id not in self.moved:  # a request already admitted somewhere is never turned away
            self._reject(r, ready_s)
            return
        self._place(ready_s, r, name)
        if self.scaler is not None:
            self._load(ready_s)

    def _deliver(self, now: float, r: Request) -> bool:
        """``r``'s cache has arrived at its decode instance: place it there (True). If that instance
        was lost on the way, ``r`` is moved: routed afresh once the router knows (True while it
        waits for that, False when it may be routed now)."""
        assert self.handoffs is not None
        sent = self.handoffs.receive(r.id)
        if sent is None:
            return False
        if sent[0] in self.instances:
            self._place(now, r, sent[0], sent[1])
            return True
        self.moved[r.id] = self.moved.get(r.id, 0) + 1
        noticed = self.noticed.get(sent[0], now)
        if noticed > now:
            self._later(noticed, r)
            return True
        return False

    def _later(self, at: float, r: Request) -> None:
        """Route ``r`` at ``at``."""
        self.pending.append((at, r))
        self.pending.sort(key=lambda p: p[0])

    def _place(self, now: float, r: Request, name: str, state: object = None) -> None:
        """Give ``r`` to instance ``name`` at ``now`` (with its cache, sent by a prefill instance)."""
        if not self.held[name]:
            self.clock[name] = max(self.clock[name], now)
        self.held[name][r.id] = r
        self.instances[name].submit(r, tuple(t for t, _ in self.streams.get(r.id, ())), state)

    def _load(self, now: float) -> None:
        """Let the scaler decide on the load at ``now``: requests held and waiting at the router."""
        assert self.scaler is not None
        outstanding = sum(len(h) for h in self.held.values()) + len(self.buffered)
        empty = {n for n, h in self.held.items() if not h}
        for scaling in self.scaler.load(now, outstanding, set(self.instances), empty):
            self._scaled(scaling)

    def _buffer(self, now: float, r: Request, names: list[str]) -> bool:
        """Hold ``r`` at the router until the next instance starting comes up, if every instance
        taking requests already holds what it is scaled for (True: held)."""
        assert self.scaler is not None
        up = self.scaler.next_start(now)
        if up == math.inf or not all(self.scaler.full(len(self.held[n])) for n in names):
            return False
        self.buffered.add(r.id)
        self._later(up, r)
        self._load(now)
        return True

    def _running(self, now: float) -> list[str]:
        """The instances that take requests at ``now``."""
        if self.scaler is None:
            return list(self.instances)
        running = [n for n in self.scaler.routable(now) if n in self.instances]
        if running or self.scaler.next_ready() < math.inf:
            return running
        raise TestbedError("every running serving instance is lost and none is left to start; add instances")

    def _scaled(self, scaling: Scaling | None) -> None:
        if scaling is not None:
            self.observe("instance_scaled", scaling.fields())

    def _reject(self, r: Request, at: float) -> None:
        """Admission control turns ``r`` away at once (an HTTP 429), rather than queue it."""
        why = f"every instance holds {self.max_outstanding} request(s): rejected at admission"
        self.outcomes[r.id] = Outcome(
            r.id, r.arrival_s, r.prompt_tokens, (), (), "rejected", "", error={"error": why}
        )
        self.observe("request_rejected", {"request": r.id, "at_s": at, "outstanding": self.max_outstanding})

    def _advance(self, name: str, until: float) -> None:
        """Run instance ``name`` up to the next arrival; a loss in its way ends it there."""
        now, lost_at = self.clock[name], self.losses.get(name)
        if lost_at is not None and lost_at <= now:
            return self._lose(name, lost_at)
        try:
            its = self.instances[name].advance(now, until)
        except InstanceLost as lost:
            how = {k: v for k, v in lost.fields.items() if k != "at_s"}
            return self._lose(name, float(lost.fields["at_s"]), how)
        for it in its:
            if lost_at is not None and lost_at < it.end_s:
                return self._lose(name, lost_at)
            self._apply(name, it)

    def _apply(self, name: str, it: Iteration) -> None:
        """What one iteration of instance ``name`` streamed and ended."""
        self.clock[name] = it.end_s
        self.observe("serve_iteration", {"instance": name, **_fields(it)})
        for rid, token in it.emitted:
            self.streams.setdefault(rid, []).append((token, it.end_s))
        for rid in it.preempted:
            self.preemptions[rid] = self.preemptions.get(rid, 0) + 1
        for rid in it.finished:
            self._record(self.held[name].pop(rid), "done", name)
        for rid, error in it.failed:
            self._record(self.held[name].pop(rid), "failed", name, error)
            self.observe("request_failed", {"instance": name, "request": rid, **error})
        for (rid, nbytes), state in zip(it.handoff, it.states, strict=True):
            self._hand_off(name, self.held[name].pop(rid), nbytes, state, it.end_s)
        if self.scaler is not None and not self.held[name]:
            self._scaled(self.scaler.emptied(name, it.end_s))

    def _hand_off(self, src: str, r: Request, nbytes: int, state: object, at: float) -> None:
        """``r``'s prefill on ``src`` ended at ``at``: its cache goes to a decode instance."""
        assert self.handoffs is not None, "a prefill instance outside disaggregated pools"
        load = {n: len(h) for n, h in self.held.items()}
        dst = self.handoffs.send(r.id, state, list(self.instances), load)
        ready = at + self.handoffs.pools.transfer_s(src, dst, nbytes)
        self._later(ready, r)
        self.observe(
            "kv_transfer",
            {"request": r.id, "from": src, "to": dst, "bytes": nbytes, "start_s": at, "ready_s": ready},
        )

    def _lose(self, name: str, at: float, how: dict[str, object] | None = None) -> None:
        """The instance died at ``at``: what it made after ``at`` never reached a client, and its
        requests go to the others once the router notices."""
        del self.instances[name]
        self.noticed[name] = at + self.detect_s
        held = self.held.pop(name)
        self.observe(
            "instance_lost",
            {
                "instance": name,
                "at_s": at,
                "requests": len(held),
                "detected_s": at + self.detect_s,
                **(how or {}),
            },
        )
        for r in held.values():
            self.moved[r.id] = self.moved.get(r.id, 0) + 1
            self.pending.append((max(r.arrival_s, at + self.detect_s), r))
        self.pending.sort(key=lambda p: p[0])
        if self.scaler is not None:
            outstanding = sum(len(h) for h in self.held.values()) + len(held)
            self._scaled(self.scaler.replace(name, at + self.detect_s, outstanding, set(self.instances)))

    def _record(self, r: Request, status: str, name: str, error: dict[str, object] | None = None) -> None:
        stream = self.streams.get(r.id, [])
        self.outcomes[r.id] = Outcome(
            id=r.id,
            arrival_s=r.arrival_s,
            prompt_tokens=r.prompt_tokens,
            tokens=tuple(t for t, _ in stream),
            times=tuple(s for _, s in stream),
            status=status,
            instance=name,
            preemptions=self.preemptions.get(r.id, 0),
            moved=self.moved.get(r.id, 0),
            error=error,
        )


def _fields(it: Iteration) -> dict[str, object]:
    return {
        "start_s": it.start_s,
        "duration_s": it.duration_s,
        "batch": it.batch,
        "prefilled": len(it.prefilled),
        "tokens": len(it.emitted),
        "finished": len(it.finished),
        "failed": len(it.failed),
        "preempted": list(it.preempted),
        "kv": it.cache,
        **({"interference": it.interference} if any(it.interference.values()) else {}),
        **({"swapped_bytes": it.swapped_bytes} if it.swapped_bytes else {}),
    }
