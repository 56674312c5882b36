"""A serving run: the scenario's request stream served by instances on NPU processes.

Each instance is ``ranks_per_instance`` NPU processes (instance ``k`` on
ranks ``k n`` to ``k n + n - 1``), each holding the instance's scheduler, its
part of the paged KV cache and of the proxy model, and its activation
memory; the router (a :class:`~testbed.serve.fleet.Fleet`, with its
autoscaling or its prefill and decode pools) runs here and calls an instance
once per arrival it has to serve up to. A ``node_kill`` with ``at: {time:
T}`` on an instance's rank is a real SIGKILL: armed in the process, it
strikes inside the iteration that spans ``T`` (mid-prefill or mid-decode), or the supernode
kills the process between calls if it sat idle at ``T``.

Beside it, the same stream is served undisturbed in this process (no fault,
a cache that never fills): its tokens are what every output must equal, and
its latencies what the run's are measured against. The journal has every
iteration (its batch and the KV cache's occupancy), every instance lost,
every request's end (its latencies and a digest of its tokens and of the
undisturbed run's) and the figures of both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

from faults.kind import kinds
from testbed.actors.cluster import Cluster
from testbed.actors.outcome import is_death
from testbed.control import autoscaled, colocated, disaggregated, in_process
from testbed.core.errors import TestbedError
from testbed.core.journal import Journal
from testbed.core.units import parse_duration
from testbed.scenario.model import Scenario
from testbed.serve import metrics
from testbed.serve.colocation import Interference, Window, training_windows
from testbed.serve.estimate import serve_estimate
from testbed.serve.fleet import Fleet, InstanceLost, Outcome
from testbed.serve.instance import BatchPolicy
from testbed.serve.rank import InstanceConfig
from testbed.serve.records import Iteration
from testbed.serve.requests import Request, generate
from testbed.serve.workspace import MemoryPlan, capacity_for


class RemoteInstance:
    """An instance on the NPU processes of ``ranks`` (its group, or one rank), whose process of
    rank ``victim`` is killed for real at ``die_at`` if given."""

    def __init__(
        self,
        name: str,
        ranks: list[int],
        cluster: Cluster,
        die_at: float | None,
        victim: int | None = None,
    ) -> None:
        self.name, self.ranks, self.cluster, self.die_at = name, ranks, cluster, die_at
        self.victim = ranks[0] if victim is None else victim
        self.arrived: list[tuple[Request, tuple[int, ...], Any]] = []

    def submit(self, request: Request, tokens: tuple[int, ...] = (), state: object = None) -> None:
        """Queue a request for the next call (with its cache, one part per rank, if a prefill
        instance sent it)."""
        self.arrived.append((request, tokens, state))

    def advance(self, now: float, until: float) -> list[Iteration]:
        """Iterations on the NPUs up to ``until``; :class:`InstanceLost` when one of its processes
        dies. Every rank of a group must report the same iterations."""
        if self.die_at is not None and self.die_at < now:  # idle when its time came
            self.cluster.kill(self.victim, self.die_at, -1, "idle")
            raise self._lost(self.die_at, {})
        arrived, self.arrived = self.arrived, []
        args = (now, until, arrived, self.die_at, self.victim if self.die_at is not None else None)
        out = self.cluster.call("serve_advance", *args, ranks=self.ranks)
        errors = {r: o.error for r, o in out.items() if o.error is not None}
        if any(is_death(e) for e in errors.values()):
            raise self._lost(self.die_at if self.die_at is not None else now, errors)
        if errors:
            raise next(iter(errors.values()))
        value: list[Iteration] = out[self.ranks[0]].value
        for r in self.ranks[1:]:
            if out[r].value != value:
                raise TestbedError(
                    f"instance {self.name}: TP rank {r} iterated otherwise than rank {self.ranks[0]} "
                    "from the same requests; the scheduler must be deterministic, please report it",
                    rank=r,
                )
        return [self._gathered(k, it, out) for k, it in enumerate(value)]

    def _gathered(self, k: int, it: Iteration, out: dict[int, Any]) -> Iteration:
        """Iteration ``k`` with each handed-off cache as its parts, one per rank of the group."""
        if not it.handoff:
            return it
        parts = [out[r].value[k].states for r in self.ranks]
        return dataclasses.replace(it, states=tuple(zip(*parts, strict=True)))

    def _lost(self, at: float, errors: dict[int, BaseException]) -> InstanceLost:
        """The loss, with the supernode's record of the kill: the pid, where it struck (inside an
        iteration, by what it did: ``prefill``, ``decode`` or ``prefill+decode``; ``idle``: between
        calls) and whether the process is gone; in a TP group, how the call ended on each other rank
        (the allreduce the death broke)."""
        deaths = self.cluster.deaths(expected=[self.victim])
        record = next((d for d in deaths if d["rank"] == self.victim), {})
        how: dict[str, Any] = {k: record[k] for k in ("pid", "point", "gone") if k in record}
        if len(self.ranks) > 1:
            how["peers"] = {
                str(r): type(errors[r]).__name__ if r in errors else "returned"
                for r in self.ranks
                if r != self.victim
            }
        why = f"{self.name} (rank {self.victim}) died at {at} s"
        return InstanceLost(why, at_s=at, rank=self.victim, **how)


def instance_kills(scenario: Scenario) -> dict[int, float]:
    """Rank to the virtual time its process is killed: the scenario's faults that strike a serving
    run by ending a process (``node_kill``), each at its ``at: {time: T}``."""
    return {
        int(f.target["rank"]): float(parse_duration(f.at["time"]) or 0.0)
        for f in scenario.faults
        if kinds()[f.kind].serves and kinds()[f.kind].ends_process
    }


def fault_windows(scenario: Scenario) -> dict[int, list[Window]]:
    """Rank to the windows in which the scenario's other serving faults (a straggler, a degraded
    link) act on its instance."""
    out: dict[int, list[Window]] = {}
    for f in scenario.faults:
        kind = kinds()[f.kind]
        if kind.serves and not kind.ends_process:
            for rank, window in kind.serving_windows(f, float(parse_duration(f.at["time"]) or 0.0)):
                out.setdefault(rank, []).append(window)
    return out


def _faults_by_instance(
    scenario: Scenario, groups: list[list[int]]
) -> tuple[dict[int, tuple[int, float]], dict[int, list[Window]]]:
    """By instance: the rank of its group killed first and when, and the windows of the faults that
    slow it (one on any rank of its group slows it all: a group runs at its slowest rank's pace;
    a link inside the group counts once)."""
    by_rank, windows_by_rank = instance_kills(scenario), fault_windows(scenario)
    kills: dict[int, tuple[int, float]] = {}
    windows: dict[int, list[Window]] = {}
    for k, group in enumerate(groups):
        struck = sorted((by_rank[r], r) for r in group if r in by_rank)
        if struck:
            kills[k] = (struck[0][1], struck[0][0])
        for r in group:
            for w in windows_by_rank.get(r, ()):
                if w not in windows.setdefault(k, []):
                    windows[k].append(w)
    return kills, windows


def tokens_sha(tokens: tuple[int, ...]) -> str:
    """A short digest of a token stream."""
    return hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]


def _config(
    scenario: Scenario,
    name: str,
    blocks: int,
    policy: BatchPolicy,
    interference: Interference | None = None,
    group: tuple[int, ...] = (),
) -> InstanceConfig:
    s = scenario.serve
    assert s is not None
    dep = s.deployment(scenario.cluster.topology().preset)
    role = disaggregated.role(scenario, int(name.removeprefix("instance")))
    return InstanceConfig(
        name,
        dep,
        blocks,
        s.block_tokens,
        policy,
        scenario.seed,
        interference or Interference(),
        group,
        role,
        memory_plan(scenario, policy),
    )


def memory_plan(scenario: Scenario, policy: BatchPolicy) -> MemoryPlan:
    """An instance's activation memory (:mod:`testbed.serve.workspace`): sized on its largest pass,
    under the scenario's ``policy.memory``, with its share of the supernode's pool over the fabric."""
    s = scenario.serve
    assert s is not None
    topo = scenario.cluster.topology()
    preset, memory = topo.preset, scenario.policy.memory
    per_token = s.deployment(preset).activation_bytes_per_token()
    return MemoryPlan(
        capacity_for(policy.prefill_tokens + policy.max_batch, per_token),
        per_token,
        policy=memory.on_oom,
        hbm_Bps=preset.hbm_Bps,
        pool_bytes=int(memory.pool_share * preset.hbm_bytes * (topo.npus_per_supernode - 1)),
        pool_Bps=preset.intra.bandwidth_Bps,
    )


def kv_blocks(scenario: Scenario) -> int:
    """KV blocks per instance: the section's, or what the weights leave of an NPU's memory."""
    s = scenario.serve
    assert s is not None
    if s.kv_blocks:
        return s.kv_blocks
    dep = s.deployment(scenario.cluster.topology().preset)
    room = serve_estimate(dep, s.batch, s.context, s.prompt, s.slo.tpot_s).kv_tokens
    return max(1, room // s.block_tokens)


def undisturbed(scenario: Scenario, requests: tuple[Request, ...]) -> dict[str, Outcome]:
    """The stream served in this process with no fault and a cache that never fills."""
    s = scenario.serve
    assert s is not None
    policy = BatchPolicy(max_batch=s.batch, prefill_tokens=s.prefill_tokens)
    # room for every request of the stream at once, whole: no request ever waits for a block
    roomy = sum(-(-(r.prompt_tokens + r.output_tokens) // s.block_tokens) for r in requests) + 1
    names = [f"instance{k}" for k in range(s.instances)]
    configs = [_config(scenario, n, roomy, policy) for n in names]
    return in_process.served(
        scenario, configs, requests, disaggregated.pools(scenario, names, _groups(scenario))
    )[0]


def _groups(scenario: Scenario) -> list[list[int]]:
    """Each instance's ranks: its group."""
    s = scenario.serve
    assert s is not None
    return [list(range(k * s.ranks_per_instance, (k + 1) * s.ranks_per_instance)) for k in range(s.instances)]


