"""The paged KV cache: blocks taken as a request's tokens fill them, never two holders for a block,
the lowest free block first, a full cache named and left as it was."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.core.errors import KVCacheFull, TestbedError
from testbed.serve.kv_cache import PagedKVCache, blocks_for


def test_a_request_takes_a_block_only_when_its_last_one_fills() -> None:
    cache = PagedKVCache(total_blocks=8, block_tokens=16, bytes_per_token=70_272)
    assert cache.admit("a", 20) == (0, 1)  # 20 tokens: two blocks of 16
    assert cache.append("a", 12) == (0, 1)  # 32 tokens: still two
    assert cache.append("a") == (0, 1, 2)  # the 33rd takes a third
    assert cache.admit("b", 1) == (3,)
    assert cache.release("a") == 3
    assert cache.admit("c", 40) == (0, 1, 2)  # the lowest free blocks first
    assert cache.state().used_blocks == 4 and cache.free_blocks == 4
    assert cache.block_bytes == 16 * 70_272


def test_a_full_cache_names_the_request_its_length_and_the_state_and_changes_nothing() -> None:
    cache = PagedKVCache(total_blocks=4, block_tokens=16, bytes_per_token=2)
    cache.admit("long-prompt", 48)
    cache.admit("short", 10)
    with pytest.raises(KVCacheFull) as full:
        cache.append("short", 30)  # 40 tokens: 3 blocks, 2 more, 0 free
    text = str(full.value)
    assert "request 'short' at 40 tokens needs 2 more block(s) of 16 tokens (64 bytes) and 0 are free" in text
    assert "4 of 4 blocks in use (100%) by 2 request(s), 58 tokens" in text
    assert "largest: long-prompt 48 tokens in 3 blocks" in text and "preempt" in text
    assert cache.tokens("short") == 10 and cache.table("short") == (3,)  # left as it was
    again = pickle.loads(pickle.dumps(full.value))  # errors cross actor boundaries
    assert isinstance(again, KVCacheFull) and again.request == "short" and again.needed_blocks == 2
    with pytest.raises(KVCacheFull):
        cache.admit("new", 1)
    assert "new" not in cache.preemption_order()


def test_the_newest_request_is_preempted_first_and_mistakes_are_named() -> None:
    cache = PagedKVCache(total_blocks=8, block_tokens=4, bytes_per_token=1)
    for r in ("old", "mid", "new"):
        cache.admit(r, 4)
    assert cache.preemption_order() == ["new", "mid", "old"]
    with pytest.raises(TestbedError, match="'mid' is already in the KV cache"):
        cache.admit("mid", 2)
    with pytest.raises(TestbedError, match="'gone' is not in the KV cache; admit it first"):
        cache.append("gone")
    with pytest.raises(TestbedError, match="needs 1 or more tokens"):
        cache.admit("empty", 0)
    with pytest.raises(TestbedError, match="block_tokens of 1 or more, got 0"):
        PagedKVCache(total_blocks=4, block_tokens=0, bytes_per_token=1)


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.integers(1, 12),
    block_tokens=st.integers(1, 8),
    ops=st.lists(
        st.tuples(st.sampled_from(["admit", "append", "release"]), st.integers(0, 5), st.integers(1, 20))
    ),
)
def test_blocks_are_conserved_and_every_table_fits_its_tokens(
    blocks: int, block_tokens: int, ops: list[tuple[str, int, int]]
) -> None:
    cache = PagedKVCache(blocks, block_tokens, 1)
    model: dict[str, int] = {}  # request -> tokens, as a plain count
    for op, who, n in ops:
        r = f"r{who}"
        try:
            if op == "admit" and r not in model:
                cache.admit(r, n)
                model[r] = n
            elif op == "append" and r in model:
                cache.append(r, n)
                model[r] += n
            elif op == "release" and r in model:
                cache.release(r)
                del model[r]
        except KVCacheFull as full:
            used = sum(blocks_for(t, block_tokens) for t in model.values())
            assert full.needed_blocks > blocks - used  # refused only when it truly did not fit
        tables = {q: cache.table(q) for q in model}
        held = [b for t in tables.values() for b in t]
        assert len(held) == len(set(held))  # no block has two holders
        assert len(held) + cache.free_blocks == blocks
        assert all(len(tables[q]) == blocks_for(model[q], block_tokens) for q in model)
        assert all(cache.tokens(q) == model[q] for q in model)


def test_a_request_longer_than_the_whole_cache_is_told_no_preemption_helps() -> None:
    cache = PagedKVCache(total_blocks=4, block_tokens=16, bytes_per_token=1)
    with pytest.raises(KVCacheFull) as never:
        cache.admit("huge", 65)
    assert never.value.never_fits and "no preemption can make room" in str(never.value)
    assert "the whole cache has 4 (64 tokens)" in str(never.value) and cache.free_blocks == 4
    cache.admit("a", 60)
    with pytest.raises(KVCacheFull) as grown:
        cache.append("a", 5)
    assert grown.value.never_fits and cache.tokens("a") == 60
    with pytest.raises(TestbedError, match="needs 1 or more tokens, got True"):
        cache.admit("flag", True)


def test_a_re_admitted_request_keeps_its_arrival_and_is_not_the_first_to_go_again() -> None:
    cache = PagedKVCache(total_blocks=16, block_tokens=4, bytes_per_token=1)
    cache.admit("first", 4, arrival=1.0)
    cache.admit("second", 4, arrival=2.0)
    cache.release("first")  # preempted
    cache.admit("first", 8, arrival=1.0)  # back, with its cache recomputed
    assert cache.preemption_order() == ["second", "first"]
