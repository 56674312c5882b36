"""Bounded device memory with a caching allocator, where fragmentation is real.

Modelled on the frameworks' caching allocators (PyTorch's
``CUDACachingAllocator``, torch_npu's ``NPUCachingAllocator``): requests are
rounded up to 512 bytes; a request is served best-fit from the cached free
blocks of the segments already reserved, splitting the block it takes; a
freed block goes back to the cache (it stays reserved) and merges with free
neighbours; only when no cached block fits does the allocator reserve a new
segment from the device (a multiple of 2 MiB), and when the device is full it
first releases wholly free segments, as ``empty_cache`` does. So a large
request can fail while the free total would hold it: :class:`DeviceOOM` names
the request, the free total and the largest free block.

``defragment`` compacts every live block into one segment (as a defragmenting
policy would), and returns the bytes it moved, to be charged
``bytes_moved / hbm_bandwidth`` of virtual time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.core.errors import DeviceOOM

ALIGN = 512
SEGMENT_ROUND = 2 * 2**20


def round_up(n: int, unit: int) -> int:
    """``n`` rounded up to a multiple of ``unit`` (at least one unit)."""
    return max(unit, -(-n // unit) * unit)


@dataclass
class Block:
    """A run of bytes inside a segment, live (``handle`` set) or cached free."""

    segment: int
    offset: int
    size: int
    handle: int | None = None
    tag: str = ""

    @property
    def free(self) -> bool:
        """True when the block is in the cache."""
        return self.handle is None


@dataclass
class Segment:
    """A reservation from the device, cut into blocks ordered by offset."""

    id: int
    size: int
    blocks: list[Block] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryStats:
    """What the journal records per rank and step."""

    capacity: int
    allocated: int
    reserved: int
    largest_free: int

    @property
    def free_total(self) -> int:
        """Bytes not held by live blocks (cached free blocks plus unreserved device memory)."""
        return self.capacity - self.allocated

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free / free_total``: 0 when all free memory is one block."""
        return 0.0 if self.free_total == 0 else 1.0 - self.largest_free / self.free_total


class DeviceMemory:
    """One NPU's device memory and its caching allocator."""

    def __init__(self, capacity: int, rank: int = 0) -> None:
        self.capacity = capacity
        self.rank = rank
        self.segments: dict[int, Segment] = {}
        self.live: dict[int, Block] = {}
        self._next_segment = 0
        self._next_handle = 0

    @property
    def reserved(self) -> int:
        """Bytes reserved from the device (live plus cached)."""
        return sum(s.size for s in self.segments.values())

    def stats(self) -> MemoryStats:
        """Allocated, reserved and the largest block a request could get now."""
        cached = max((b.size for s in self.segments.values() for b in s.blocks if b.free), default=0)
        return MemoryStats(
            self.capacity,
            sum(b.size for b in self.live.values()),
            self.reserved,
            max(cached, self.capacity - self.reserved),
        )

    # --- allocation ----------------------------------------------------------
    def alloc(self, nbytes: int, tag: str = "") -> int:
        """Place ``nbytes``; returns a handle. Raises :class:`DeviceOOM` when nothing can hold it."""
        size = round_up(nbytes, ALIGN)
        block = self._best_fit(size)
        if block is None:
            block = self._reserve(size)
        return self._take(block, size, tag)

    def _best_fit(self, size: int) -> Block | None:
        fits = [b for s in self.segments.values() for b in s.blocks if b.free and b.size >= size]
        return min(fits, key=lambda b: (b.size, b.segment, b.offset)) if fits else None

    def _reserve(self, size: int) -> Block:
        seg_size = round_up(size, SEGMENT_ROUND)
        if self.reserved + seg_size > self.capacity:
            self.release_cached()
        if self.reserved + seg_size > self.capacity:
            seg_size = size  # a last, exact-size reservation, as the frameworks try before failing
        if self.reserved + seg_size > self.capacity:
            st = self.stats()
            raise DeviceOOM(
                f"rank {self.rank}: cannot allocate {size / 2**20:.2f} MiB: {st.free_total / 2**20:.2f} MiB "
                f"free in all, but the largest free block is {st.largest_free / 2**20:.2f} MiB "
                f"(fragmentation {st.fragmentation:.0%}); defragment, pool memory across the supernode, "
                "or make the model's buffers smaller",
                request=size,
                free_total=st.free_total,
                largest_free=st.largest_free,
                rank=self.rank,
            )
        seg = Segment(self._next_segment, seg_size)
        self._next_segment += 1
        seg.blocks.append(Block(seg.id, 0, seg_size))
        self.segments[seg.id] = seg
        return seg.blocks[0]

    def _take(self, block: Block, size: int, tag: str) -> int:
        seg = self.segments[block.segment]
        if block.size - size >= ALIGN:  # split: the rest stays cached
            rest = Block(seg.id, block.offset + size, block.size - size)
            block.size = size
            seg.blocks.insert(seg.blocks.index(block) + 1, rest)
        handle = self._next_handle
        self._next_handle += 1
        block.handle, block.tag = handle, tag
        self.live[handle] = block
        return handle

    def free(self, handle: int) -> None:
        """Return a block to the cache, merging it with free neighbours."""
        block = self.live.pop(handle)
        block.handle, block.tag = None, ""
        seg = self.segments[block.segment]
        i = seg.blocks.index(block)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].free:
            block.size += seg.blocks.pop(i + 1).size
        if i > 0 and seg.blocks[i - 1].free:
            prev = seg.blocks[i - 1]
            prev.size += block.size
            seg.blocks.pop(i)

    def release_cached(self) -> int:
        """Give wholly free segments back to the device (``empty_cache``); returns the bytes released."""
        empty = [sid for sid, s in self.segments.items() if all(b.free for b in s.blocks)]
        released = sum(self.segments[sid].size for sid in empty)
        for sid in empty:
            del self.segments[sid]
        return released

    def defragment(self) -> int:
        """Compact every live block into one segment, in address order; returns the bytes moved.

        Segments are laid out one after another in the device's address space,
        so a block that already sits where compaction would put it is not moved.
        """
        base, address = 0, {}
        for sid in sorted(self.segments):
            address[sid] = base
            base += self.segments[sid].size
        live = sorted(self.live.values(), key=lambda b: address[b.segment] + b.offset)
        seg = Segment(self._next_segment, sum(b.size for b in live))
        self._next_segment += 1
        moved, offset = 0, 0
        for b in live:
            if address[b.segment] + b.offset != offset:
                moved += b.size
            b.segment, b.offset = seg.id, offset
            seg.blocks.append(b)
            offset += b.size
        self.segments = {seg.id: seg} if live else {}
        return moved


