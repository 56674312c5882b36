"""A serving run: the scenario's request stream served by instances on NPU processes.

Each instance is one NPU process (ranks 0, 1, ...) holding its scheduler,
paged KV cache and proxy model; the router (a :class:`~testbed.serve.fleet.Fleet`)
runs here and calls each instance once per iteration. A ``node_kill`` with
``at: {time: T}`` on an instance's rank is a real SIGKILL: armed in the
process, it strikes inside the iteration that spans ``T`` (mid-decode), or
the supernode kills the process between calls if it sat idle at ``T``.

Beside it, the same stream is served undisturbed in this process (no fault,
a cache that never fills): its tokens are what every output must equal, and
its latencies what the run's are measured against. The journal has every
iteration (its batch and the KV cache's occupancy), every instance lost,
every request's end (its latencies and a digest of its tokens and of the
undisturbed run's) and the figures of both.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from faults.kind import kinds
from testbed.actors.cluster import Cluster, is_death
from testbed.control import colocated
from testbed.core.errors import TestbedError
from testbed.core.journal import Journal
from testbed.core.units import parse_duration
from testbed.scenario.model import Scenario
from testbed.serve import metrics
from testbed.serve.colocation import Interference, Window, training_windows
from testbed.serve.estimate import serve_estimate
from testbed.serve.fleet import Fleet, InstanceLost, Outcome
from testbed.serve.instance import BatchPolicy, Iteration
from testbed.serve.rank import InstanceConfig
from testbed.serve.requests import Request, generate


class RemoteInstance:
    """An instance on rank ``rank``'s NPU process, killed for real at ``die_at`` if given."""

    def __init__(self, name: str, rank: int, cluster: Cluster, die_at: float | None) -> None:
        self.name, self.rank, self.cluster, self.die_at = name, rank, cluster, die_at
        self.arrived: list[tuple[Request, tuple[int, ...]]] = []

    def submit(self, request: Request, tokens: tuple[int, ...] = ()) -> None:
        """Queue a request for the next call."""
        self.arrived.append((request, tokens))

    def advance(self, now: float, until: float) -> list[Iteration]:
        """Iterations on the NPU up to ``until``; :class:`InstanceLost` when its process dies."""
        if self.die_at is not None and self.die_at < now:  # idle when its time came
            self.cluster.kill(self.rank, self.die_at, -1, "idle")
            raise self._lost(self.die_at)
        arrived, self.arrived = self.arrived, []
        out = self.cluster.call("serve_advance", now, until, arrived, self.die_at, ranks=[self.rank])[
            self.rank
        ]
        if out.error is not None:
            if is_death(out.error):
                raise self._lost(self.die_at if self.die_at is not None else now)
            raise out.error
        value: list[Iteration] = out.value
        return value

    def _lost(self, at: float) -> InstanceLost:
        """The loss, with the supernode's record of the kill: the pid, where it struck (``decode``:
        inside an iteration; ``idle``: between calls) and whether the process is gone."""
        record = next((d for d in self.cluster.deaths(expected=[self.rank]) if d["rank"] == self.rank), {})
        how = {k: record[k] for k in ("pid", "point", "gone") if k in record}
        return InstanceLost(f"{self.name} (rank {self.rank}) died at {at} s", at_s=at, rank=self.rank, **how)


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


def tokens_sha(tokens: tuple[int, ...]) -> str:
    """A short digest of a token stream."""
    return hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]


def _config(
    scenario: Scenario,
    name: str,
    blocks: int,
    policy: BatchPolicy,
    interference: Interference | None = None,
) -> InstanceConfig:
    s = scenario.serve
    assert s is not None
    dep = s.deployment(scenario.cluster.topology().preset)
    return InstanceConfig(
        name, dep, blocks, s.block_tokens, policy, scenario.seed, interference or Interference()
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
    instances = [_config(scenario, f"instance{k}", roomy, policy).instance() for k in range(s.instances)]
    return Fleet(list(instances), requests).run()


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
    # co-located, the faults strike training; alone, serving
    kills, windows = ({}, {}) if s.colocation else (instance_kills(scenario), fault_windows(scenario))
    configs = {
        r: _config(scenario, names[r], blocks, s.policy(), protected.with_windows(windows.get(r, ())))
        for r in range(s.instances)
    }
    detection = scenario.policy.detection
    detect_s = detection.timeout_s if detection else 0.0
    start = _start_fields(scenario, configs, len(requests), kills, detect_s)
    if windows:  # [start, end (None: to the end), kind] of each window, by instance
        start["faults"] = {
            configs[r].name: [[w.start_s, None if w.end_s == math.inf else w.end_s, w.kind] for w in ws]
            for r, ws in windows.items()
            if r in configs
        }
    journal.emit("serve_start", **start)
    cluster.call_ok("serve_open", per_rank=lambda r: (configs[r],), ranks=sorted(configs))
    remote = [RemoteInstance(names[r], r, cluster, kills.get(r)) for r in sorted(configs)]
    outcomes = Fleet(
        list(remote),
        requests,
        detect_s=detect_s,
        observe=lambda kind, fields: journal.emit(kind, **fields),
        max_outstanding=s.max_outstanding,
    ).run()
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
        "instances": {c.name: r for r, c in configs.items()},
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
        "kills": {configs[r].name: t for r, t in kills.items() if r in configs},
        "colocated": s.colocation is not None,
        "detect_s": detect_s,
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
