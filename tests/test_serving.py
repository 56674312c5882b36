"""Serving in one process: the proxy's exact tokens, continuous batching over the paged KV cache,
the KV OOM and preemption, an instance lost, the figures, determinism."""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.errors import TestbedError
from testbed.job.models import MODELS
from testbed.serve.cost import Deployment
from testbed.serve.fleet import Fleet, Outcome
from testbed.serve.instance import BatchPolicy, Instance
from testbed.serve.kv_cache import PagedKVCache
from testbed.serve.metrics import figures, meets_slo
from testbed.serve.proxy import ProxyModel
from testbed.serve.records import Iteration
from testbed.serve.requests import Burst, Lengths, Request, StreamSpec, generate
from testbed.topology.presets import PRESETS

DEP = Deployment(MODELS["llama3-8b"], PRESETS["atlas-800t-a2"])
SEED = 7
#: a steady stream, and at 10 s a burst of twelve long prompts
STREAM = StreamSpec(
    rate=4,
    horizon_s=30,
    prompt=Lengths("uniform", 64, 512),
    output=Lengths("uniform", 16, 96),
    bursts=(Burst(10, 12, Lengths("fixed", 3000, 3000), Lengths("fixed", 200, 200)),),
)


def serve(
    policy: BatchPolicy,
    blocks: int = 1200,
    n: int = 2,
    losses: dict[str, float] | None = None,
    requests: tuple[Request, ...] | None = None,
    seed: int = SEED,
) -> dict[str, Outcome]:
    proxy = ProxyModel(seed)
    insts = [Instance(f"i{k}", DEP, PagedKVCache(blocks, 16, 131072), policy, proxy, seed) for k in range(n)]
    reqs = generate(STREAM, seed) if requests is None else requests
    return Fleet(list(insts), reqs, losses, detect_s=1.0).run()


@pytest.fixture(scope="module")
def roomy() -> dict[str, Outcome]:
    """The stream on caches that never fill: the undisturbed run."""
    return serve(BatchPolicy(64), blocks=100_000)


