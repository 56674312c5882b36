"""A paged KV cache: a serving NPU's key/value memory in fixed-size blocks.

After vLLM's PagedAttention (Kwon et al., "Efficient Memory Management for
Large Language Model Serving with PagedAttention", SOSP 2023): a request's
keys and values live in blocks of ``block_tokens`` tokens, listed in its
block table; a block is taken only when the request's last one is full, so a
request holds at most ``block_tokens - 1`` token slots it does not use, and
no memory is reserved for tokens not yet generated. Blocks come from a fixed
pool (the HBM a serving NPU has left after its weights and activations),
always the lowest free block first, so one sequence of calls gives one set of
tables: determinism, as everywhere in the testbed.

When a request needs a block and none is free, :class:`KVCacheFull` names
the request, its length and the cache's state, and the cache is left as it
was (a request longer than the whole cache is told so: no preemption
helps it). A serving policy then preempts: it frees the blocks of the
requests :meth:`PagedKVCache.preemption_order` gives (vLLM's, first come
first served: the latest to arrive first) and later re-admits them,
recomputing their cache or swapping it back from host memory; a request
re-admitted keeps its arrival, so it is not the first to go again.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from testbed.core.errors import KVCacheFull, TestbedError


def blocks_for(tokens: int, block_tokens: int) -> int:
    """Blocks that hold ``tokens`` tokens: ``ceil(tokens / block_tokens)``."""
    return -(-tokens // block_tokens)


@dataclass(frozen=True)
class CacheState:
    """The cache at one moment: its blocks in use and in all, and what holds them."""

    used_blocks: int
    total_blocks: int
    requests: int
    tokens: int
    #: the requests holding the most blocks, most first: (request, tokens, blocks)
    largest: tuple[tuple[str, int, int], ...]

    @property
    def occupancy(self) -> float:
        """Fraction of the blocks in use."""
        return self.used_blocks / self.total_blocks

    def describe(self) -> str:
        """One line for a message or a summary."""
        held = ", ".join(f"{r} {t} tokens in {b} blocks" for r, t, b in self.largest)
        return (
            f"{self.used_blocks} of {self.total_blocks} blocks in use ({self.occupancy:.0%}) by "
            f"{self.requests} request(s), {self.tokens} tokens" + (f"; largest: {held}" if held else "")
        )


class PagedKVCache:
    """``total_blocks`` blocks of ``block_tokens`` tokens, each token ``bytes_per_token`` bytes."""

    def __init__(self, total_blocks: int, block_tokens: int, bytes_per_token: int) -> None:
        for name, value in (
            ("total_blocks", total_blocks),
            ("block_tokens", block_tokens),
            ("bytes_per_token", bytes_per_token),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TestbedError(
                    f"a paged KV cache needs {name} of 1 or more, got {value!r}; give a whole number",
                    **{name: value},
                )
        self.total_blocks, self.block_tokens, self.bytes_per_token = (
            total_blocks,
            block_tokens,
            bytes_per_token,
        )
        self._free = list(range(total_blocks))  # a heap: the lowest free block first
        self._tables: dict[str, list[int]] = {}
        self._tokens: dict[str, int] = {}
        self._arrival: dict[str, tuple[float, int]] = {}
        self._admitted = 0

    def copy(self) -> PagedKVCache:
        """An independent copy, to put back later (the free heap and every table copied; a deep
        copy of a cache of 10^5 blocks costs a hundred times as much)."""
        twin = PagedKVCache.__new__(PagedKVCache)
        twin.__dict__.update(self.__dict__)
        twin._free = list(self._free)
        twin._tables = {k: list(v) for k, v in self._tables.items()}
        twin._tokens, twin._arrival = dict(self._tokens), dict(self._arrival)
        return twin

    @property
    def block_bytes(self) -> int:
        """Bytes of one block."""
        return self.block_tokens * self.bytes_per_token

    @property
    def free_blocks(self) -> int:
        """Blocks no request holds."""
        return len(self._free)

    def holders(self) -> frozenset[str]:
        """The requests (and other holders) with blocks."""
        return frozenset(self._tables)

    def tokens(self, request: str) -> int:
        """Tokens ``request`` has cached."""
        return self._tokens[self._known(request)]

    def table(self, request: str) -> tuple[int, ...]:
        """``request``'s block table: its blocks, in token order."""
        return tuple(self._tables[self._known(request)])

    def admit(self, request: str, tokens: int, arrival: float | None = None) -> tuple[int, ...]:
        """Take the blocks for ``request``'s first ``tokens`` tokens (its prompt, or its prompt and
        output so far when re-admitted); its block table. ``arrival``: when it arrived (default: in
        order of admission), which orders preemption. Raises :class:`KVCacheFull` (the cache
        unchanged) if the free blocks are too few."""
        if request in self._tables:
            raise TestbedError(
                f"request {request!r} is already in the KV cache ({self._tokens[request]} tokens); "
                "append its new tokens, or release it first",
                request=request,
            )
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise TestbedError(f"request {request!r} needs 1 or more tokens, got {tokens!r}", request=request)
        self._take(request, tokens, blocks_for(tokens, self.block_tokens))
        self._admitted += 1
        self._arrival[request] = (float(self._admitted if arrival is None else arrival), self._admitted)
        return self.table(request)

    def append(self, request: str, tokens: int = 1) -> tuple[int, ...]:
        """Add ``tokens`` generated tokens to ``request``'s cache, taking a block each time its last
        one fills; its block table. Raises :class:`KVCacheFull` (the cache unchanged) if a block is
        needed and none is free."""
        have = self.tokens(request)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise TestbedError(
                f"request {request!r} appends 1 or more tokens, got {tokens!r}", request=request
            )
        need = blocks_for(have + tokens, self.block_tokens) - len(self._tables[request])
        self._take(request, have + tokens, need)
        return self.table(request)

    def release(self, request: str) -> int:
        """Free ``request``'s blocks (it finished, or is preempted); how many it held."""
        blocks = self._tables.pop(self._known(request))
        del self._tokens[request], self._arrival[request]
        for b in blocks:
            heapq.heappush(self._free, b)
        return len(blocks)

    def preemption_order(self) -> list[str]:
        """The requests a policy frees first when the cache is full: the latest to arrive first (vLLM's
        first come, first served), so the oldest, nearest to done, keep running."""
        return sorted(self._tables, key=lambda r: self._arrival[r], reverse=True)

    def state(self, largest: int = 3) -> CacheState:
        """The cache now, naming its ``largest`` holders."""
        top = sorted(self._tables, key=lambda r: (-len(self._tables[r]), r))[:largest]
        return CacheState(
            used_blocks=self.total_blocks - len(self._free),
            total_blocks=self.total_blocks,
            requests=len(self._tables),
            tokens=sum(self._tokens.values()),
            largest=tuple((r, self._tokens[r], len(self._tables[r])) for r in top),
        )

    def journal_fields(self) -> dict[str, Any]:
        """The cache's state as a journal event's fields."""
        s = self.state()
        return {
            "used_blocks": s.used_blocks,
            "total_blocks": s.total_blocks,
            "requests": s.requests,
            "tokens": s.tokens,
            "occupancy": round(s.occupancy, 6),
        }

    def _take(self, request: str, tokens: int, need: int) -> None:
        whole = blocks_for(tokens, self.block_tokens)
        if whole > self.total_blocks:
            raise self._full(
                f"KV cache too small: request {request!r} at {tokens} tokens needs {whole} blocks and the "
                f"whole cache has {self.total_blocks} ({self.total_blocks * self.block_tokens} tokens); no "
                "preemption can make room: cap the requests' length or give the cache more memory",
                request,
                tokens,
                need,
            )
        if need > len(self._free):
            raise self._full(
                f"KV cache full: request {request!r} at {tokens} tokens needs {need} more block(s) of "
                f"{self.block_tokens} tokens ({need * self.block_bytes} bytes) and {len(self._free)} "
                f"are free; {self.state().describe()}; cap the requests' length, admit fewer at once, or "
                "preempt (recompute or swap) the newest",
                request,
                tokens,
                need,
            )
        table = self._tables.setdefault(request, [])
        table.extend(heapq.heappop(self._free) for _ in range(need))
        self._tokens[request] = tokens

    def _full(self, message: str, request: str, tokens: int, need: int) -> KVCacheFull:
        """The error for ``request`` at ``tokens`` short of ``need`` blocks, with the cache's state."""
        return KVCacheFull(
            message,
            request=request,
            tokens=tokens,
            needed_blocks=need,
            free_blocks=len(self._free),
            used_blocks=self.total_blocks - len(self._free),
            total_blocks=self.total_blocks,
            never_fits=blocks_for(tokens, self.block_tokens) > self.total_blocks,
        )

    def _known(self, request: str) -> str:
        if request not in self._tables:
            raise TestbedError(f"request {request!r} is not in the KV cache; admit it first", request=request)
        return request
