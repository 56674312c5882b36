"""The ``serve`` section: the serving deployment a team really runs, which the rehearsal models.

::

    serve:
      model: deepseek-v3-671b
      npus: 160            # NPUs of one instance (modelled)
      precision: int8
      batch: 96            # requests per NPU in a decode step
      context: 4096        # cached tokens per request, for the estimate
      slo: {ttft: 2s, tpot: 50ms}

With a ``stream`` the scenario serves: ``instances`` instances of the
deployment, each on ``ranks_per_instance`` NPU processes (instance ``k`` on
ranks ``k n`` to ``k n + n - 1``: its group, whose forward pass runs real
collectives), over a paged KV cache of ``kv_blocks`` blocks, batching
continuously; the stream's requests arrive on the virtual clock::

      instances: 2
      ranks_per_instance: 2    # processes of one instance (they stand for its NPUs)
      autoscale: {min: 1, scale_out_at: 8, startup: 30s, scale_in_after: 30s}   # instances: the most
      disaggregation: {prefill: 1}   # instance0 prefills, the others decode
      kv_blocks: 1200
      kv_cap: 0.9
      preemption: recompute
      stream:
        rate: 4
        horizon: 30s
        prompt: {kind: uniform, low: 64, high: 512}
        output: {kind: uniform, low: 16, high: 96}
        bursts: [{at: 10s, count: 12, prompt: {low: 3000}, output: {low: 200}}]

The NPU is the cluster's preset. :meth:`ServeSection.deployment` puts them
together into a :class:`testbed.serve.cost.Deployment` (docs/serving.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.job.models import MODELS
from testbed.scenario.fields import choice, custom, integer, number, seconds, seconds_schema, section
from testbed.serve.autoscale import AutoscalePolicy
from testbed.serve.colocation import POLICIES, Interference, Window
from testbed.serve.cost import HBM_EFFICIENCY, PRECISIONS, Deployment
from testbed.serve.instance import PREEMPTION, BatchPolicy
from testbed.serve.proxy import ProxyShape
from testbed.serve.requests import LENGTH_KINDS, Burst, Lengths, StreamSpec
from testbed.topology.presets import Preset

#: the longest prompt or output a request may have (the proxy holds every token of it)
MAX_TOKENS = 2**18


@dataclass(frozen=True)
class LengthSection:
    """A token-length distribution: ``fixed`` at ``low``, ``uniform`` on ``[low, high]``, or
    ``lognormal`` about ``median``, clipped to ``[low, high]``."""

    kind: str = choice("fixed", lambda: LENGTH_KINDS, "length distribution", "fixed, uniform or lognormal")
    low: int = integer(128, 1, MAX_TOKENS, "tokens: the fixed length, or the fewest")
    high: int | None = integer(None, 1, MAX_TOKENS, "the most tokens (default: low)", optional=True)
    median: float = number(0.0, 0.0, MAX_TOKENS, "a lognormal's median, tokens")
    sigma: float = number(1.0, 0.0, 10.0, "a lognormal's shape")

    def lengths(self) -> Lengths:
        """As the request stream takes it."""
        return Lengths(
            self.kind, self.low, self.low if self.high is None else self.high, self.median, self.sigma
        )


@dataclass(frozen=True)
class BurstSection:
    """``count`` requests at once at virtual time ``at``, with lengths of their own."""

    at_s: float = seconds(0.0, 0.0, doc="when they arrive", key="at")
    count: int = integer(1, 1, 10**6, "requests in the burst")
    prompt: LengthSection = section(LengthSection, "their prompts' lengths")
    output: LengthSection = section(LengthSection, "their outputs' lengths")


def _lengths_schema(what: str) -> dict[str, Any]:
    whole = {"type": "integer", "minimum": 1}
    props = {
        "kind": {
            "enum": list(LENGTH_KINDS),
            "default": "fixed",
            "description": "fixed, uniform or lognormal",
        },
        "low": {**whole, "default": 128, "description": "tokens: the fixed length, or the fewest"},
        "high": {**whole, "description": "the most tokens (default: low)"},
        "median": {"type": "number", "default": 0.0, "description": "a lognormal's median, tokens"},
        "sigma": {"type": "number", "default": 1.0, "description": "a lognormal's shape"},
    }
    return {"type": "object", "properties": props, "additionalProperties": False, "description": what}


def _bursts_schema() -> dict[str, Any]:
    burst = {
        "at": {**seconds_schema(0.0), "description": "when they arrive (seconds, or a duration)"},
        "count": {"type": "integer", "minimum": 1, "default": 1, "description": "requests in the burst"},
        "prompt": _lengths_schema("their prompts' lengths"),
        "output": _lengths_schema("their outputs' lengths"),
    }
    return {"type": "array", "items": {"type": "object", "properties": burst, "additionalProperties": False}}


@dataclass(frozen=True)
class StreamSection:
    """``stream``: Poisson arrivals of ``rate`` a second up to ``horizon``, their lengths, bursts."""

    rate: float = number(1.0, 0.0, 1e6, "requests a second (Poisson arrivals)")
    horizon_s: float = seconds(60.0, 0.001, doc="arrivals stop after this virtual time", key="horizon")
    prompt: LengthSection = section(LengthSection, "prompt lengths")
    output: LengthSection = section(LengthSection, "output lengths")
    bursts: tuple[BurstSection, ...] = custom((), "bursts", _bursts_schema, "requests arriving together")

    def spec(self) -> StreamSpec:
        """As :func:`testbed.serve.requests.generate` takes it."""
        bursts = tuple(Burst(b.at_s, b.count, b.prompt.lengths(), b.output.lengths()) for b in self.bursts)
        return StreamSpec(self.rate, self.horizon_s, self.prompt.lengths(), self.output.lengths(), bursts)


@dataclass(frozen=True)
class AutoscaleSection:
    """``autoscale``: start and stop instances on load; ``instances`` is then the most that run."""

    min: int = integer(1, 1, 1024, "instances always running")
    scale_out_at: int = integer(8, 1, 2**20, "requests outstanding per running instance that start one more")
    startup_s: float = seconds(
        30.0, 0.0, doc="from the start of an instance to its first request", key="startup"
    )
    scale_in_after_s: float = seconds(
        30.0,
        0.0,
        doc="load below half of scale_out_at this long drains the newest instance",
        key="scale_in_after",
    )

    def policy(self) -> AutoscalePolicy:
        """As the fleet takes it."""
        return AutoscalePolicy(self.min, self.scale_out_at, self.startup_s, self.scale_in_after_s)


@dataclass(frozen=True)
class DisaggregationSection:
    """``disaggregation``: the first ``prefill`` instances prefill, the rest decode, and each
    request's KV cache crosses the fabric between them."""

    prefill: int = integer(1, 1, 1023, "instances that prefill (the first ones; the rest decode)")