class Lockstep:
    """The collectives of ``n`` parts of one instance, each part in its own thread: every call
    puts its argument in a shared slot and waits for the others (a barrier with a bound)."""

    def __init__(self, n: int) -> None:
        self.n, self.barrier, self.slots = n, threading.Barrier(n, timeout=30), [None] * n

    def member(self, i: int) -> Any:
        group = self

        class Member:
            def _swap(self, x: Any) -> list[Any]:
                group.slots[i] = x
                group.barrier.wait()
                got = list(group.slots)
                group.barrier.wait()
                return got

            def allreduce(self, x: np.ndarray) -> np.ndarray:
                got = self._swap(x)
                return sum(got[1:], got[0])

            def allgather(self, x: np.ndarray) -> np.ndarray:
                return np.concatenate([g.ravel() for g in self._swap(x)])

            def alltoall(self, blocks: list[np.ndarray]) -> list[np.ndarray]:
                return [sent[i] for sent in self._swap(blocks)]

        return Member()

    def run(self, work: Any) -> list[Any]:
        """``work(i, group_member)`` in ``n`` threads; their results in part order."""
        out: list[Any] = [None] * self.n
        threads = [
            threading.Thread(target=lambda i=i: out.__setitem__(i, work(i, self.member(i))))
            for i in range(self.n)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out


@settings(max_examples=25, deadline=None)
@given(
    parts=st.sampled_from([1, 2, 4, 8, 16]),
    n=st.integers(1, 300),
    seed=st.integers(0, 2**16),
    experts=st.sampled_from([0, 64]),
)
def test_the_parts_of_a_split_proxy_running_their_collectives_pick_the_whole_proxys_tokens(
    parts: int, n: int, seed: int, experts: int
) -> None:
    whole = ProxyModel(seed, experts=experts)
    seqs = [whole.prompt(seed, f"r{k}", n + 7 * k) for k in range(3)]
    last = np.asarray([s[-1] for s in seqs])
    expected = whole.next_tokens(np.stack([whole.prefill(s) for s in seqs]), last)

    def part(i: int, group: Any) -> np.ndarray:
        p = ProxyModel(seed, part=(i, parts), experts=experts)
        return p.next_tokens(np.stack([p.prefill(s) for s in seqs]), last, group if parts > 1 else None)

    for got in Lockstep(parts).run(part):
        assert np.array_equal(got, expected)


def test_the_routed_layer_changes_the_tokens_and_a_part_needs_its_group() -> None:
    seq = np.arange(40) % 512
    dense, moe = ProxyModel(1), ProxyModel(1, experts=64)
    states = np.stack([dense.prefill(seq + k) for k in range(32)])
    last = np.arange(32)
    assert not np.array_equal(dense.next_tokens(states, last), moe.next_tokens(states, last))
    part = ProxyModel(1, part=(0, 2))
    with pytest.raises(TestbedError, match="pass its instance's group"):
        part.next_tokens(part.prefill(np.arange(4))[None, :], np.asarray([3]))
    with pytest.raises(TestbedError, match="does not split a width of 64"):
        ProxyModel(1, part=(2, 2))
    with pytest.raises(TestbedError, match="with parts dividing both"):
        ProxyModel(1, part=(0, 3), experts=64)


@pytest.mark.parametrize("experts", [0, 64])
def test_the_parts_of_a_split_instance_iterate_as_one_whole_instance(experts: int) -> None:
    """Two halves of one instance, each in its own thread with its half of the proxy (and of its
    experts), run the forward pass's collectives together; their iterations (tokens, batches,
    cache, times) are those of one whole instance on the same requests, preemptions included."""
    reqs = [dataclasses.replace(r, arrival_s=0.0) for r in generate(STREAM, SEED)[:40]]  # all queued at once
    policy = BatchPolicy(16, preemption="recompute")

    def instance(part: tuple[int, int]) -> Instance:
        proxy = ProxyModel(SEED, part=part, experts=experts)
        inst = Instance("i", DEP, PagedKVCache(150, 16, 131072), policy, proxy, SEED)
        for r in reqs:
            inst.submit(r)
        return inst

    whole = instance((0, 1)).advance(0.0, math.inf)

    def half(i: int, group: Any) -> list[Iteration]:
        inst = instance((i, 2))
        inst.group = lambda now: group
        return inst.advance(0.0, math.inf)

    assert Lockstep(2).run(half) == [whole, whole]
    assert any(it.preempted for it in whole) and sum(len(it.emitted) for it in whole) > 1000


def test_the_proxys_next_token_does_not_depend_on_the_batch_it_is_computed_in() -> None:
    proxy = ProxyModel(1)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 512, size=n) for n in (5, 40, 300)]
    states = np.stack([proxy.prefill(s) for s in seqs])
    last = np.asarray([s[-1] for s in seqs])
    together = proxy.next_tokens(states, last)
    alone = [int(proxy.next_tokens(states[i : i + 1], last[i : i + 1])[0]) for i in range(3)]
    assert together.tolist() == alone


@given(st.lists(st.integers(0, 511), min_size=2, max_size=60))
@settings(max_examples=50)
def test_extending_the_proxys_state_token_by_token_equals_prefilling_it(tokens: list[int]) -> None:
    proxy = ProxyModel(2)
    state = proxy.prefill(np.asarray(tokens[:1]))
    for i, t in enumerate(tokens[1:], start=1):
        state = proxy.extend(state, i, t)
    assert np.array_equal(state, proxy.prefill(np.asarray(tokens)))


def test_every_request_gets_its_tokens_and_the_cache_ends_empty(roomy: dict[str, Outcome]) -> None:
    reqs = {r.id: r for r in generate(STREAM, SEED)}
    assert set(roomy) == set(reqs)
    for rid, o in roomy.items():
        assert o.status == "done" and len(o.tokens) == reqs[rid].output_tokens == len(o.times)
        assert list(o.times) == sorted(o.times) and o.ttft_s is not None and o.ttft_s > 0
    proxy = ProxyModel(SEED)
    cache = PagedKVCache(100, 16, 1)
    inst = Instance("solo", DEP, cache, BatchPolicy(4), proxy, SEED)
    Fleet([inst], [Request(f"q{i}", 0.0, 40, 10) for i in range(10)]).run()
    assert cache.free_blocks == 100 and not inst.busy


