"""What serving teams measure: TTFT, TPOT, inter-token latency, percentiles, goodput under the SLO.

Pure functions of the requests' outcomes (:class:`~testbed.serve.fleet.Outcome`).
Percentiles are numpy's linear interpolation between order statistics, so
they are the same every run; a request that failed counts as lost, one
turned away by admission control as rejected, and both as outside the SLO.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from testbed.serve.fleet import Outcome


@dataclass(frozen=True)
class ServingFigures:
    """The figures of one serving run."""

    requests: int
    completed: int
    #: admitted and ended without their output (a KV-cache OOM)
    lost: int
    tokens: int
    #: first arrival to last token, seconds of virtual time
    makespan_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    #: p99 of every gap between two tokens of a request (inter-token latency): a short stall
    #: shows here before it moves any request's mean TPOT
    itl_p99_s: float
    latency_p99_s: float
    #: share of requests done within both the TTFT and the TPOT of the SLO
    slo_attainment: float
    preemptions: int
    moved: int
    #: turned away by admission control (never admitted: not lost)
    rejected: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of virtual time over the run."""
        return self.tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        """JSON-ready, the throughput included."""
        out = {k: v for k, v in self.__dict__.items()}
        out["tokens_per_s"] = self.tokens_per_s
        return out


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0 with no values)."""
    xs = list(values)
    return float(np.percentile(xs, q)) if xs else 0.0


def meets_slo(o: Outcome, ttft_s: float, tpot_s: float) -> bool:
    """Done, with its first token within ``ttft_s`` and its tokens after it ``tpot_s`` apart on
    average."""
    if o.status != "done" or o.ttft_s is None:
        return False
    return o.ttft_s <= ttft_s and (o.tpot_s is None or o.tpot_s <= tpot_s)


def figures(outcomes: Iterable[Outcome], ttft_s: float, tpot_s: float) -> ServingFigures:
    """The run's figures under an SLO of ``ttft_s`` and ``tpot_s``."""
    out = list(outcomes)
    done = [o for o in out if o.status == "done"]
    ttft = [o.ttft_s for o in done if o.ttft_s is not None]
    tpot = [o.tpot_s for o in done if o.tpot_s is not None]
    latency = [o.finish_s - o.arrival_s for o in done if o.finish_s is not None]
    gaps = [b - a for o in done for a, b in zip(o.times, o.times[1:])]
    ends = [o.finish_s for o in out if o.finish_s is not None]
    start = min((o.arrival_s for o in out), default=0.0)
    return ServingFigures(
        requests=len(out),
        completed=len(done),
        lost=sum(o.status == "failed" for o in out),
        tokens=sum(len(o.tokens) for o in out),
        makespan_s=max(ends, default=start) - start,
        ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99),
        tpot_p50_s=percentile(tpot, 50),
        tpot_p99_s=percentile(tpot, 99),
        itl_p99_s=percentile(gaps, 99),
        latency_p99_s=percentile(latency, 99),
        slo_attainment=sum(meets_slo(o, ttft_s, tpot_s) for o in out) / len(out) if out else 1.0,
        preemptions=sum(o.preemptions for o in out),
        moved=sum(o.moved for o in out),
        rejected=sum(o.status == "rejected" for o in out),
    )
