"""One serving instance: continuous batching over a paged KV cache on the virtual clock.

After vLLM's scheduler (Kwon et al., SOSP 2023; Yu et al., "Orca", OSDI
2022): every iteration admits waiting requests, first come first served,
while the batch has room and the cache lets it, prefills them (a prefill
gives a request its first token) and decodes one token for every request
already running. An iteration takes the modelled deployment's time for its
prefills and its decode step (:mod:`testbed.serve.cost`); its tokens are the
proxy's (:mod:`testbed.serve.proxy`), stamped at the iteration's end.

A running request whose next token needs a block the cache does not have is
the KV-cache OOM. Under ``preemption: none`` it fails with
:class:`~testbed.core.errors.KVCacheFull`, named; under ``recompute`` the
newest requests give up their blocks and wait again (vLLM's recomputation:
re-admitted, they prefill their prompt and the tokens they already have),
so none is lost and only their latency pays. ``kv_cap`` keeps admission
below a share of the cache so that running requests have room to grow.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from testbed.core.errors import DeviceOOM, KVCacheFull, TestbedError
from testbed.serve import cost
from testbed.serve.colocation import STAGING, Interference
from testbed.serve.cost import Deployment
from testbed.serve.kv_cache import PagedKVCache, blocks_for
from testbed.serve.proxy import GroupOps, ProxyModel
from testbed.serve.records import Iteration, Live
from testbed.serve.requests import Request
from testbed.serve.workspace import Workspace

PREEMPTION = ("none", "recompute", "swap")
#: what an instance does: everything, only prefills (handing each request on), or only decodes
ROLES = ("both", "prefill", "decode")


class StopBefore(Exception):
    """Raised by an iteration's ``before_tokens``: end the advance before this iteration."""


@dataclass(frozen=True)
class BatchPolicy:
    """How an instance batches: at most ``max_batch`` requests at once and ``prefill_tokens``
    tokens prefilled an iteration (vLLM's ``max_num_batched_tokens``; a longer prompt alone); a
    request admitted only while the blocks in use, its prompt's included, stay within ``kv_cap``
    of the cache; on a full cache, ``preemption``: ``none`` (the request fails), ``recompute``
    (the newest give their blocks back and prefill again later) or ``swap`` (their cache goes to
    host memory at ``host_Bps`` and comes back the same way, vLLM's swapping)."""

    max_batch: int = 32
    kv_cap: float = 1.0
    preemption: str = "none"
    prefill_tokens: int = 16384
    #: bytes a second between HBM and host memory, each way: PCIe 4.0 x16, an Ascend 910B's host link
    host_Bps: float = 32e9

    def __post_init__(self) -> None:
        if self.preemption not in PREEMPTION:
            raise TestbedError(
                f"preemption {self.preemption!r} is not one of {', '.join(PREEMPTION)}; pick one",
                preemption=self.preemption,
            )


