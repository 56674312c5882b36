"""Which ranks a fault reaches: a rank, a supernode, or a selection mode over a pool of ranks.

The modes are Chaos Mesh's (``spec.mode`` and ``spec.value`` of its chaos
objects), drawn from the fault's own random stream:

- ``one``: one rank of the pool, at random (``random`` is the older name);
- ``all``: every rank of the pool;
- ``fixed``: ``value`` ranks, at random;
- ``fixed-percent``: ``value`` percent of the pool, rounded down, at random;
- ``random-max-percent``: a percentage drawn uniformly from 0..``value``,
  then that share of the pool, rounded down.

The pool is the whole cluster, or one supernode when the target also names
``supernode`` (``{mode: fixed, value: 2, supernode: 1}``). A share that
rounds down to no rank reaches one: a fault that reaches nobody is not a
fault (Chaos Mesh would select no pod).

The blast radius is the most ranks one fault can reach, as a share of the
cluster. It may not exceed ``safeguards.blast_radius_percent`` (50 unless
the scenario raises it): a scenario that means to hit more says so there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from faults.kind import ClusterFacts, FaultSpec, Problems

#: the selection modes and what each one picks
MODES = {
    "one": "one rank of the pool, at random",
    "all": "every rank of the pool",
    "fixed": "'value' ranks of the pool, at random",
    "fixed-percent": "'value' percent of the pool (rounded down, at least one), at random",
    "random-max-percent": "a random share between 0 and 'value' percent of the pool (at least one rank)",
}
#: the older name of ``one``
ALIASES = {"random": "one"}
_NEEDS_VALUE = ("fixed", "fixed-percent", "random-max-percent")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _supernodes(facts: ClusterFacts) -> int:
    return int(facts.topology.supernodes) if facts.topology is not None else 1


def _pool(target: dict[str, Any], facts: ClusterFacts) -> list[int]:
    if "supernode" in target and facts.topology is not None:
        return list(facts.topology.ranks_of(int(target["supernode"])))
    return list(range(facts.world))


def target_problems(spec: FaultSpec, facts: ClusterFacts, kind: str, single: bool = False) -> Problems:
    """Problems with a rank target: ``{rank: N}``, ``{supernode: N}`` or ``{mode: M, value: V,
    supernode?: N}``; with ``single`` the fault acts on one rank (``rank`` or ``mode: one``)."""
    t = spec.target
    usage = (
        f"{kind} takes 'target: {{rank: N}}' or '{{mode: one}}'"
        if single
        else f"{kind} takes 'target: {{rank: N}}', '{{supernode: N}}' or '{{mode: M, value: V}}' "
        f"with M one of {', '.join(MODES)}"
    )
    if set(t) == {"rank"}:
        if not _is_int(t["rank"]):
            return [(("target", "rank"), f"rank must be an integer, got {t['rank']!r}")]
        if not 0 <= t["rank"] < facts.world:
            return [
                (
                    ("target", "rank"),
                    f"rank {t['rank']} is outside the cluster: ranks are 0..{facts.world - 1}; "
                    "pick one of those",
                )
            ]
        return []
    problems: Problems = []
    if "supernode" in t:
        sn, nodes = t["supernode"], _supernodes(facts)
        if not _is_int(sn) or not 0 <= sn < nodes:
            problems.append((("target", "supernode"), f"supernode must be in 0..{nodes - 1}, got {sn!r}"))
    if "mode" in t and not isinstance(t["mode"], str):
        return [(("target", "mode"), f"mode is a name, one of {', '.join(MODES)}; got {t['mode']!r}")]
    mode = ALIASES.get(t.get("mode"), t.get("mode"))  # type: ignore[arg-type]
    extra = sorted(set(t) - {"mode", "value", "supernode"})
    if (
        extra
        or (single and (mode != "one" or "supernode" in t))
        or (mode is None and set(t) != {"supernode"})
    ):
        return [(("target",), usage)]
    if mode is not None and mode not in MODES:
        return [(("target", "mode"), f"unknown mode {t['mode']!r}; use one of {', '.join(MODES)}")]
    return problems + _value_problems(mode, t, facts)


def _value_problems(mode: str | None, t: dict[str, Any], facts: ClusterFacts) -> Problems:
    value = t.get("value")
    if mode not in _NEEDS_VALUE:
        if "value" in t:
            return [(("target", "value"), f"mode {mode} takes no value; remove it")]
        return []
    if mode == "fixed":
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return [(("target", "value"), f"mode fixed needs a whole number of ranks >= 1, got {value!r}")]
        if value > facts.world:
            return [(("target", "value"), f"{value} ranks is more than the cluster's {facts.world}")]
        return []
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 100:
        return [(("target", "value"), f"mode {mode} needs a percentage in (0, 100], got {value!r}")]
    return []


def _count(mode: str, value: float, pool: int, rng: np.random.Generator) -> int:
    if mode == "one":
        return 1
    if mode == "all":
        return pool
    if mode == "fixed":
        return min(int(value), pool)
    share = value if mode == "fixed-percent" else float(rng.integers(0, int(value) + 1))
    return max(1, math.floor(pool * share / 100))


def draw_ranks(target: dict[str, Any], pool: list[int], rng: np.random.Generator) -> list[int]:
    """The ranks a mode target picks from ``pool`` with ``rng`` (sorted); a named rank is itself."""
    if "rank" in target:
        return [int(target["rank"])]
    mode = ALIASES.get(target.get("mode", "all"), target.get("mode", "all"))
    if mode == "one":
        return [pool[int(rng.integers(len(pool)))]]
    n = _count(mode, float(target.get("value", 0)), len(pool), rng)
    if n >= len(pool):
        return sorted(pool)
    return sorted(int(r) for r in rng.choice(pool, size=n, replace=False))


def resolve_ranks(spec: FaultSpec, seed: int, facts: ClusterFacts, label: str = "target") -> list[int]:
    """The ranks ``spec`` reaches, drawn from its own stream (a valid target assumed)."""
    return draw_ranks(spec.target, _pool(spec.target, facts), spec.stream(seed, label))


def pool_of(spec: FaultSpec, facts: ClusterFacts) -> list[int]:
    """The ranks a mode target draws from: the cluster, or the supernode it names."""
    return _pool(spec.target, facts)


def reach(spec: FaultSpec, facts: ClusterFacts) -> int:
    """The most ranks ``spec`` can reach (its blast radius in ranks; 0 for a target of no ranks)."""
    t = spec.target
    if "rank" in t:
        return 1
    if "mode" not in t and "supernode" not in t:
        return 0
    mode = ALIASES.get(t.get("mode", "all"), t.get("mode", "all"))
    pool = len(_pool(t, facts))
    if mode == "random-max-percent":
        return max(1, math.floor(pool * float(t.get("value", 0)) / 100))
    return _count(str(mode), float(t.get("value", 0)), pool, np.random.default_rng(0))


def blast_problems(spec: FaultSpec, facts: ClusterFacts, cap_percent: float) -> Problems:
    """A fault that can reach more than ``cap_percent`` of the ranks, refused with the way to mean it."""
    n = reach(spec, facts)
    if n == 0 or n * 100 <= cap_percent * facts.world:
        return []
    share = 100 * n / facts.world
    return [
        (
            ("target",),
            f"this fault can reach {n} of {facts.world} ranks ({share:.0f} %), above the blast-radius "
            f"cap of {cap_percent:g} %; narrow the target, or raise 'safeguards.blast_radius_percent' "
            f"to at least {math.ceil(share)} if the scenario means it",
        )
    ]


def single_rank(spec: FaultSpec, seed: int, facts: ClusterFacts) -> int:
    """The one rank of a ``{rank: N}`` or ``{mode: one}`` target."""
    return resolve_ranks(spec, seed, facts)[0]
