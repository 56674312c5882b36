"""What a check returns, and the small helpers every check shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Events = list[dict[str, Any]]
PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check."""

    name: str
    status: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "status": self.status, "summary": self.summary, "evidence": self.evidence}


def of(events: Events, name: str, phase: str | None = None) -> Events:
    return [e for e in events if e.get("event") == name and (phase is None or e.get("phase") == phase)]


def judge(
    name: str, observed: bool, expected: bool | None, summary: str, evidence: dict[str, Any]
) -> CheckResult:
    want = True if expected is None else expected
    status = PASS if observed == want else FAIL
    if expected is False:
        summary += f" (expected {name}: false)"
    return CheckResult(name, status, summary, {**evidence, "observed": observed, "expected": want})
