"""An instance's activation memory: every workspace fits while it is whole, and a fragmentation
fault turns into a borrow, a compaction or a named out-of-memory, as the policy says."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.errors import DeviceOOM
from testbed.job.models import MODELS
from testbed.report.serving_checks import check_serving_faults
from testbed.scenario.expect import Expect
from testbed.serve.colocation import Interference, Window
from testbed.serve.cost import Deployment
from testbed.serve.fleet import Fleet
from testbed.serve.instance import BatchPolicy, Instance
from testbed.serve.kv_cache import PagedKVCache
from testbed.serve.proxy import ProxyModel
from testbed.serve.requests import Request
from testbed.serve.workspace import MemoryPlan, Workspace, capacity_for
from testbed.topology.presets import PRESETS

MiB = 2**20
DEP = Deployment(MODELS["llama3-8b"], PRESETS["atlas-800t-a2"])
PER_TOKEN = DEP.activation_bytes_per_token()
#: 96 MiB blocks with 96 MiB holes in a memory of 2,054 MiB: the largest hole left (the last one
#: and the tail) is 230 MiB, a pass of 3,680 tokens
PATTERN = (96 * MiB, 10, 96 * MiB)


def plan(policy: str, pool: int = 8 * 2**30) -> MemoryPlan:
    capacity = capacity_for(16384 + 32, PER_TOKEN)
    return MemoryPlan(capacity, PER_TOKEN, policy, hbm_Bps=1.6e12, pool_bytes=pool, pool_Bps=56e9)


def test_the_widest_activation_of_a_llama_token_is_its_hidden_state_and_two_ffn_projections() -> None:
    assert PER_TOKEN == (4096 + 2 * 14336) * 2  # 64 KiB in BF16


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 16384), st.integers(0, 32)), min_size=1, max_size=30))
def test_every_pass_up_to_the_peak_fits_an_unfragmented_memory_at_no_cost(
    passes: list[tuple[int, int]],
) -> None:
    ws = Workspace(plan("none"))
    for prefill, decodes in passes:
        assert ws.place_pass(prefill, decodes) == ("all", None)
        ws.release()
    assert ws.costs(False, 0)["workspace_s"] == 0.0


def test_a_fragmented_memory_makes_every_long_pass_borrow_from_the_pool_and_pay_for_it() -> None:
    ws = Workspace(plan("pool"))
    ws.pin(*PATTERN)
    for _ in range(3):  # the pattern stays: each long pass pays again
        assert ws.place_pass(4096, 32) == ("all", None)
        ws.release()
        cost = ws.costs(True, 0)
        nbytes = (4096 + 32) * PER_TOKEN
        assert cost["borrowed_bytes"] == nbytes and cost["workspace_s"] == pytest.approx(nbytes / 56e9)
    assert ws.place_pass(1000, 32) == ("all", None)  # a short one fits a hole
    ws.release()
    assert ws.costs(True, 0)["workspace_s"] == 0.0
    ws.unpin()
    assert ws.place_pass(16384, 32) == ("all", None)  # healed: it fits again, locally
    assert ws.costs(False, 0)["borrowed_bytes"] == 0.0


def test_defragmenting_compacts_once_and_a_policy_of_none_fails_the_prefill_naming_the_largest_block() -> (
    None
):
    ws = Workspace(plan("defragment"))
    ws.pin(*PATTERN)
    assert ws.place_pass(4096, 32) == ("all", None)
    ws.release()
    first = ws.costs(True, 0)
    assert first["compacted_bytes"] > 0 and first["workspace_s"] == pytest.approx(
        first["compacted_bytes"] / 1.6e12
    )
    assert ws.place_pass(4096, 32) == ("all", None)  # packed: no second compaction
    ws.release()
    assert ws.costs(True, 0)["workspace_s"] == 0.0
    strict = Workspace(plan("none"))
    strict.pin(*PATTERN)
    fits, oom = strict.place_pass(4096, 32)
    assert fits == "decode" and isinstance(oom, DeviceOOM)
    assert "1094.00 MiB free in all, but the largest free block is 230.00 MiB" in oom.message
    assert oom.fields["largest_free"] == 230 * MiB


@pytest.mark.parametrize("policy", ["none", "pool"])
def test_on_an_instance_a_long_prompt_in_the_window_fails_named_or_pays_its_borrow(policy: str) -> None:
    inst = Instance("i", DEP, PagedKVCache(4000, 16, 131072), BatchPolicy(8), ProxyModel(2), 2)
    inst.workspace = Workspace(plan(policy))
    inst.interference = Interference(windows=(Window(1.0, 5.0, "fragment", pin=PATTERN),))
    log: list[dict[str, object]] = []
    requests = [Request("short", 0.0, 200, 40), Request("long", 2.0, 6000, 8), Request("late", 6.0, 6000, 8)]
    out = Fleet(
        [inst], requests, observe=lambda kind, f: log.append(f) if kind == "serve_iteration" else None
    ).run()
    hit = [e for e in log if e.get("interference")]
    (first,) = hit  # the long prompt's pass; the short one's fit in a hole, the late one after the window
    assert 2.0 <= float(first["start_s"]) < 5.0  # type: ignore[arg-type]
    memory = first["interference"]
    assert isinstance(memory, dict)
    if policy == "none":
        assert out["long"].status == "failed" and memory["workspace_failed"] == 1.0
        assert "request 'long' at 6000 tokens: its pass's workspace found no room" in str(out["long"].error)
    else:
        assert out["long"].status == "done" and memory["borrowed_bytes"] == (6000 + 0) * PER_TOKEN
        assert memory["fault_s"] == pytest.approx(memory["borrowed_bytes"] / 56e9)
    assert out["short"].status == out["late"].status == "done"
    events = [
        {"event": "serve_start", "faults": {"i": [[1.0, 5.0, "fragment"]]}},
        *({**e, "event": "serve_iteration"} for e in log),
    ]
    assert check_serving_faults(events, Expect()).status == "pass"  # the fault struck, and the check sees it
    assert check_serving_faults(events[:1], Expect()).status == "fail"  # one that never struck fails it


def test_a_workspace_failure_names_no_rank_and_a_straggler_does_not_pass_for_a_fragmentation() -> None:
    ws = Workspace(plan("none"), rank=3)
    ws.pin(*PATTERN)
    inst = Instance("i", DEP, PagedKVCache(4000, 16, 131072), BatchPolicy(8), ProxyModel(2), 2)
    inst.workspace = ws
    inst.interference = Interference(windows=(Window(0.0, 5.0, "fragment", pin=PATTERN),))
    inst.submit(Request("long", 0.0, 6000, 8))
    (it,) = inst.advance(0.0, 0.0 + 1e-9)
    ((rid, fields),) = it.failed
    assert rid == "long" and "rank" not in fields and not str(fields["error"]).startswith("rank")
    assert fields["largest_free"] == 230 * MiB and fields["workspace_bytes"] == 6000 * PER_TOKEN  # type: ignore[operator]
    slowed = {"event": "serve_iteration", "instance": "i", "start_s": 1.0, "interference": {"fault_s": 0.5}}
    start = {"event": "serve_start", "faults": {"i": [[0.0, 5.0, "straggler"], [0.0, 5.0, "fragment"]]}}
    result = check_serving_faults([start, slowed], Expect())
    assert result.status == "fail" and "fragment on i from 0 s" in result.summary