def test_continuous_batching_never_runs_more_than_the_batch_allows() -> None:
    seen: list[int] = []
    proxy = ProxyModel(SEED)
    inst = Instance("solo", DEP, PagedKVCache(1000, 16, 1), BatchPolicy(max_batch=3), proxy, SEED)
    reqs = [Request(f"q{i}", 0.0, 20, 5 + i) for i in range(8)]
    Fleet([inst], reqs, observe=lambda kind, f: seen.append(int(f["batch"]))).run()
    assert max(seen) == 3 and sum(seen) == sum(5 + i for i in range(8))


def test_with_no_cap_a_burst_of_long_prompts_fails_requests_with_a_named_kv_oom() -> None:
    out = serve(BatchPolicy(64, kv_cap=1.0, preemption="none"))
    failed = [o for o in out.values() if o.status == "failed"]
    assert failed
    for o in failed:
        assert o.error is not None and o.error["request"] == o.id
        assert o.error["tokens"] >= 3000 and o.error["free_blocks"] == 0  # type: ignore[operator]
        assert "KV cache full" in str(o.error["error"]) and "blocks in use" in str(o.error["error"])
    assert figures(out.values(), 10, 1).lost == len(failed)


def test_a_cap_and_preemption_lose_nothing_keep_every_token_and_cost_latency(
    roomy: dict[str, Outcome],
) -> None:
    capped = serve(BatchPolicy(64, kv_cap=0.9, preemption="recompute"))
    assert all(o.status == "done" for o in capped.values())
    assert {k: o.tokens for k, o in capped.items()} == {k: o.tokens for k, o in roomy.items()}
    assert figures(capped.values(), 10, 1).ttft_p99_s > figures(roomy.values(), 10, 1).ttft_p99_s


def test_preemption_by_recomputation_gives_back_the_same_tokens(roomy: dict[str, Outcome]) -> None:
    tight = serve(BatchPolicy(64, kv_cap=1.0, preemption="recompute"), blocks=700)
    assert sum(o.preemptions for o in tight.values()) > 0
    assert all(o.status == "done" for o in tight.values())
    assert {k: o.tokens for k, o in tight.items()} == {k: o.tokens for k, o in roomy.items()}


def test_preemption_by_swapping_keeps_every_token_and_pays_the_host_link_instead(
    roomy: dict[str, Outcome],
) -> None:
    seen: list[dict[str, object]] = []
    proxy = ProxyModel(SEED)
    swap = BatchPolicy(64, kv_cap=1.0, preemption="swap")
    insts = [Instance(f"i{k}", DEP, PagedKVCache(700, 16, 131072), swap, proxy, SEED) for k in range(2)]
    swapped = Fleet(list(insts), generate(STREAM, SEED), observe=lambda k, f: seen.append(f)).run()
    assert sum(o.preemptions for o in swapped.values()) > 0
    assert {k: o.tokens for k, o in swapped.items()} == {k: o.tokens for k, o in roomy.items()}
    moved = [int(f["swapped_bytes"]) for f in seen if "swapped_bytes" in f]  # type: ignore[call-overload]
    # whole tokens of 128 KiB cross the host link, out on preemption and back in on re-admission
    assert moved and all(b % 131072 == 0 for b in moved)
    outs = sum(1 for f in seen if f.get("preempted") and "swapped_bytes" in f)
    assert outs > 0


def test_an_instance_lost_mid_decode_loses_no_request_and_no_token(roomy: dict[str, Outcome]) -> None:
    lost = serve(BatchPolicy(64), blocks=100_000, losses={"i0": 12.0})
    assert all(o.status == "done" for o in lost.values())
    assert {k: o.tokens for k, o in lost.items()} == {k: o.tokens for k, o in roomy.items()}
    moved = [o for o in lost.values() if o.moved]
    assert moved and all(o.instance == "i1" for o in moved)
    # their latency pays for the detection and the recomputation
    late = max((o.finish_s or 0) - o.arrival_s for o in moved)
    assert late > max((roomy[o.id].finish_s or 0) - o.arrival_s for o in moved) + 1.0


def test_the_same_stream_and_seed_give_the_same_outcomes_and_another_seed_other_tokens() -> None:
    policy = BatchPolicy(64, kv_cap=0.9, preemption="recompute")
    assert serve(policy) == serve(policy)
    other = serve(policy, requests=generate(STREAM, SEED), seed=SEED + 1)
    assert {k: o.tokens for k, o in other.items()} != {k: o.tokens for k, o in serve(policy).items()}


