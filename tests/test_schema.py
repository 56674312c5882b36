"""The JSON Schema agrees with the validator: every library scenario satisfies it, and typical typos
and out-of-range values break it as they break validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
