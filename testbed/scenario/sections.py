"""Sections of a scenario read from their fields' declarations, and the fields with rules of their own.

Each section's fields are read by kind (:mod:`testbed.scenario.fields`); a
custom field names its parser in :data:`CUSTOM`; a section with rules across
its fields has a hook in :data:`AFTER`; the cluster, whose rank table and
preset shape the rest, has a builder of its own (:data:`BUILDERS`), and so
does the workload, whose options depend on the model chosen.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed.core.registry import CHECKS
from testbed.core.units import format_bytes, parse_duration, parse_size
from testbed.scenario.checker import Checker, names
from testbed.scenario.expect import DETECTORS, Expect, Range
from testbed.scenario.fields import Spec, declared, key_of
from testbed.scenario.hostfit import HostMemory, rank_problems
from testbed.scenario.model import CheckpointPolicy, ClusterSpec, WorkloadSpec
from testbed.scenario.source import Path as YPath
from testbed.topology.layout import Layout
from testbed.topology.presets import PRESETS
from testbed.topology.ranktable import read_rank_table
from testbed.train.checkpoint import COMPONENTS

# --- sections read from their declarations ------------------------------------------------------

Values = dict[str, Any]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def read_field(c: Checker, m: dict[str, Any], f: dataclasses.Field[Any], spec: Spec, path: YPath) -> Any:
    """One declared field of the mapping ``m`` (its default when absent), its problems reported."""
    key, default = key_of(f, spec), _default(f)
    if spec.kind in ("int", "float", "seconds"):
        if spec.optional and m.get(key) is None:
            return None
        lo = -math.inf if spec.lo is None else spec.lo
        hi = math.inf if spec.hi is None else spec.hi
        unit = "s" if spec.kind == "seconds" else ""
        return c.number(m, key, path, default, lo, hi, integer=spec.kind == "int", unit=unit)
    if spec.kind == "bool":
        value = c.boolean(m, key, path)
        return default if value is None else value
    if spec.kind == "choice":
        return c.choice(m, key, path, default, spec.names(), spec.what)
    if spec.kind == "text":
        return str(m.get(key, default))
    if spec.kind == "section":
        assert spec.section is not None
        if (spec.present_is_on and key not in m) or (spec.nullable and key in m and m[key] is None):
            return None
        return build(c, spec.section, m.get(key), (*path, key))
    return CUSTOM[spec.parser](c, m, key, path, default, *spec.args)


def read_section(
    c: Checker, cls: type, raw: Any, path: YPath, extra: tuple[str, ...] = ()
) -> tuple[dict[str, Any], Values]:
    """The mapping of a section (unknown keys reported) and the values of its declared fields."""
    fields = declared(cls)
    inputs = tuple(getattr(cls, "inputs", {}))
    m = c.mapping(raw, path, (*(key_of(f, s) for f, s in fields), *inputs, *extra))
    return m, {f.name: read_field(c, m, f, s, path) for f, s in fields}


def build(c: Checker, cls: type, raw: Any, path: YPath) -> Any:
    """A section's dataclass from its mapping: its own builder, or its declarations and its hook."""
    if cls in BUILDERS:
        return BUILDERS[cls](c, raw, path)
    m, values = read_section(c, cls, raw, path)
    hook = AFTER.get(cls)
    return cls(**(hook(c, m, path, values) if hook else values))


# --- custom fields ------------------------------------------------------------------------------------


def _size(c: Checker, m: dict[str, Any], key: str, path: YPath, default: int) -> int:
    """A size in bytes of at least 1 MiB: a number, or ``16MiB``, ``2GiB`` (0: unset)."""
    memory = parse_size(m.get(key, default))
    if memory is None or (memory and memory < 2**20):
        c.problem(
            (*path, key),
            f"'{m.get(key)}' is not a device memory size of at least 1 MiB; write bytes or '16MiB', '2GiB'",
        )
        return default
    return memory