@dataclass(frozen=True)
class ServiceLevel:
    """``slo``: the latency a serving team promises."""

    ttft_s: float = seconds(2.0, 0.0, doc="time to first token", key="ttft")
    tpot_s: float = seconds(0.05, 0.0, doc="time per output token after the first", key="tpot")


@dataclass(frozen=True)
class ColocationSection:
    """``colocation``: the serving instances share their NPUs, links and memory pool with the
    scenario's training job (its workload and job), on one virtual clock."""

    policy: str = choice("none", lambda: POLICIES, "co-location policy", "none, or priority (serving first)")
    link_share: float = number(
        0.5, 0.01, 1.0, "serving's share of a link while training's allreduce fills it"
    )
    staging_blocks: int = integer(0, 0, 2**24, "KV blocks a checkpoint's staging takes while it writes")
    queue_bytes: float = number(
        2**20, 0.0, 2**34, "bytes of training's traffic a serving message waits behind per hop of a busy link"
    )

    def interference(self, windows: tuple[Window, ...]) -> Interference:
        """What training's ``windows`` take from serving, before the policy."""
        return Interference(windows, self.link_share, self.staging_blocks, self.queue_bytes)


@dataclass(frozen=True)
class ServeSection:
    """``serve``: the modelled model, its instance, its precision, its batch and its SLO."""

    model: str = choice("llama3-8b", lambda: MODELS, "model", "a named model (testbed.job.models)")
    npus: int = integer(1, 1, 2**20, "NPUs of one serving instance (experts spread over all of them)")
    tp: int = integer(1, 1, 1024, "tensor-parallel degree of attention and the dense weights")
    precision: str = choice("bf16", lambda: PRECISIONS, "precision", "of the weights: bf16 or int8")
    kv_precision: str = choice("bf16", lambda: PRECISIONS, "precision", "of the KV cache: bf16 or int8")
    efficiency: float | None = number(
        None, 0.01, 1.0, "fraction of peak FLOPs while computing (default: the NPU preset's)", optional=True
    )
    hbm_efficiency: float = number(HBM_EFFICIENCY, 0.01, 1.0, "fraction of peak HBM bandwidth a read reaches")
    batch: int = integer(32, 1, 2**16, "requests per NPU in one decode step")
    context: int = integer(4096, 1, 2**22, "cached tokens per request in a decode step (the estimate's)")
    prompt: int = integer(2048, 1, 2**22, "tokens of a prompt (the estimate's time to first token)")
    slo: ServiceLevel = section(ServiceLevel, "the service level: ttft, tpot")
    instances: int = integer(1, 1, 1024, "serving instances, ranks_per_instance NPU processes each")
    ranks_per_instance: int = integer(
        1,
        1,
        ProxyShape().width,
        "NPU processes one instance runs on, its forward pass's collectives real (divides npus and 64)",
    )
    kv_blocks: int | None = integer(
        None,
        1,
        2**24,
        "KV cache blocks per instance (default: what the weights leave of an NPU)",
        optional=True,
    )
    block_tokens: int = integer(16, 1, 4096, "tokens per KV cache block")
    kv_cap: float = number(1.0, 0.01, 1.0, "admit a request only while the cache is at most this full")
    preemption: str = choice(
        "none", lambda: PREEMPTION, "preemption", "on a full cache: none, recompute or swap (to host memory)"
    )
    max_outstanding: int | None = integer(
        None,
        1,
        2**20,
        "admission control: an arrival finding every instance holding this many is rejected (default: queue)",
        optional=True,
    )
    host_bandwidth: float = number(
        32e9, 1e6, 1e13, "bytes a second between an NPU and host memory, each way (swap)"
    )
    prefill_tokens: int = integer(
        16384, 1, 2**22, "tokens an instance prefills in one iteration (a longer prompt alone)"
    )
    disaggregation: DisaggregationSection | None = section(
        DisaggregationSection, "prefill and decode on separate instances (present: on)", present_is_on=True
    )
    autoscale: AutoscaleSection | None = section(
        AutoscaleSection, "start and stop instances on load (present: on)", present_is_on=True
    )
    colocation: ColocationSection | None = section(
        ColocationSection, "serve beside the scenario's training (present: on)", present_is_on=True
    )
    stream: StreamSection | None = section(
        StreamSection, "the requests (present: the scenario serves)", present_is_on=True
    )

    def policy(self) -> BatchPolicy:
        """How each instance batches."""
        return BatchPolicy(self.batch, self.kv_cap, self.preemption, self.prefill_tokens, self.host_bandwidth)

    def deployment(self, npu: Preset) -> Deployment:
        """The instance on ``npu``."""
        return Deployment(
            model=MODELS[self.model],
            npu=npu,
            npus=self.npus,
            tp=self.tp,
            precision=self.precision,
            kv_precision=self.kv_precision,
            efficiency=self.efficiency or npu.efficiency,
            hbm_efficiency=self.hbm_efficiency,
        )