class Instance:
    """One instance's scheduler, cache and proxy; ``iterate`` runs one iteration at a time."""

    def __init__(
        self,
        name: str,
        dep: Deployment,
        cache: PagedKVCache,
        policy: BatchPolicy,
        proxy: ProxyModel,
        seed: int,
    ) -> None:
        self.name, self.dep, self.cache, self.policy, self.proxy, self.seed = (
            name,
            dep,
            cache,
            policy,
            proxy,
            seed,
        )
        self.waiting: list[Live] = []
        self.running: list[Live] = []
        #: what a training job on the same supernode takes from it (nothing, alone)
        self.interference = Interference()
        #: bytes this iteration swaps between HBM and host memory
        self._swap_bytes = 0
        #: seconds a fault in force (a straggler, a degraded link) adds to this iteration
        self._fault_s = 0.0
        #: ``prefill``: it hands each request on after its first token (prefill/decode disaggregation)
        self.role = "both"
        #: a part's collectives with the rest of its instance's group, from an iteration's start
        #: (None: the instance is whole, in one process)
        self.group: Callable[[float], GroupOps] | None = None
        #: its activation memory (None: not modelled, every workspace fits)
        self.workspace: Workspace | None = None

    def submit(self, request: Request, tokens: tuple[int, ...] = (), state: object = None) -> None:
        """Queue ``request``; ``tokens`` it already generated elsewhere, which it keeps: they are
        recomputed into the cache, not generated again, unless ``state`` brings the cache itself
        (its KV transferred from a prefill instance)."""
        prompt = self.proxy.prompt(self.seed, request.id, request.prompt_tokens)
        cache = None if state is None else np.asarray(state, dtype=np.int64)
        self.waiting.append(Live(request, prompt, list(tokens), state=cache, received=cache is not None))

    @property
    def busy(self) -> bool:
        """It has requests waiting or running."""
        return bool(self.waiting or self.running)

    def advance(
        self,
        now: float,
        until: float,
        before_tokens: Callable[[float, float, str], None] | None = None,
        undoable: bool = False,
    ) -> list[Iteration]:
        """Iterations from ``now`` while it has requests and its clock is before ``until`` (the next
        arrival the router has for anyone: until then nothing reaches it). ``undoable``: each
        iteration after the first may be undone, the instance put back as it was before it, by
        ``before_tokens`` raising :class:`StopBefore`; the advance then ends there."""
        out: list[Iteration] = []
        while self.busy and now < until:
            snap = self.snapshot() if undoable and out else None
            try:
                out.append(self.iterate(now, before_tokens))
            except StopBefore:
                if snap is None:
                    raise
                self.restore(snap)
                break
            now = out[-1].end_s
        return out

    def snapshot(self) -> tuple[PagedKVCache, list[Live], list[Live], Workspace | None]:
        """Its cache, queues and activation memory, to put back with :meth:`restore` (a request's
        state array is replaced, never written, so it is shared)."""

        def twin(r: Live) -> Live:
            return dataclasses.replace(r, tokens=list(r.tokens))

        waiting, running = [twin(r) for r in self.waiting], [twin(r) for r in self.running]
        return self.cache.copy(), waiting, running, copy.deepcopy(self.workspace)

    def restore(self, snap: tuple[PagedKVCache, list[Live], list[Live], Workspace | None]) -> None:
        """Back to a :meth:`snapshot`."""
        self.cache, self.waiting, self.running, self.workspace = snap

    def iterate(
        self, now: float, before_tokens: Callable[[float, float, str], None] | None = None
    ) -> Iteration:
        """One iteration starting at ``now``; requests waiting with an arrival after ``now`` stay
        waiting. ``before_tokens(start, end, doing)`` is called once its length is known and before
        any token is made (where an armed death strikes), ``doing`` what the iteration does:
        ``prefill``, ``decode``, ``prefill+decode`` or ``idle`` (waiting for room or arrivals)."""
        staging = self._stage(now)
        self._swap_bytes, self._fault_s = 0, 0.0
        failed: dict[Live, dict[str, object]] = {}
        # the running first (vLLM's order): their next tokens' blocks before anyone new is let in
        decoding = list(self.running)
        preempted = self._grow(decoding, failed)
        decoding = [r for r in decoding if r not in failed and r not in preempted]
        admitted = [] if preempted else self._admit(now, failed)  # no one new after a preemption
        admitted, decoding, memory = self._fit_workspace(now, admitted, decoding, failed)
        duration, link_extra = self._duration(now, admitted, decoding)
        duration += memory.get("workspace_s", 0.0)
        self._fault_s += memory.pop("fault_s", 0.0)
        if not admitted and not decoding and self.waiting and not failed:
            duration = self._wait_for_room(now)
        end = now + duration
        if before_tokens is not None:
            doing = "+".join(w for w, rs in (("prefill", admitted), ("decode", decoding)) if rs) or "idle"
            before_tokens(now, end, doing)
        fresh = [r for r in admitted if self._prefill(r)]
        self._forward(now, fresh, decoding)
        finished = [r for r in self.running if r.done]
        handed = [r for r in fresh if not r.done] if self.role == "prefill" else []
        handoff = tuple(
            (r.request.id, self.cache.tokens(r.request.id) * self.cache.bytes_per_token) for r in handed
        )
        for r in [*finished, *handed]:
            self.cache.release(r.request.id)
        self.running = [r for r in self.running if not r.done and r not in handed]
        if self.workspace is not None:
            self.workspace.release()
        return Iteration(
            start_s=now,
            duration_s=duration,
            batch=len(admitted) + len(decoding),
            emitted=tuple((r.request.id, r.tokens[-1]) for r in [*fresh, *decoding]),
            prefilled=tuple(r.request.id for r in admitted),
            finished=tuple(r.request.id for r in finished),
            failed=tuple((r.request.id, fields) for r, fields in failed.items()),
            preempted=tuple(r.request.id for r in preempted),
            cache=self.cache.journal_fields(),
            interference={
                "allreduce_s": link_extra,
                "staging_blocks": staging,
                "fault_s": self._fault_s,
                **{k: v for k, v in memory.items() if v},
            },
            swapped_bytes=self._swap_bytes,
            handoff=handoff,
            states=tuple(r.state for r in handed),
        )

    def _admit(self, now: float, failed: dict[Live, dict[str, object]]) -> list[Live]:
        """Admit the waiting, first come first served, within the batch, the prefill budget and the
        cap; one that cannot fit even into an idle cache fails here, named (into ``failed``)."""
        admitted: list[Live] = []
        cap = self.policy.kv_cap * self.cache.total_blocks
        budget = self.policy.prefill_tokens
        while self.waiting and len(self.running) < self.policy.max_batch:
            r = self.waiting[0]
            if r.request.arrival_s > now or (admitted and r.context > budget):
                break
            need = blocks_for(r.context + 1, self.cache.block_tokens)
            used = self.cache.total_blocks - self.cache.free_blocks
            if used + need > cap and self.running:
                break  # wait for room; alone, it is admitted and fails named if it cannot fit
            try:
                self.cache.admit(r.request.id, r.context, r.request.arrival_s)
            except KVCacheFull as full:
                if not full.fields.get("never_fits"):
                    break  # room comes back as requests finish or a checkpoint's staging ends
                failed[self.waiting.pop(0)] = {**full.fields, "error": str(full)}
                continue
            self.waiting.pop(0)
            self.running.append(r)
            admitted.append(r)
            budget -= r.context
        return admitted

    def _fit_workspace(
        self, now: float, admitted: list[Live], decoding: list[Live], failed: dict[Live, dict[str, object]]
    ) -> tuple[list[Live], list[Live], dict[str, float]]:
        """Place the pass's workspace (:mod:`testbed.serve.workspace`): the requests that keep their
        place in the pass, and what the memory cost. A pass that does not fit fails its prefills,
        named; then its decodes too if even they do not fit."""
        ws = self.workspace
        if ws is None:
            return admitted, decoding, {}
        window = ws.follow(self.interference.during(now, "fragment"))
        prefilling = [r for r in admitted if not r.swapped and not r.received]  # the others bring their cache
        prefill = min(sum(r.context for r in prefilling), self.policy.prefill_tokens)
        fits, oom = ws.place_pass(prefill, len(decoding))
        lost = {"all": [], "decode": prefilling, "none": [*admitted, *decoding]}[fits]
        if oom is not None:
            for r in lost:
                self._fail(r, oom, failed)
        kept = ([r for r in admitted if r not in lost], [r for r in decoding if r not in lost])
        return kept[0], kept[1], ws.costs(window is not None, len(lost))

    def _fail(self, r: Live, oom: DeviceOOM, failed: dict[Live, dict[str, object]]) -> None:
        """``r`` fails with its pass's workspace out of memory (named the same on every rank of its
        group: the allocator's rank is left out)."""
        rid = r.request.id
        detail = oom.message.split(": ", 1)[1] if oom.message.startswith("rank ") else oom.message
        why = f"request {rid!r} at {r.context} tokens: its pass's workspace found no room: {detail}"
        failed[r] = {
            "kind": "DeviceOOM",
            "request": rid,
            "tokens": r.context,
            "workspace_bytes": oom.fields.get("request"),
            "free_total": oom.fields.get("free_total"),
            "largest_free": oom.fields.get("largest_free"),
            "error": why,
        }
        self.cache.release(r.request.id)
        self.running.remove(r)

    def _grow(self, decoding: list[Live], failed: dict[Live, dict[str, object]]) -> list[Live]:
        """Each decoding request's cache takes its newest token; a full cache fails it (into
        ``failed``) or preempts the newest requests until it fits; the preempted."""
        preempted: list[Live] = []
        for r in decoding:
            if r in preempted:
                continue
            while True:
                try:
                    self.cache.append(r.request.id)
                    break
                except KVCacheFull as full:
                    victim = self._victim()
                    if self.policy.preemption == "none" or victim is None or full.fields.get("never_fits"):
                        failed[r] = {**full.fields, "error": str(full)}
                        self.cache.release(r.request.id)
                        self.running.remove(r)
                        break
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is r:
                        break
        return preempted

    def _victim(self) -> Live | None:
        """The newest running request (a checkpoint's staging holds blocks too, and is no victim)."""
        by_id = {r.request.id: r for r in self.running}
        return next((by_id[rid] for rid in self.cache.preemption_order() if rid in by_id), None)

    def _preempt(self, r: Live) -> None:
        if self.policy.preemption == "swap":
            self._swap_bytes += self.cache.tokens(r.request.id) * self.cache.bytes_per_token
            r.swapped = True
        else:
            r.state = None
        self.cache.release(r.request.id)
        self.running.remove(r)
        self.waiting.insert(0, r)  # first to come back: it arrived before anything still waiting

    def _duration(self, now: float, admitted: list[Live], decoding: list[Live]) -> tuple[float, float]:
        """(the iteration's length, the part of it training's allreduce added)."""
        passes = []
        recomputed = tuple(r.context for r in admitted if not r.swapped and not r.received)
        if recomputed:
            passes.append(cost.prefill(self.dep, recomputed))
        self._swap_bytes += sum(r.context for r in admitted if r.swapped) * self.cache.bytes_per_token
        swap = self._swap_bytes / self.policy.host_Bps
        if decoding:
            mean = sum(r.context for r in decoding) / len(decoding)
            passes.append(cost.decode_step(self.dep, len(decoding), mean))
        transfer = sum(p.transfer_s for p in passes)
        latency = sum(p.comm_s for p in passes) - transfer
        link = self.dep.npu.intra
        extra = self.interference.link_extra_s(now, latency, transfer, link)
        busy = sum(max(p.compute_s, p.memory_s) for p in passes)
        self._fault_s = self.interference.fault_extra_s(now, busy, latency, transfer, link)
        return sum(p.total_s for p in passes) + swap + extra + self._fault_s, extra

    def _wait_for_room(self, now: float) -> float:
        """Nothing runs and the first waiting request does not fit: only a checkpoint's staging can
        hold the blocks, so wait out its write."""
        window = self.interference.during(now, "checkpoint")
        if window is None or STAGING not in self.cache.holders():
            raise TestbedError(
                f"instance {self.name}: request {self.waiting[0].request.id} cannot be admitted and "
                "nothing runs to free room; this is a scheduler bug, please report it"
            )
        return window.end_s - now

    def _stage(self, now: float) -> int:
        """A checkpoint's staging takes its blocks (as many as are free) when its write starts and
        gives them back when it ends; the blocks it holds."""
        staged = STAGING in self.cache.holders()
        writing = self.interference.staging_blocks and self.interference.during(now, "checkpoint")
        if staged and not writing:
            self.cache.release(STAGING)
        elif writing and not staged and self.cache.free_blocks:
            blocks = min(self.interference.staging_blocks, self.cache.free_blocks)
            self.cache.admit(STAGING, blocks * self.cache.block_tokens, arrival=-1.0)
        return len(self.cache.table(STAGING)) if STAGING in self.cache.holders() else 0

    def _prefill(self, r: Live) -> bool:
        """Build the state from the prompt and any tokens it has; True for a fresh request (it gets
        its first token in this iteration's forward pass). A swapped-in request has its state back
        as it left; a received one, as its prefill instance sent it."""
        if r.swapped or r.received:
            r.swapped = r.received = False
            return False
        seq = np.concatenate([r.prompt, np.asarray(r.tokens[:-1], dtype=np.int64)]) if r.tokens else r.prompt
        r.state = self.proxy.prefill(seq)
        return not r.tokens

    def _forward(self, now: float, fresh: list[Live], decoding: list[Live]) -> None:
        """One forward pass of the iteration: the fresh requests' first tokens (their prompts' last
        token is the last) and one more for each decoding request (whose newest token enters its
        state at its position), all in one batch, as an engine runs prefill and decode together;
        a part of a split instance runs the forward pass's collectives with its group."""
        rows, last = [], []
        for r in fresh:
            assert r.state is not None
            rows.append(r.state)
            last.append(int(r.prompt[-1]))
        for r in decoding:
            assert r.state is not None
            r.state = self.proxy.extend(r.state, r.context, r.tokens[-1])
            rows.append(r.state)
            last.append(r.tokens[-1])
        if not rows:
            return
        group = None if self.group is None else self.group(now)
        nxt = self.proxy.next_tokens(np.stack(rows), np.asarray(last, dtype=np.int64), group)
        for r, t in zip([*fresh, *decoding], nxt):
            r.tokens.append(int(t))
