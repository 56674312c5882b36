"""The caching allocator: splitting, coalescing, caching, real fragmentation, OOM and compaction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.errors import DeviceOOM
from testbed.fabric.device_memory import ALIGN, SEGMENT_ROUND, Device, DeviceMemory

MiB = 2**20


def check_invariants(mem: DeviceMemory) -> None:
    for seg in mem.segments.values():
        offset = 0
        for a, b in zip(seg.blocks, seg.blocks[1:]):
            assert not (a.free and b.free), "two free neighbours were not merged"
        for block in seg.blocks:
            assert block.offset == offset and block.size > 0 and block.size % ALIGN == 0
            offset += block.size
        assert offset == seg.size, "blocks do not tile their segment"
    st = mem.stats()
    assert st.allocated == sum(b.size for b in mem.live.values())
    assert st.reserved <= mem.capacity
    assert 0 <= st.largest_free <= st.free_total


def test_requests_round_up_and_split_a_cached_segment() -> None:
    mem = DeviceMemory(64 * MiB)
    h = mem.alloc(1000)
    st = mem.stats()
    assert st.allocated == 1024 and st.reserved == SEGMENT_ROUND
    (seg,) = mem.segments.values()
    assert [(b.size, b.free) for b in seg.blocks] == [(1024, False), (SEGMENT_ROUND - 1024, True)]
    mem.free(h)
    assert [(b.size, b.free) for b in seg.blocks] == [(SEGMENT_ROUND, True)]
    assert mem.stats().reserved == SEGMENT_ROUND  # freed memory stays cached


def test_freed_neighbours_coalesce() -> None:
    mem = DeviceMemory(64 * MiB)
    a, b, c = (mem.alloc(MiB // 2) for _ in range(3))
    mem.free(a)
    mem.free(c)
    (seg,) = mem.segments.values()
    assert [b.free for b in seg.blocks] == [True, False, True]
    mem.free(b)
    assert len(seg.blocks) == 1 and seg.blocks[0].free


def test_fragmentation_makes_a_large_request_fail_although_the_free_total_would_hold_it() -> None:
    mem = DeviceMemory(8 * MiB)
    handles = [mem.alloc(MiB) for _ in range(8)]
    for h in handles[::2]:
        mem.free(h)
    st = mem.stats()
    assert st.free_total == 4 * MiB and st.largest_free == MiB
    assert st.fragmentation == pytest.approx(0.75)
    with pytest.raises(DeviceOOM) as info:
        mem.alloc(2 * MiB)
    err = info.value
    assert err.request == 2 * MiB and err.free_total == 4 * MiB and err.largest_free == MiB  # type: ignore[attr-defined]
    assert "4.00 MiB free in all" in str(err) and "largest free block is 1.00 MiB" in str(err)


def test_defragment_compacts_live_blocks_and_cures_the_oom() -> None:
    mem = DeviceMemory(8 * MiB)
    handles = [mem.alloc(MiB, tag=f"t{i}") for i in range(8)]
    for h in handles[::2]:
        mem.free(h)
    assert mem.defragment() == 4 * MiB  # live at 1, 3, 5, 7 MiB: all four move down
    check_invariants(mem)
    assert mem.stats().largest_free == 4 * MiB and mem.stats().fragmentation == 0.0
    big = mem.alloc(2 * MiB)
    assert mem.live[big].size == 2 * MiB
    assert sorted(b.tag for b in mem.live.values() if b.tag) == ["t1", "t3", "t5", "t7"]


def test_a_block_already_in_place_is_not_moved() -> None:
    mem = DeviceMemory(8 * MiB)
    handles = [mem.alloc(MiB) for _ in range(8)]
    for h in handles[1::2]:
        mem.free(h)
    assert mem.defragment() == 3 * MiB  # live at 0, 2, 4, 6 MiB: the first stays


def test_empty_cached_segments_go_back_to_the_device_before_an_oom() -> None:
    mem = DeviceMemory(4 * MiB)
    small = [mem.alloc(MiB) for _ in range(2)]  # one 2 MiB segment
    other = mem.alloc(2 * MiB)  # a second one
    for h in small:
        mem.free(h)
    mem.free(other)
    big = mem.alloc(4 * MiB)  # needs both segments released first
    assert mem.stats().reserved == 4 * MiB and mem.live[big].size == 4 * MiB


@settings(max_examples=200)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 3 * MiB)), max_size=60))
def test_any_sequence_keeps_the_books_straight(ops: list[tuple[bool, int]]) -> None:
    mem = DeviceMemory(16 * MiB)
    live: list[int] = []
    for is_alloc, size in ops:
        if is_alloc or not live:
            try:
                live.append(mem.alloc(size))
            except DeviceOOM as err:
                assert err.largest_free < -(-size // ALIGN) * ALIGN  # type: ignore[attr-defined]
        else:
            mem.free(live.pop(size % len(live)))
        check_invariants(mem)
    before = mem.stats().allocated
    mem.defragment()
    check_invariants(mem)
    assert mem.stats().allocated == before and mem.stats().fragmentation == 0.0


def fragmented(policy: str, pool: int = 0) -> tuple[Device, list[tuple[str, int]]]:
    dev = Device(8 * MiB, 0, policy, hbm_Bps=1e12, pool_capacity=pool, pool_Bps=1e11)
    placed = [dev.alloc(MiB, f"b{i}") for i in range(8)]
    for p in placed[::2]:
        dev.free(p)
    return dev, placed[1::2]


def test_policy_none_raises_the_oom() -> None:
    dev, _ = fragmented("none")
    with pytest.raises(DeviceOOM):
        dev.alloc(2 * MiB, "big")
    assert dev.events == [] and dev.charge() == 0.0


def test_policy_defragment_compacts_charges_hbm_time_and_retries() -> None:
    dev, _ = fragmented("defragment")
    where, handle = dev.alloc(2 * MiB, "big")
    assert where == "local" and dev.memory.live[handle].size == 2 * MiB
    assert dev.events == [{"action": "defragment", "tag": "big", "bytes_moved": 4 * MiB}]
    assert dev.charge() == pytest.approx(4 * MiB / 1e12) and dev.charge() == 0.0


def test_policy_pool_borrows_at_fabric_cost_and_gives_back() -> None:
    dev, _ = fragmented("pool", pool=6 * MiB)
    placed = dev.alloc(2 * MiB, "big")
    assert placed[0] == "pool" and dev.stats()["borrowed"] == 2 * MiB
    assert dev.charge() == pytest.approx(2 * MiB / 1e11)
    dev.free(placed)
    assert dev.stats()["borrowed"] == 0
    with pytest.raises(DeviceOOM):
        dev.alloc(7 * MiB, "too big even for the pool")
