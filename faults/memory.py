"""Memory faults: device memory that something else has carved up.

``memory_fragment`` pins ``count`` blocks of ``block`` bytes on the targeted
NPUs at a step, with a ``spacing``-byte hole after each (allocated, then
freed), so the cache is left in pieces; ``release_after`` steps later (or
never) the blocks are freed again. A restart gives an NPU fresh memory, so
the pattern does not survive one.

In a serving run it strikes the instance of its ``rank`` at ``at: {time:
T}``: the pattern is pinned in the instance's activation memory for
``duration`` (default: to the end), where a pass's workspace that finds no
block large enough turns into a compaction, a borrow from the supernode's
pool, or a named out-of-memory (:mod:`testbed.serve.workspace`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from faults.evidence import Effect, Evidence, ranks_text
from faults.kind import ClusterFacts, FaultKind, FaultSpec, Injector, PlannedFault, Problems, register
from faults.targets import resolve_ranks, target_problems
from testbed.core.units import parse_duration, parse_size
from testbed.serve.colocation import Window


@register
class MemoryFragment(FaultKind):
    """Pin a pattern of blocks in device memory."""

    name = "memory_fragment"
    targets_ranks = True
    serves = True
    description = (
        "pin 'count' blocks of 'block' bytes with 'spacing' holes on NPUs, released 'release_after' steps on"
    )
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "block": ("size", "bytes of each pinned block"),
        "count": ("integer", "how many blocks are pinned"),
        "spacing": ("size", "bytes of the hole left between two pinned blocks"),
        "release_after": ("integer", "the blocks are freed this many steps later (none: never)"),
        "duration": (
            "seconds",
            "serving: how long the pattern stays in an instance's activation memory (none: for good)",
        ),
    }
    params: ClassVar[dict[str, Any]] = {
        "block": "256KiB",
        "count": 8,
        "spacing": "256KiB",
        "release_after": None,
        "duration": None,
    }

    def serving_windows(self, spec: FaultSpec, start_s: float) -> list[tuple[int, Window]]:
        """The target rank's instance holds the pattern in its activation memory for ``duration``."""
        p = {**self.params, **spec.params}
        duration = parse_duration(p["duration"]) if p["duration"] is not None else None
        end = start_s + duration if duration is not None else float("inf")
        pin = (int(parse_size(p["block"]) or 0), int(p["count"]), int(parse_size(p["spacing"]) or 0))
        return [(int(spec.target["rank"]), Window(start_s, end, "fragment", pin=pin))]

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """A target of ranks, a step, sizes and counts."""
        problems: Problems = []
        problems += target_problems(spec, facts, self.name)
        step = spec.at.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or not 1 <= step <= facts.steps:
            problems.append((("at", "step"), f"'at: {{step: N}}' needs N in 1..{facts.steps}, got {step!r}"))
        for name in ("block", "spacing"):
            if name in spec.params and not parse_size(spec.params[name]):
                problems.append(
                    ((name,), f"'{spec.params[name]}' is not a size; write bytes or '256KiB', '1MiB'")
                )
        duration = spec.params.get("duration")
        if duration is not None and not parse_duration(duration):
            problems.append(
                (("duration",), f"duration must be a positive time like 30 or '30s', got {duration!r}")
            )
        for name in ("count", "release_after"):
            value = spec.params.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                problems.append(((name,), f"{name} must be a whole number of at least 1, got {value!r}"))
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """Resolve the ranks and the sizes."""
        ranks = resolve_ranks(spec, seed, facts)
        p = {**self.params, **spec.params}
        params = {
            "ranks": ranks,
            "block": parse_size(p["block"]),
            "count": int(p["count"]),
            "spacing": parse_size(p["spacing"]),
            "release_after": p["release_after"],
        }
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=ranks[0] if len(ranks) == 1 else -1,
            step=int(spec.at["step"]),
            point="boundary",
            params=params,
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Pin the pattern now; say when to release it."""
        p = fault.params
        after = injector.fragment_memory(p["ranks"], fault.id, p["block"], p["count"], p["spacing"])
        heal = None if p["release_after"] is None else fault.step + int(p["release_after"])
        return {"after": after, "heal_step": heal}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """Free the pinned blocks."""
        injector.release_memory(fault.params["ranks"], fault.id)

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The blocks pinned on each rank."""
        after = fired.get("record", {}).get("after", {})
        pinned = {int(r): int(stats.get("pinned", 0)) for r, stats in after.items()}
        hit = sorted(r for r, n in pinned.items() if n)
        if not hit:
            return Effect(False, "no block could be pinned: the device memory was full")
        return Effect(True, f"pinned {sum(pinned.values())} block(s) on {ranks_text(hit)}")
