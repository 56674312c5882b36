"""The JSON Schema agrees with the validator: every library scenario satisfies it, and typical typos
and out-of-range values break it as they break validation."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from testbed.scenario.schema import scenario_schema
from tests.conftest import ROOT, SCENARIOS

VALIDATOR = jsonschema.Draft202012Validator(scenario_schema())


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(scenario_schema())


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_library_scenario_satisfies_the_schema(path: Path) -> None:
    errors = [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("expect:", "expekt:"),
        ("preset: atlas-900-a3", "preset: atlas-9000"),
        ("strategy: restart", "strategy: reboot"),
        ("kind: node_kill", "kind: node_kil"),
        ("connect_s: 120", "connect_s: 60"),
        ("npus_per_supernode: 4", "npus_per_supernod: 4"),
        ("version: 1", "version: 2"),
    ],
)
def test_what_validation_refuses_the_schema_refuses_too(old: str, new: str) -> None:
    text = (SCENARIOS / "quickstart.yaml").read_text().replace(old, new)
    assert list(VALIDATOR.iter_errors(yaml.safe_load(text)))


def test_testbed_schema_prints_it() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "schema"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0 and json.loads(proc.stdout) == scenario_schema()


def test_the_schema_takes_durations_with_units_and_refuses_a_bad_one() -> None:
    doc = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    doc["policy"]["timeouts"] = {"connect_s": "2m", "exec_s": "30m"}
    doc["safeguards"] = {"wall_s": "10m", "blast_radius_percent": 100}
    assert [e.message for e in VALIDATOR.iter_errors(doc)] == []
    doc["policy"]["timeouts"]["exec_s"] = "half an hour"
    assert list(VALIDATOR.iter_errors(doc))


def _properties(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every (dotted path, schema) of a property anywhere in ``node``."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        for key, sub in (node.get("properties") or {}).items():
            found.append((f"{path}.{key}".lstrip("."), sub))
            found += _properties(sub, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                found += _properties(node[key], f"{path}[]")
        for key in ("oneOf", "anyOf", "allOf"):
            for sub in node.get(key, []):
                found += _properties(sub, path)
    return found


def test_every_field_of_the_schema_has_a_type_and_a_description() -> None:
    typed = ("type", "oneOf", "anyOf", "enum", "const")
    found = _properties(scenario_schema())
    bare = [p for p, s in found if not s.get("description") or not any(k in s for k in typed)]
    assert bare == []


def test_every_field_of_the_schema_is_in_a_doc_page() -> None:
    # the pages that explain them, not the reference page written from the schema itself
    docs = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "scenario.md")
    names = {p.rsplit(".", 1)[-1].removesuffix("[]") for p, _ in _properties(scenario_schema())}
    pattern = r"`[^`\n]*\b{0}\b[^`\n]*`|\b{0}:"
    missing = sorted(n for n in names if not re.search(pattern.format(re.escape(n)), docs, re.M))
    assert missing == [], f"fields in no page of docs/: {missing}"


def test_the_reference_page_is_the_one_the_schema_writes() -> None:
    from testbed.scenario.reference import reference

    page = (ROOT / "docs" / "scenario.md").read_text()
    assert page == reference(), "regenerate it: python -m testbed.scenario.reference > docs/scenario.md"
