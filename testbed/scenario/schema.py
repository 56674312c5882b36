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
from testbed.scenario.fields import Spec, declared, key_of, seconds_schema
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
    if default is not None and spec.kind not in ("section", "custom"):
        out["default"] = default
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
            options.setdefault(
                key, {"type": "number", "minimum": 0, "default": default, "description": "a model option"}
            )
    parallel = {
        "type": "object",
        "properties": {a: {"type": "integer", "minimum": 1} for a in ("dp", "tp", "pp", "ep")},
        "additionalProperties": False,
        "description": "dp x tp x pp x ep = the NPUs",
    }
    return section_schema(WorkloadSpec, {"parallel": parallel, **options})


def _faults() -> dict[str, Any]:
    variants = []
    for name, kind in sorted(kinds().items()):
        props: dict[str, Any] = {
            "kind": {"const": name, "description": kind.description},
            "target": {"type": "object"},
            "at": {"type": "object"},
        }
        for param, default in kind.params.items():
            props[param] = {"default": default} if default is not None else {}
        variants.append(
            {"type": "object", "properties": props, "additionalProperties": False, "required": ["kind"]}
        )
    return {"type": "array", "items": {"oneOf": variants}}


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a version-1 scenario file."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "testbed scenario",
        "type": "object",
        "required": ["version"],
        "additionalProperties": False,
        "properties": {
            "version": {"const": VERSION},
            "name": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"},
            "description": {"type": "string"},
            "tags": {
                "type": "array",
                "items": {"type": "string", "pattern": r"^[a-z0-9][a-z0-9_-]{0,31}$"},
                "description": "labels for choosing scenarios of a suite (smoke, fast, slow, a topic)",
            },
            "seed": {"type": "integer", "minimum": 0, "maximum": SEED_MAX, "default": 0},
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