def _components(
    c: Checker, m: dict[str, Any], key: str, path: YPath, default: tuple[str, ...]
) -> tuple[str, ...]:
    """A list of checkpoint components under ``key`` (unknown names are reported)."""
    value = m.get(key, list(default))
    if not isinstance(value, list):
        c.problem((*path, key), f"expected a list drawn from {', '.join(COMPONENTS)}")
        return default
    for i, comp in enumerate(value):
        if comp not in COMPONENTS:
            near = difflib.get_close_matches(str(comp), COMPONENTS, n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            c.problem((*path, key, i), f"unknown component '{comp}'. Known: {', '.join(COMPONENTS)}.{hint}")
    return tuple(x for x in value if x in COMPONENTS)


def _tolerance(
    c: Checker, m: dict[str, Any], key: str, path: YPath, default: Any, scalar: str, top: float
) -> Range | None:
    return _range(c, m, key, path, scalar, top)


def _detectors_field(
    c: Checker, m: dict[str, Any], key: str, path: YPath, default: Any
) -> tuple[str, ...] | None:
    return _detectors(c, m, path)


def _check_names(c: Checker, m: dict[str, Any], key: str, path: YPath, default: Any) -> tuple[str, ...]:
    return names(c, m[key], (*path, key), tuple(CHECKS), "checks") if key in m else ()


def _wall_budget(c: Checker, m: dict[str, Any], key: str, path: YPath, default: Any) -> float | None:
    """A positive duration, or None (no budget)."""
    wall = m.get(key)
    seconds = parse_duration(wall) if wall is not None else None
    if wall is not None and (seconds is None or seconds <= 0):
        c.problem((*path, key), f"{key} must be a positive duration like 600 or '10m', got {wall!r}")
    return seconds if seconds and seconds > 0 else None


def _stages(c: Checker, m: dict[str, Any], key: str, path: YPath, default: Any) -> tuple[int, ...]:
    """A list of layer counts, one per pipeline stage (checked against the model in the parser)."""
    value = m.get(key, list(default))
    if not isinstance(value, list) or not all(type(n) is int and n >= 1 for n in value):
        c.problem((*path, key), f"expected a list of layer counts, one per pipeline stage, got {value!r}")
        return tuple(default)
    return tuple(value)


def _job_layout(c: Checker, m: dict[str, Any], key: str, path: YPath, default: Any) -> tuple[int, ...]:
    """``{dp, tp, pp, ep}`` of the modelled job (each 1 unless given), as ``(dp, tp, pp, ep)``;
    empty when absent (checked against the workload's layout in the parser)."""
    if key not in m:
        return tuple(default)
    par = c.mapping(m[key], (*path, key), ("dp", "tp", "pp", "ep"))
    return tuple(
        int(c.number(par, axis, (*path, key), 1, 1, 10**7, integer=True)) for axis in ("dp", "tp", "pp", "ep")
    )


def _job_cluster(c: Checker, m: dict[str, Any], key: str, path: YPath, default: Any) -> tuple[int, ...]:
    """``{supernodes, npus_per_supernode}`` of the modelled job's own cluster, as a pair; empty when
    absent (checked against the job's NPUs and the preset in the parser)."""
    if key not in m:
        return tuple(default)
    spec = c.mapping(m[key], (*path, key), ("supernodes", "npus_per_supernode"))
    missing = [k for k in ("supernodes", "npus_per_supernode") if k not in spec]
    if missing:
        c.problem(
            (*path, key),
            f"give {' and '.join(missing)}, like cluster: {{supernodes: 2, npus_per_supernode: 384}}",
        )
        return tuple(default)
    return tuple(
        int(c.number(spec, k, (*path, key), 1, 1, 10**7, integer=True))
        for k in ("supernodes", "npus_per_supernode")
    )


def _bursts(c: Checker, m: dict[str, Any], key: str, path: YPath, default: Any) -> tuple[Any, ...]:
    """A list of bursts, each a mapping of :class:`~testbed.scenario.serve_section.BurstSection`."""
    from testbed.scenario.serve_section import BurstSection

    value = m.get(key, list(default))
    if not isinstance(value, list):
        c.problem((*path, key), f"expected a list of bursts like [{{at: 10s, count: 8}}], got {value!r}")
        return tuple(default)
    return tuple(build(c, BurstSection, item, (*path, key, i)) for i, item in enumerate(value))


#: the parsers of custom fields, by the name their declaration gives
CUSTOM: dict[str, Callable[..., Any]] = {
    "device_memory": _size,
    "components": _components,
    "tolerance": _tolerance,
    "detectors": _detectors_field,
    "check_names": _check_names,
    "wall_budget": _wall_budget,
    "stages": _stages,
    "job_layout": _job_layout,
    "job_cluster": _job_cluster,
    "bursts": _bursts,
}


# --- rules across a section's fields --------------------------------------------------------------


def _checkpoint(c: Checker, m: dict[str, Any], path: YPath, v: Values) -> Values:
    """What a resume loads defaults to what is saved, and can only be what is saved."""
    if "restore" not in m:
        v["restore"] = v["include"]
    unsaved = [x for x in v["restore"] if x not in v["include"]]
    if unsaved:
        c.problem(
            (*path, "restore"),
            f"restore names {', '.join(unsaved)}, which include does not save; add it to include or drop it "
            "from restore",
        )
    return v


def _expect(c: Checker, m: dict[str, Any], path: YPath, v: Values) -> Values:
    """A scenario meant to fail names the checks that must fail; checks fail only in such a run."""
    if "verdict" not in m and v["fails"]:
        v["verdict"] = "fail"
    if v["verdict"] == "fail" and not v["fails"] and not m.get("fails"):
        c.problem(
            (*path, "verdict"),
            "a scenario meant to fail names the checks that must fail: add 'fails: [CHECK, ...]' "
            f"(checks: {', '.join(CHECKS)})",
        )
    if v["fails"] and v["verdict"] not in ("fail", "aborted"):
        c.problem(
            (*path, "fails"), f"checks fail only in a failed or aborted run, not with verdict: {v['verdict']}"
        )
    return v


#: hooks that check (and complete) a section's values once its fields are read
AFTER: dict[type, Callable[[Checker, dict[str, Any], YPath, Values], Values]] = {
    CheckpointPolicy: _checkpoint,
    Expect: _expect,
}


# --- sections whose shape in the file is their own ------------------------------------------------


def _rank_table(c: Checker, m: dict[str, Any], path: YPath, base: Path) -> dict[str, Any]:
    """``cluster.rank_table``: the preset and sizes an HCCL rank table gives (a file under ``base``)."""
    where: YPath = (*path, "rank_table")
    name = m["rank_table"]
    if not isinstance(name, str) or not name:
        c.problem(where, "expected the path of an HCCL rank table JSON file, relative to the scenario")
        return {}
    target = (base / name).resolve()
    if Path(name).is_absolute() or not target.is_relative_to(base.resolve()):
        c.problem(where, f"'{name}' is outside the scenario's folder; put the rank table beside the scenario")
        return {}
    clash = sorted({"preset", "supernodes", "npus_per_supernode"} & set(m))
    if clash:
        c.problem((*path, clash[0]), f"'{clash[0]}' is set by the rank table; drop it or drop rank_table")
    table, problems = read_rank_table(target)
    for problem in problems:
        c.problem(where, f"rank table {name}: {problem}")
    if table is None:
        return {}
    return {
        "preset": table.preset,
        "supernodes": table.supernodes,
        "npus_per_supernode": table.npus_per_supernode,
    }


def _cluster(c: Checker, raw: Any, path: YPath) -> ClusterSpec:
    """The cluster: a rank table gives preset and sizes; a preset caps its supernodes' NPUs and HBM."""
    m = c.mapping(raw, path, (*(key_of(f, s) for f, s in declared(ClusterSpec)), *ClusterSpec.inputs))
    if "rank_table" in m:
        m = {**m, **_rank_table(c, m, path, c.base)}
    values: Values = {}
    for f, spec in declared(ClusterSpec):
        if f.name == "npus_per_supernode":  # the preset's own cap
            spec = replace(spec, hi=PRESETS[values["preset"]].max_npus_per_supernode)
        values[f.name] = read_field(c, m, f, spec, path)
    hbm = PRESETS[values["preset"]].hbm_bytes
    if values["device_memory"] > hbm:
        c.problem(
            (*path, "device_memory"),
            f"{format_bytes(values['device_memory'])} is more than an NPU of {values['preset']} has "
            f"({format_bytes(hbm)} of HBM); device memory is the preset's HBM scaled down: write at most "
            "that, or leave it out (HBM x 1e-4)",
        )
        values["device_memory"] = 0
    return ClusterSpec(**values)


def workload(c: Checker, raw: Any, cluster: ClusterSpec) -> WorkloadSpec:
    """The workload: its declared fields, ``parallel`` (fitting the cluster), and the chosen model's own
    options beside them (each a non-negative number, whole where the default is; the model checks them,
    and their size)."""
    from workloads import WORKLOADS

    path: YPath = ("workload",)
    name = c.choice(raw if isinstance(raw, dict) else {}, "name", path, "mlp", sorted(WORKLOADS), "workload")
    option_names = tuple(WORKLOADS[name].options)
    m, values = read_section(c, WorkloadSpec, raw, path, option_names)
    layout = _parallel(c, m.get("parallel"), (*path, "parallel"), cluster)
    options = {k: m[k] for k in option_names if k in m}
    bad = False
    for k, v in options.items():
        default = WORKLOADS[name].options[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            c.problem((*path, k), f"expected a non-negative number (default {default}), got {v!r}")
            bad = True
        elif isinstance(default, int) and v != int(v):  # a count: a fraction would be cut off unsaid
            c.problem((*path, k), f"expected a whole number (default {default}), got {v!r}")
            bad = True
    validate = WORKLOADS[name].validate
    if not bad and validate is not None:
        for message in validate({**WORKLOADS[name].options, **options}, layout):
            c.problem(path, f"workload '{name}': {message}")
    if not bad:
        for message in rank_problems(name, options, layout, HostMemory.now()):
            c.problem(path, f"workload '{name}': {message}")
    return WorkloadSpec(
        **{**values, "name": name},
        dp=layout.dp,
        tp=layout.tp,
        pp=layout.pp,
        ep=layout.ep,
        options={**options, "steps": values["steps"]},
    )


def _parallel(c: Checker, raw: Any, path: YPath, cluster: ClusterSpec) -> Layout:
    """``parallel: {dp, tp, pp, ep}``, whose product must be the cluster's NPUs (dp fills it when absent)."""
    par = c.mapping(raw, path, ("dp", "tp", "pp", "ep"))
    world = cluster.supernodes * cluster.npus_per_supernode
    tp = c.number(par, "tp", path, 1, 1, integer=True)
    pp = c.number(par, "pp", path, 1, 1, integer=True)
    ep = c.number(par, "ep", path, 1, 1, integer=True)
    dp = c.number(par, "dp", path, max(1, world // (tp * pp * ep)), 1, integer=True)
    layout = Layout(dp=dp, tp=tp, pp=pp, ep=ep)
    if layout.world != world:
        c.problem(
            path,
            f"the parallel layout dp×tp×pp×ep = {dp}×{tp}×{pp}×{ep} = {layout.world} does not fit the "
            f"cluster's {world} NPUs ({cluster.supernodes} supernodes × {cluster.npus_per_supernode}); "
            f"make the product {world}",
        )
    return layout


#: sections built by code of their own instead of from their declarations alone
BUILDERS: dict[type, Callable[[Checker, Any, YPath], Any]] = {ClusterSpec: _cluster}


def _range(c: Checker, m: dict[str, Any], key: str, path: YPath, scalar: str, top: float) -> Range | None:
    """A tolerance: a number (``scalar``: ``exact``, ``max`` or ``min``) or an inclusive ``[low, high]``."""
    value = m.get(key)
    if value is None:
        return None
    number = (int, float)
    if isinstance(value, number) and not isinstance(value, bool) and 0 <= value <= top:
        v = float(value)
        return {"exact": Range(v, v), "max": Range(0.0, v), "min": Range(v, top)}[scalar]
    pair = isinstance(value, list) and len(value) == 2
    if pair and all(isinstance(v, number) and not isinstance(v, bool) for v in value):
        lo, hi = float(value[0]), float(value[1])
        if 0 <= lo <= hi <= top:
            return Range(lo, hi)
    c.problem(
        (*path, key),
        f"expected a number between 0 and {top:g} or an inclusive range [low, high] within it, got {value!r}",
    )
    return None


def _detectors(c: Checker, m: dict[str, Any], path: YPath) -> tuple[str, ...] | None:
    value = m.get("detected_by")
    if value is None:
        return None
    if value == []:
        c.problem((*path, "detected_by"), f"expected a detector or a list of them: {', '.join(DETECTORS)}")
        return None
    return names(c, value, (*path, "detected_by"), DETECTORS, "detectors")
