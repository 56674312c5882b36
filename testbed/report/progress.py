"""A one-line progress display for a run in a terminal: phase, step, faults, recoveries, virtual clock.

It listens to the journal's events; it is off when its stream is not a
terminal (CI logs, pipes), so nothing but the summary reaches them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class Progress:
    """Redraws one status line on ``stream`` as journal events come in."""

    stream: TextIO
    steps: int
    phase: str = "start"
    step: int = 0
    t: float = 0.0
    faults: int = 0
    failures: int = 0
    recoveries: int = 0
    shown: list[str] = field(default_factory=list)

    @classmethod
    def for_terminal(cls, stream: TextIO, steps: int) -> Progress | None:
        """A display on ``stream`` if it is a terminal, else None."""
        return cls(stream, steps) if stream.isatty() else None

    def __call__(self, event: dict[str, Any]) -> None:
        """Take one journal event."""
        name = event.get("event")
        if name == "phase_start":
            self.phase = str(event.get("phase"))
        elif name == "step_end":
            self.step, self.t = int(event["step"]), float(event["t"])
        elif name == "fault_injected" and event.get("phase") == "main":
            self.faults += 1
        elif name == "failure_detected":
            self.failures += 1
        elif name == "recovery_complete":
            self.recoveries += 1
        elif name == "run_end":
            self.stream.write("\r\033[K")
            self.stream.flush()
            return
        else:
            return
        line = (
            f"{self.phase}: step {self.step}/{self.steps}  faults {self.faults}  failures {self.failures}  "
            f"recoveries {self.recoveries}  virtual t={self.t:.6g} s"
        )
        self.stream.write("\r\033[K" + line)
        self.stream.flush()
