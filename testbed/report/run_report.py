"""What a run came to, as a program reads it: the verdict, the exit code, the report and the journal."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.core.errors import ScenarioError
from testbed.core.journal import read_journal
from testbed.report.check_result import CheckResult


@dataclass(frozen=True)
class Report:
    """One run's outcome: its verdict and exit code (see :mod:`testbed.cli`), its directory, and ``data``,
    the report as ``report.json`` holds it (checks, goodput, recoveries, the fault table, ...)."""

    verdict: str
    exit_code: int
    out_dir: Path
    data: dict[str, Any]

    @classmethod
    def read(cls, run_dir: str | Path) -> Report:
        """The report of the run written to ``run_dir`` (by ``testbed run`` or :func:`testbed.run`)."""
        path = Path(run_dir) / "report.json"
        if not path.is_file():
            raise ScenarioError(f"{path}: no report there; give the directory of a run", path=str(path))
        data = json.loads(path.read_text())
        return cls(str(data["verdict"]), int(data["exit_code"]), Path(run_dir), data)

    @property
    def passed(self) -> bool:
        """Whether every check passed."""
        return self.verdict == "pass"

    @property
    def checks(self) -> list[CheckResult]:
        """Each check's result, in the order the report lists them."""
        return [CheckResult(**c) for c in self.data.get("checks", [])]

    def check(self, name: str) -> CheckResult:
        """The result of the check ``name`` (a KeyError naming the checks there are, if it did not run)."""
        for result in self.checks:
            if result.name == name:
                return result
        raise KeyError(f"no check '{name}' in this report; it has {', '.join(c.name for c in self.checks)}")

    def events(self) -> list[dict[str, Any]]:
        """The run's journal, one dict per event (docs/journal.md)."""
        return read_journal(self.out_dir / "journal.jsonl")

    def summary(self) -> str:
        """The summary ``testbed run`` prints."""
        from testbed.report.summary import render

        return render(self.data)
