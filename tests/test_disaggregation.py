"""Prefill/decode disaggregation in one process: a prefill instance hands each request's real cache
state to a decode instance over a timed transfer, tokens stay those of instances doing both, and a
decode instance lost, or lost while a cache is on its way, loses nothing."""

from __future__ import annotations

import functools

import pytest

from testbed.job.models import MODELS
from testbed.serve.cost import Deployment
from testbed.serve.disaggregation import Pools
from testbed.serve.fleet import Fleet, Outcome
from testbed.serve.instance import BatchPolicy, Instance
from testbed.serve.kv_cache import PagedKVCache
from testbed.serve.proxy import ProxyModel
from testbed.serve.requests import Lengths, StreamSpec, generate
from testbed.topology.presets import PRESETS

DEP = Deployment(MODELS["llama3-8b"], PRESETS["atlas-800t-a2"])
SEED = 9
STREAM = StreamSpec(
    rate=4, horizon_s=12, prompt=Lengths("uniform", 64, 1024), output=Lengths("uniform", 1, 64)
)
NAMES = ("p0", "d0", "d1")
#: a link of 1 ms and 1 GB/s, so that a transfer shows in the stream
LATENCY_S, BANDWIDTH = 1e-3, 1e9


def transfer_s(src: str, dst: str, nbytes: int) -> float:
    return LATENCY_S + nbytes / BANDWIDTH


def instances(roles: dict[str, str]) -> list[Instance]:
    out = []
    for name in NAMES:
        inst = Instance(name, DEP, PagedKVCache(4000, 16, 131072), BatchPolicy(16), ProxyModel(SEED), SEED)
        inst.role = roles.get(name, "both")
        out.append(inst)
    return out


@functools.cache
def served(split: bool, lose: tuple[str, float] | None = None) -> tuple[dict[str, Outcome], tuple[dict, ...]]:
    """The stream on p0 + d0 + d1, disaggregated or each doing both (computed once per session)."""
    log: list[dict[str, object]] = []
    pools = Pools(("p0",), ("d0", "d1"), transfer_s) if split else None
    roles = {"p0": "prefill", "d0": "decode", "d1": "decode"} if split else {}
    fleet = Fleet(
        list(instances(roles)),
        generate(STREAM, SEED),
        dict([lose]) if lose else None,
        detect_s=1.0,
        pools=pools,
        observe=lambda kind, fields: log.append({"kind": kind, **fields}),
    )
    return fleet.run(), tuple(log)


def test_each_request_is_prefilled_on_the_prefill_pool_and_decoded_from_its_sent_cache() -> None:
    split, log = served(True)
    mixed, _ = served(False)
    assert {r: o.tokens for r, o in split.items()} == {r: o.tokens for r, o in mixed.items()}
    sent = {e["request"]: e for e in log if e["kind"] == "kv_transfer"}
    many = [o for o in split.values() if len(o.tokens) > 1]
    assert many and set(sent) == {o.id for o in many}  # one transfer per request past its first token
    for o in many:
        t = sent[o.id]
        assert t["from"] == "p0" and t["to"] == o.instance and o.instance in ("d0", "d1")
        assert t["bytes"] == o.prompt_tokens * 131072  # its prompt's cache, per NPU
        assert t["ready_s"] - t["start_s"] == pytest.approx(LATENCY_S + t["bytes"] / BANDWIDTH)
        assert t["start_s"] == o.times[0] and o.times[1] - o.times[0] >= t["ready_s"] - t["start_s"]
    singles = [o for o in split.values() if len(o.tokens) == 1]
    assert all(o.instance == "p0" for o in singles)  # done at its prefill: nothing to hand on
    iterations = [e for e in log if e["kind"] == "serve_iteration"]
    decoded_on_p0 = [e for e in iterations if e["instance"] == "p0" and e["tokens"] > e["prefilled"]]
    assert not decoded_on_p0  # the prefill instance only ever made first tokens


def test_a_decode_instance_lost_moves_its_requests_and_a_cache_on_its_way_to_the_other() -> None:
    lost, log = served(True, ("d0", 5.0))
    calm, _ = served(True)
    assert all(o.status == "done" for o in lost.values())
    assert {r: o.tokens for r, o in lost.items()} == {r: o.tokens for r, o in calm.items()}
    moved = [o for o in lost.values() if o.moved]
    assert moved and all(o.instance == "d1" for o in moved)  # recomputed on the other decode instance
    late = [e for e in log if e["kind"] == "kv_transfer" and e["to"] == "d0" and e["ready_s"] > 5.0]
    assert late and all(lost[e["request"]].instance == "d1" and lost[e["request"]].moved for e in late)


def test_a_cache_sent_to_a_lost_decode_instance_waits_for_the_loss_to_be_noticed() -> None:
    lost, log = served(True, ("d0", 5.0))
    late = [e for e in log if e["kind"] == "kv_transfer" and e["to"] == "d0" and e["ready_s"] > 5.0]
    assert late and all(lost[e["request"]].times[1] >= 6.0 for e in late)  # d0's loss is noticed at 6 s


def test_with_every_decode_instance_lost_the_prefill_instances_finish_the_requests() -> None:
    log: list[dict[str, object]] = []
    roles = {"p0": "prefill", "d0": "decode", "d1": "decode"}
    fleet = Fleet(
        list(instances(roles)),
        generate(STREAM, SEED),
        {"d0": 3.0, "d1": 4.0},
        detect_s=1.0,
        pools=Pools(("p0",), ("d0", "d1"), transfer_s),
        observe=lambda kind, fields: log.append({"kind": kind, **fields}),
    )
    out = fleet.run()
    calm, _ = served(True)
    assert all(o.status == "done" for o in out.values())
    assert {r: o.tokens for r, o in out.items()} == {r: o.tokens for r, o in calm.items()}
    assert any(
        o.instance == "p0" and len(o.tokens) > 1 for o in out.values()
    )  # decoded where it was prefilled
