"""The JSON Schema of a scenario file (``testbed schema``), for editors that check YAML as it is typed.

Derived from the model's field declarations (:mod:`testbed.scenario.fields`),
the same ones the parser reads, so it cannot fall behind them: each field's
type, unit, bounds, default and doc; the names a choice takes come from the
registries (presets, workloads, fault kinds, strategies, components). What a
schema cannot express (a layout that must fit the cluster, a fault target
inside it, a step inside the run) is left to ``testbed validate``; the tests
check that every library scenario satisfies the schema.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from faults.kind import kinds
from testbed.scenario.expect import Expect
from testbed.scenario.fields import Spec, declared, key_of, layout_schema, seconds_schema
from testbed.scenario.job_section import JobSection
from testbed.scenario.model import SEED_MAX, VERSION, ClusterSpec, Policy, Safeguards, WorkloadSpec
from testbed.scenario.serve_section import ServeSection


def _bounded(kind: str, spec: Spec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind}
    if spec.lo is not None:
        out["minimum"] = spec.lo
    if spec.hi is not None:
        out["maximum"] = spec.hi
    return out


def field_schema(spec: Spec, default: Any = None) -> dict[str, Any]:
    """The schema of one declared field."""
    if spec.kind == "int":
        out = _bounded("integer", spec)
    elif spec.kind == "float":
        out = _bounded("number", spec)
    elif spec.kind == "seconds":
        out = seconds_schema(spec.lo, spec.hi)
        spec = dataclasses.replace(spec, doc=f"{spec.doc + ': ' if spec.doc else ''}seconds, or a duration")
    elif spec.kind == "bool":
        out = {"type": "boolean"}
    elif spec.kind == "choice":
        out = {"enum": spec.names()}
    elif spec.kind == "text":
        out = {"type": "string"}
    elif spec.kind == "section":
        assert spec.section is not None
        out = section_schema(spec.section)
        if spec.nullable:
            out = {"oneOf": [{"type": "null"}, out]}
    else:
        out = spec.schema() if spec.schema is not None else {}
    if default is not None and spec.kind != "section":
        if spec.kind != "custom":
            out["default"] = default
        elif isinstance(default, (tuple, list)) and default:  # a list's default says what is left out
            out["default"] = list(default)
    if spec.doc:
        out["description"] = spec.doc
    return out


def section_schema(cls: type, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object of a section's declared fields (and the keys the parser consumes), nothing else."""
    props = {}
    for f, spec in declared(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        props[key_of(f, spec)] = field_schema(spec, default)
    for key, spec in getattr(cls, "inputs", {}).items():
        props[key] = field_schema(spec)
    out: dict[str, Any] = {"type": "object", "properties": {**props, **(extra or {})}}
    out["additionalProperties"] = False
    if cls.__doc__:
        out["description"] = cls.__doc__.split("\n\n")[0].replace("\n", " ")
    return out


def _workload() -> dict[str, Any]:
    from workloads import WORKLOADS

    options: dict[str, Any] = {}
    for info in WORKLOADS.values():
        for key, default in info.options.items():
            if key in options:
                continue
            owners = [w for w in WORKLOADS.values() if key in w.options]
            doc = info.option_docs.get(key, "an option of the workload")
            desc = f"{', '.join(w.name for w in owners)}: {doc}"
            kind = "integer" if isinstance(default, int) else "number"  # a count is whole
            options[key] = {"type": kind, "minimum": 0, "default": default, "description": desc}
    parallel = layout_schema("the workload's")
    parallel["description"] += " (default: all data-parallel)"
    return section_schema(WorkloadSpec, {"parallel": parallel, **options})


def param_schema(kind_of: str, doc: str, default: Any) -> dict[str, Any]:
    """The schema of one fault parameter declared as ``(type, meaning)`` (``FaultKind.param_docs``)."""
    out: dict[str, Any]
    if kind_of == "seconds":
        out = {"oneOf": [*seconds_schema(0.0)["oneOf"], {"type": "null"}]}
        doc += " (seconds, or a duration: 30s, 500ms, 2h)"
    elif kind_of == "size":
        out = {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]}
        doc += " (bytes, or a size: 256KiB, 4MiB)"
    elif kind_of == "rate":
        out = {"oneOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string"}, {"type": "null"}]}
        doc += " (bytes per second, or a rate: 10Gbps, 10gbit, 1.25GB/s)"
    elif kind_of in ("number", "integer"):
        out = {"type": [kind_of, "null"], "minimum": 0}
    elif kind_of == "boolean":
        out = {"type": "boolean"}
    elif "|" in kind_of:
        out = {"enum": kind_of.split("|")}
    else:
        out = {"type": "string"}
    if default is not None:
        out["default"] = default
    return {**out, "description": doc}


TARGET = (
    "what it strikes: {rank: N}, {supernode: N}, {supernodes: [N, ...]} (a partition), {link: [a, b]}, "
    "{link_class: intra|inter}, a {mode: ...}"
)
AT = "when: {step: N} (with during: a point of the step), {every: N}, {time: T}, or {mtbf: T}"


def _faults() -> dict[str, Any]:
    variants = []
    for name, kind in sorted(kinds().items()):
        props: dict[str, Any] = {
            "kind": {"const": name, "description": kind.description},
            "target": {"type": "object", "description": TARGET},
            "at": {"type": "object", "description": AT},
        }
        for param, default in kind.params.items():
            declared_as = kind.param_doc(param) or ("text", "a parameter of this kind")
            props[param] = param_schema(*declared_as, default)
        variants.append(
            {"type": "object", "properties": props, "additionalProperties": False, "required": ["kind"]}
        )
    return {
        "type": "array",
        "items": {"oneOf": variants},
        "description": "the faults to inject, each a kind, a target, a trigger and the kind's own fields",
    }


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a version-1 scenario file."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "testbed scenario",
        "type": "object",
        "required": ["version"],
        "additionalProperties": False,
        "properties": {
            "version": {"const": VERSION, "description": f"the scenario format's version: {VERSION}"},
            "name": {
                "type": "string",
                "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                "description": "the scenario's name: 1-64 letters, digits, '.', '_' or '-'",
            },
            "description": {"type": "string", "description": "what the scenario rehearses, in a line"},
            "tags": {
                "type": "array",
                "items": {"type": "string", "pattern": r"^[a-z0-9][a-z0-9_-]{0,31}$"},
                "description": "labels for choosing scenarios of a suite (smoke, fast, slow, a topic)",
            },
            "seed": {
                "type": "integer",
                "minimum": 0,
                "maximum": SEED_MAX,
                "default": 0,
                "description": "the root seed: faults, data, dropout and link setup times all derive from it",
            },
            "cluster": section_schema(ClusterSpec),
            "workload": _workload(),
            "policy": section_schema(Policy),
            "faults": _faults(),
            "safeguards": section_schema(Safeguards),
            "expect": section_schema(Expect),
            "job": section_schema(JobSection),
            "serve": section_schema(ServeSection),
        },
    }