def serve(scenario: Scenario, cluster: Cluster, journal: Journal) -> dict[str, Any]:
    """Serve the scenario's stream on its instances; the run's figures (also journalled)."""
    s = scenario.serve
    if s is None or s.stream is None:
        raise TestbedError("a serving run needs a serve section with a stream; add serve.stream")
    requests = generate(s.stream.spec(), scenario.seed)
    blocks, names = kv_blocks(scenario), [f"instance{k}" for k in range(s.instances)]
    unprotected = Interference()
    if s.colocation is not None:  # the training this run journalled is the timeline
        unprotected = s.colocation.interference(training_windows(journal.events))
    protected = unprotected.under(s.colocation.policy) if s.colocation else unprotected
    groups = _groups(scenario)
    # co-located, the faults strike training; alone, serving
    kills, windows = ({}, {}) if s.colocation else _faults_by_instance(scenario, groups)
    configs = {
        k: _config(
            scenario,
            names[k],
            blocks,
            s.policy(),
            protected.with_windows(windows.get(k, ())),
            tuple(groups[k]) if s.ranks_per_instance > 1 else (),
        )
        for k in range(s.instances)
    }
    detection = scenario.policy.detection
    detect_s = detection.timeout_s if detection else 0.0
    start = _start_fields(scenario, configs, len(requests), {k: t for k, (_, t) in kills.items()}, detect_s)
    if windows:  # [start, end (None: to the end), kind] of each window, by instance
        start["faults"] = {
            configs[k].name: [[w.start_s, None if w.end_s == math.inf else w.end_s, w.kind] for w in ws]
            for k, ws in windows.items()
        }
    journal.emit("serve_start", **start)
    addresses = cluster.addresses if s.ranks_per_instance > 1 else None
    ranks = [r for g in groups for r in g]
    cluster.call_ok(
        "serve_open", per_rank=lambda r: (configs[r // s.ranks_per_instance], addresses), ranks=ranks
    )
    remote = []
    for k in range(s.instances):
        victim, die_at = kills.get(k, (None, None))
        remote.append(RemoteInstance(names[k], groups[k], cluster, die_at, victim))
    transfers: list[dict[str, Any]] = []

    def observe(kind: str, fields: dict[str, Any]) -> None:
        journal.emit(kind, **fields)
        if kind == "kv_transfer":
            transfers.append(fields)

    split = disaggregated.pools(scenario, names, groups)
    fleet = Fleet(
        list(remote),
        requests,
        detect_s=detect_s,
        observe=observe,
        max_outstanding=s.max_outstanding,
        autoscale=s.autoscale.policy() if s.autoscale else None,
        pools=split,
    )
    outcomes = fleet.run()
    reference = undisturbed(scenario, requests)
    for rid, o in outcomes.items():
        journal.emit("request_end", **_request_fields(o, reference[rid]))
    run = metrics.figures(outcomes.values(), s.slo.ttft_s, s.slo.tpot_s)
    calm = metrics.figures(reference.values(), s.slo.ttft_s, s.slo.tpot_s)
    figures = {"run": run.as_dict(), "undisturbed": calm.as_dict()}
    journal.emit("serve_end", **figures)
    if s.colocation is not None:
        effects = colocated.effects(scenario, list(configs.values()), requests, unprotected)
        journal.emit("colocation", **effects)
    if split is not None:
        journal.emit(
            "disaggregation",
            **disaggregated.effects(scenario, list(configs.values()), requests, split, transfers),
        )
    if fleet.scaler is not None:
        journal.emit(
            "autoscaling",
            **autoscaled.effects(scenario, list(configs.values()), requests, fleet.scaler, outcomes),
        )
    return figures


def _start_fields(
    scenario: Scenario,
    configs: dict[int, InstanceConfig],
    requests: int,
    kills: dict[int, float],
    detect_s: float,
) -> dict[str, Any]:
    s = scenario.serve
    assert s is not None
    some = next(iter(configs.values()))
    return {
        "instances": {c.name: c.group[0] if c.group else k for k, c in configs.items()},
        **({"groups": {c.name: list(c.group) for c in configs.values()}} if some.group else {}),
        "requests": requests,
        "kv_blocks": some.blocks,
        "block_tokens": s.block_tokens,
        "policy": {
            "max_batch": s.batch,
            "kv_cap": s.kv_cap,
            "preemption": s.preemption,
            "prefill_tokens": s.prefill_tokens,
            **({"max_outstanding": s.max_outstanding} if s.max_outstanding else {}),
        },
        "slo": {"ttft_s": s.slo.ttft_s, "tpot_s": s.slo.tpot_s},
        "kills": {configs[k].name: t for k, t in kills.items()},
        "colocated": s.colocation is not None,
        "detect_s": detect_s,
        **({"autoscaling": dataclasses.asdict(s.autoscale.policy())} if s.autoscale else {}),
        **({"pools": {"prefill": s.disaggregation.prefill}} if s.disaggregation else {}),
    }


def _request_fields(o: Outcome, ref: Outcome) -> dict[str, Any]:
    return {
        "request": o.id,
        "status": o.status,
        "instance": o.instance,
        "arrival_s": o.arrival_s,
        "prompt_tokens": o.prompt_tokens,
        "tokens": len(o.tokens),
        "ttft_s": o.ttft_s,
        "tpot_s": o.tpot_s,
        "finish_s": o.finish_s,
        "preemptions": o.preemptions,
        "moved": o.moved,
        "tokens_sha": tokens_sha(o.tokens),
        "undisturbed_sha": tokens_sha(ref.tokens),
        "undisturbed_finish_s": ref.finish_s,
        **({"error": o.error} if o.error else {}),
    }