POLICIES = {
    "none": "an allocation that does not fit fails the rank's step (DeviceOOM); recovery takes over",
    "defragment": "on OOM, compact the device memory (charged bytes moved / HBM bandwidth), then retry",
    "pool": "on OOM, borrow from the supernode's memory pool over the fabric (bytes / link bandwidth)",
}


class Device:
    """A rank's device memory as its program uses it, with the out-of-memory policy applied.

    ``pool_capacity`` is this rank's share of the supernode pool (what its peers set
    aside for borrowing); ``charge()`` hands over the virtual seconds that
    compaction and borrowing cost, and ``events`` what they did.
    """

    def __init__(
        self,
        capacity: int,
        rank: int,
        policy: str,
        hbm_Bps: float,
        pool_capacity: int = 0,
        pool_Bps: float = 1.0,
    ) -> None:
        self.memory = DeviceMemory(capacity, rank)
        self.pool = DeviceMemory(pool_capacity, rank) if policy == "pool" and pool_capacity > 0 else None
        self.policy, self.hbm_Bps, self.pool_Bps = policy, hbm_Bps, pool_Bps
        self.events: list[dict[str, object]] = []
        self._owed = 0.0

    def alloc(self, nbytes: int, tag: str) -> tuple[str, int]:
        """Place ``nbytes``; returns (where, handle). :class:`DeviceOOM` when the policy cannot help."""
        try:
            return "local", self.memory.alloc(nbytes, tag)
        except DeviceOOM:
            if self.policy == "defragment":
                moved = self.memory.defragment()
                self._owed += moved / self.hbm_Bps
                self.events.append({"action": "defragment", "tag": tag, "bytes_moved": moved})
                return "local", self.memory.alloc(nbytes, tag)
            if self.pool is not None:
                handle = self.pool.alloc(nbytes, tag)
                self._owed += round_up(nbytes, ALIGN) / self.pool_Bps
                self.events.append({"action": "borrow", "tag": tag, "bytes": round_up(nbytes, ALIGN)})
                return "pool", handle
            raise

    def free(self, placed: tuple[str, int]) -> None:
        """Release what :meth:`alloc` placed."""
        where, handle = placed
        (self.memory if where == "local" else self.pool or self.memory).free(handle)

    def charge(self) -> float:
        """Virtual seconds owed for compaction and borrowing since the last call."""
        owed, self._owed = self._owed, 0.0
        return owed

    def stats(self) -> dict[str, float]:
        """Allocated, reserved, largest free block and fragmentation of the local memory."""
        st = self.memory.stats()
        return {
            "allocated": st.allocated,
            "reserved": st.reserved,
            "largest_free": st.largest_free,
            "fragmentation": round(st.fragmentation, 6),
            "borrowed": self.pool.stats().allocated if self.pool is not None else 0,
        }


def pin_pattern(
    device: Device, tag: str, block: int, count: int, spacing: int
) -> tuple[list[tuple[str, int]], str | None]:
    """Pin ``count`` blocks of ``block`` bytes on ``device``, each followed by a ``spacing``-byte
    hole (allocated, then freed), as many as fit: the blocks pinned (tagged ``tag``), and the
    out-of-memory that stopped it early (None: every block fitted)."""
    pinned: list[tuple[str, int]] = []
    gaps: list[tuple[str, int]] = []
    stopped = None
    try:
        for _ in range(count):
            pinned.append(device.alloc(block, tag))
            gaps.append(device.alloc(spacing, f"{tag}-gap"))
    except DeviceOOM as err:
        stopped = err.message
    for gap in gaps:
        device.free(gap)
    return pinned, stopped
