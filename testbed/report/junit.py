"""JUnit XML for CI pages: one test case per check, a failed check a failure, an undecided one skipped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def junit_xml(report: dict[str, Any]) -> str:
    """The report's checks as a JUnit ``testsuite`` (the run's error, if any, as an error case)."""
    checks = report.get("checks") or []
    failures = sum(1 for c in checks if c["status"] == "fail")
    skipped = sum(1 for c in checks if c["status"] == "unknown")
    errors = 1 if report.get("error") else 0
    suite = ET.Element(
        "testsuite",
        name=f"testbed.{report['scenario']}",
        tests=str(len(checks) + errors),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time=f"{float(report.get('wall_s') or 0.0):.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for key in ("seed", "verdict", "exit_code", "file"):
        ET.SubElement(props, "property", name=key, value=str(report.get(key)))
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname=f"testbed.{report['scenario']}", name=c["name"])
        if c["status"] == "fail":
            ET.SubElement(case, "failure", message=c["summary"]).text = c["summary"]
        elif c["status"] == "unknown":
            ET.SubElement(case, "skipped", message=c["summary"])
        else:
            ET.SubElement(case, "system-out").text = c["summary"]
    if errors:
        case = ET.SubElement(suite, "testcase", classname=f"testbed.{report['scenario']}", name="run")
        ET.SubElement(case, "error", message=str(report["error"])).text = str(report["error"])
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(report: dict[str, Any], path: Path) -> Path:
    """Write :func:`junit_xml` to ``path``."""
    path.write_text(junit_xml(report))
    return path