def test_figures_count_a_failed_request_lost_and_outside_the_slo() -> None:
    ok = Outcome("a", 0.0, 10, (1, 2, 3), (0.5, 0.6, 0.7), "done", "i0")
    slow = Outcome("b", 0.0, 10, (1, 2), (3.0, 4.0), "done", "i0")
    bad = Outcome("c", 1.0, 10, (1,), (1.2,), "failed", "i0", error={"request": "c"})
    f = figures([ok, slow, bad], ttft_s=1.0, tpot_s=0.5)
    assert (f.requests, f.completed, f.lost, f.tokens) == (3, 2, 1, 6)
    assert f.slo_attainment == pytest.approx(1 / 3)
    assert meets_slo(ok, 1.0, 0.5) and not meets_slo(slow, 1.0, 0.5) and not meets_slo(bad, 9, 9)
    assert f.ttft_p99_s == pytest.approx(np.percentile([0.5, 3.0], 99))
    assert f.makespan_s == 4.0 and f.tokens_per_s == 1.5


def test_a_policy_names_an_unknown_preemption() -> None:
    with pytest.raises(Exception, match="preemption 'swap-ish' is not one of none, recompute, swap"):
        BatchPolicy(preemption="swap-ish")


@pytest.mark.parametrize(
    ("blocks", "preemption", "stop"), [(6400, "none", 2), (480, "recompute", 12), (480, "swap", 30)]
)
def test_an_iteration_undone_before_its_tokens_leaves_the_instance_as_it_was(
    blocks: int, preemption: str, stop: int
) -> None:
    """What an NPU does when an armed death falls in a later iteration of its call: it ends the call
    before that iteration, and the next call runs it as if nothing had happened (preemptions and
    swaps in between included)."""
    from testbed.serve.instance import StopBefore

    def fresh() -> Instance:
        policy = BatchPolicy(8, preemption=preemption)
        inst = Instance("i", DEP, PagedKVCache(blocks, 1, 1), policy, ProxyModel(3), 3)  # a block a token
        for k in range(6):
            inst.submit(Request(f"q{k}", 0.0, 100 + 50 * k, 20))
        return inst

    calls = iter(range(1000))

    def stop_there(start: float, end: float, doing: str) -> None:
        if next(calls) == stop:
            raise StopBefore

    undone = fresh()
    first = undone.advance(0.0, float("inf"), stop_there, undoable=True)
    assert len(first) == stop
    as_if = fresh()
    as_if.advance(0.0, first[-1].end_s)  # the same iterations, none undone
    assert vars(undone.cache) == vars(as_if.cache)  # block tables and free heap too
    assert [(r.request.id, r.tokens, r.swapped) for r in undone.running] == [
        (r.request.id, r.tokens, r.swapped) for r in as_if.running
    ]
    rest = undone.advance(first[-1].end_s, float("inf"))
    whole = fresh().advance(0.0, float("inf"))
    assert [*first, *rest] == whole
    assert preemption == "none" or any(it.preempted for it in whole[:stop])


def test_admission_control_turns_away_arrivals_when_every_instance_is_full_and_never_a_moved_one(
    roomy: dict[str, Outcome],
) -> None:
    proxy = ProxyModel(SEED)
    insts = [
        Instance(f"i{k}", DEP, PagedKVCache(100_000, 16, 1), BatchPolicy(64), proxy, SEED) for k in range(2)
    ]
    seen: list[str] = []
    out = Fleet(
        list(insts),
        generate(STREAM, SEED),
        {"i0": 12.0},
        detect_s=1.0,
        observe=lambda kind, f: seen.append(kind),
        max_outstanding=6,
    ).run()
    rejected = [o for o in out.values() if o.status == "rejected"]
    assert rejected and seen.count("request_rejected") == len(rejected)
    assert all(o.moved == 0 and not o.tokens for o in rejected)  # none had been admitted
    assert all(o.tokens == roomy[k].tokens for k, o in out.items() if o.status == "done")
    f = figures(out.values(), 10, 1)
    assert (f.rejected, f.lost) == (len(rejected), 0) and f.completed + f.rejected == f.requests
