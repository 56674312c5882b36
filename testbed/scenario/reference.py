"""The scenario file's reference page (``docs/scenario.md``), written from the schema.

Every field of every section, with its type (and unit), default and meaning,
comes from the same declarations the parser reads (through
:func:`testbed.scenario.schema.scenario_schema`), so the page cannot fall
behind the code; a test regenerates it and compares. ``python -m
testbed.scenario.reference > docs/scenario.md`` writes it.
"""

from __future__ import annotations

import json
from typing import Any

from testbed.scenario.schema import scenario_schema

INTRO = """# The scenario file

A scenario is one YAML document: the cluster, the training job (or the
serving deployment), the policy the job follows, the faults, and what you
expect. This page lists every field, as `testbed validate` and `testbed
schema` know them; the other pages say what each part does. Durations take
a number of seconds or a unit (`30s`, `500ms`, `2m`, `1h`); sizes take bytes
or a unit (`256KiB`, `32MiB`). A field left out takes its default. A
section left out takes its defaults too (a run without `cluster:` runs on
two supernodes of four NPUs of `atlas-900-a3`; `testbed validate` says so
whenever a problem may come from it).

This page is written from the schema (`python -m testbed.scenario.reference
> docs/scenario.md`); a test keeps it so.
"""

#: where each top-level section is explained in full
PAGES = {
    "cluster": "[the job model](job.md), [scale](scale.md), [device memory](recovery.md#device-memory)",
    "workload": "[parallel training](parallel.md)",
    "policy": "[recovery](recovery.md), [timeouts](timeouts.md), [collectives](collectives.md)",
    "faults": "[fault kinds](recovery.md#fault-kinds), [link faults](collectives.md#link-faults)",
    "safeguards": "[safeguards](recovery.md#safeguards)",
    "expect": "[checks](recovery.md), [drills and suites](drills.md)",
    "job": "[the job model](job.md)",
    "serve": "[serving](serving.md)",
}


def type_of(s: dict[str, Any]) -> str:
    """A field's type in words, with its unit."""
    if "const" in s:
        return f"`{s['const']}`"
    if "enum" in s:
        return " \\| ".join(f"`{v}`" for v in s["enum"])
    options = s.get("oneOf") or s.get("anyOf")
    if options:
        kinds = [type_of(o) for o in options if o.get("type") != "null"]
        if any("pattern" in o and o.get("type") == "string" for o in options) and "number" in kinds:
            return "seconds, or a duration"
        if "integer" in kinds and "text" in kinds:
            return "bytes, or a size"
        return " or ".join(dict.fromkeys(kinds)) + (" or null" if len(kinds) < len(options) else "")
    t = s.get("type")
    if isinstance(t, list):
        return " or ".join(x for x in t if x != "null")
    return {"string": "text", "object": "mapping", "array": "list", "boolean": "true or false"}.get(
        str(t), str(t)
    )


#: what the type column already says, left out of the meaning
_UNITS = (
    ": seconds, or a duration",
    " (seconds, or a duration: 30s, 500ms, 2h)",
    " (bytes, or a size: 256KiB, 4MiB)",
)


def meaning(s: dict[str, Any]) -> str:
    """A field's description for a table cell: one line, in Markdown, without the unit twice."""
    text = " ".join(str(s.get("description", "")).split()).replace("``", "`")
    for unit in _UNITS:
        text = text.replace(unit, "")
    return text.replace("|", "\\|")


def _default(s: dict[str, Any]) -> str:
    if "default" not in s:
        return ""
    return f"`{json.dumps(s['default'])}`"


def _rows(props: dict[str, Any], prefix: str) -> list[str]:
    """One table row per field, nested mappings flattened to dotted names."""
    out = []
    for key, s in props.items():
        name = f"{prefix}{key}"
        inner = s
        for option in s.get("oneOf", []):
            if option.get("type") == "object":
                inner = option
        if inner.get("type") == "object" and inner.get("properties"):
            out.append(f"| `{name}` | mapping | | {meaning(s)} |")
            out += _rows(inner["properties"], f"{name}.")
            continue
        items = s.get("items") if s.get("type") == "array" else None
        out.append(f"| `{name}` | {type_of(s)} | {_default(s)} | {meaning(s)} |")
        if isinstance(items, dict) and items.get("properties"):
            out += _rows(items["properties"], f"{name}[].")
    return out


def _faults(schema: dict[str, Any]) -> list[str]:
    out = ["Every entry has `kind`, `target` and `at`; each kind takes its own fields too:", ""]
    out += ["| kind | field | type | default | meaning |", "|---|---|---|---|---|"]
    for variant in schema["items"]["oneOf"]:
        props = variant["properties"]
        kind = props["kind"]["const"]
        out.append(f"| `{kind}` | | | | {meaning(props['kind'])} |")
        for key, s in props.items():
            if key in ("kind", "target", "at"):
                continue
            out.append(f"| | `{key}` | {type_of(s)} | {_default(s)} | {meaning(s)} |")
    return out


def reference() -> str:
    """The Markdown page."""
    schema = scenario_schema()
    props = schema["properties"]
    lines = [INTRO, "## The document", "", "| field | type | default | meaning |", "|---|---|---|---|"]
    sections = [k for k, s in props.items() if s.get("type") == "object" or k == "faults"]
    for key, s in props.items():
        if key not in sections:
            lines.append(f"| `{key}` | {type_of(s)} | {_default(s)} | {meaning(s)} |")
    for key in sections:
        s = props[key]
        lines += ["", f"## `{key}`", ""]
        if s.get("description"):
            lines += [meaning(s), ""]
        if key in PAGES:
            lines += [f"More: {PAGES[key]}.", ""]
        if key == "faults":
            lines += _faults(s)
            continue
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        lines += _rows(s["properties"], f"{key}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
