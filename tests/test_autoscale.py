"""Elastic serving in one process: instances started on a burst, the router holding what the busy
cannot take, drained and stopped on low load, a lost instance replaced, and the cost counted."""

from __future__ import annotations

import functools
import math

import pytest

from testbed.core.errors import TestbedError
from testbed.job.models import MODELS
from testbed.serve import metrics
from testbed.serve.autoscale import AutoscalePolicy, Scaler
from testbed.serve.cost import Deployment
from testbed.serve.fleet import Fleet, Outcome
from testbed.serve.instance import BatchPolicy, Instance
from testbed.serve.kv_cache import PagedKVCache
from testbed.serve.proxy import ProxyModel
from testbed.serve.requests import Burst, Lengths, StreamSpec, generate
from testbed.topology.presets import PRESETS

DEP = Deployment(MODELS["llama3-8b"], PRESETS["atlas-800t-a2"])
SEED = 4
#: a quiet stream, and at 20 s a burst of 40
STREAM = StreamSpec(
    rate=0.5,
    horizon_s=75,
    prompt=Lengths("uniform", 256, 2048),
    output=Lengths("uniform", 64, 512),
    bursts=(Burst(20, 40, Lengths("uniform", 512, 2048), Lengths("uniform", 128, 384)),),
)
POLICY = AutoscalePolicy(min_instances=1, scale_out_at=12, startup_s=2.0, scale_in_after_s=10.0)


def fleet(
    n: int, autoscale: AutoscalePolicy | None, losses: dict[str, float] | None = None
) -> tuple[Fleet, list]:
    log: list[dict[str, object]] = []
    proxy = ProxyModel(SEED)
    insts = [
        Instance(f"i{k}", DEP, PagedKVCache(4096, 16, 131072), BatchPolicy(16), proxy, SEED) for k in range(n)
    ]
    f = Fleet(
        list(insts),
        generate(STREAM, SEED),
        losses,
        detect_s=2.0,
        autoscale=autoscale,
        observe=lambda kind, fields: log.append(fields) if kind == "instance_scaled" else None,
    )
    return f, log


@functools.cache
def served(n: int, autoscale: AutoscalePolicy | None, lose: tuple[str, float] | None = None):
    """The stream on ``n`` instances (each answer computed once per session)."""
    f, log = fleet(n, autoscale, dict([lose]) if lose else None)
    out = f.run()
    return f, log, out, metrics.figures(out.values(), 5.0, 0.05)


def last_token(out: dict[str, Outcome]) -> float:
    return max(o.finish_s for o in out.values() if o.finish_s is not None)


def test_a_burst_starts_instances_that_stop_again_and_cost_less_than_all_of_them_throughout() -> None:
    f, log, out, fig = served(4, POLICY)
    _, _, out4, _ = served(4, None)
    _, _, _, fig1 = served(1, None)
    starts = [x for x in log if x["action"] == "out"]
    assert [x["instance"] for x in starts] == ["i1", "i2", "i3"] and all(x["at_s"] == 20.0 for x in starts)
    assert all(x["ready_s"] == 22.0 for x in starts)
    drains = [x for x in log if x["action"] == "drain"]
    stops = [x for x in log if x["action"] == "in"]
    assert [x["instance"] for x in drains] == ["i3", "i2", "i1"] == [x["instance"] for x in stops]
    assert all(x["outstanding"] < 6 for x in drains)  # below half of scale_out_at
    assert f.scaler is not None and f.scaler.peak == 4
    spent = f.scaler.finish(last_token(out))
    assert spent < 0.6 * 4 * last_token(out4)
    assert fig.slo_attainment == 1.0 > fig1.slo_attainment  # the burst within the SLO; one alone cannot
    assert all(out[r].tokens == out4[r].tokens for r in out)  # scaling changes no token


def test_the_router_holds_a_burst_for_instances_coming_up_rather_than_queue_it_behind_the_busy() -> None:
    _, _, out, _ = served(4, POLICY)
    burst = [o for o in out.values() if o.id.startswith("b")]
    assert {o.instance for o in burst} == {"i0", "i1", "i2", "i3"}
    assert sum(o.instance == "i0" for o in burst) <= 16  # it took what it was scaled for, not all 60
    assert max(o.ttft_s for o in burst if o.ttft_s is not None) < 5.0


def test_a_cold_start_longer_than_the_ttft_slo_loses_the_burst_its_slo() -> None:
    slow = AutoscalePolicy(1, 12, startup_s=8.0, scale_in_after_s=10.0)
    _, _, _, fig = served(4, slow)
    assert fig.slo_attainment < 0.7 and fig.ttft_p99_s > 8.0


def test_a_lost_instance_below_the_minimum_is_replaced_from_the_stopped_ones() -> None:
    two = AutoscalePolicy(2, 12, startup_s=2.0, scale_in_after_s=10.0)
    _, log, out, _ = served(4, two, ("i0", 10.0))
    (replaced,) = [x for x in log if x["reason"] == "replace"]
    assert replaced["at_s"] == 12.0 and replaced["action"] == "out"  # when the loss was noticed
    assert all(o.status == "done" for o in out.values())
    again = fleet(4, two, {"i0": 10.0})[0].run()  # a fresh fleet: the same run again
    assert {r: (o.tokens, o.times) for r, o in out.items()} == {
        r: (o.tokens, o.times) for r, o in again.items()
    }


def test_the_scaler_counts_instance_seconds_from_start_to_stop_and_names_bad_bounds() -> None:
    s = Scaler(AutoscalePolicy(1, 2, startup_s=5.0, scale_in_after_s=1.0), ["a", "b"])
    (out,) = s.load(10.0, 4, {"a", "b"}, set())
    assert (
        (out.instance, out.ready_s) == ("b", 15.0)
        and s.routable(12.0) == ["a"]
        and s.next_start(12.0) == 15.0
    )
    assert s.load(20.0, 0, {"a", "b"}, {"a", "b"}) == []  # low since 20 s
    drain, stop = s.load(21.0, 0, {"a", "b"}, {"a", "b"})
    assert (drain.action, stop.action, stop.at_s) == ("drain", "in", 21.0)
    assert s.finish(30.0) == pytest.approx(30.0 + 11.0)
    assert s.next_start(30.0) == math.inf
    with pytest.raises(TestbedError, match="min_instances >= 1 and scale_out_at >= 1"):
        AutoscalePolicy(0, 2)
