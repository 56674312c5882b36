"""The journal: the run's single source of truth, as structlog JSON lines.

Every event carries the run id, a sequence number, the event name and the
wall seconds since the run began (``wall_s``); virtual times are fields named
``t`` or ``t_*``. Context bound with :meth:`Journal.bound` (structlog's
context variables) goes on every event emitted inside the block: the
controller binds the ``step`` being trained and the ``fault`` being injected,
so a recovery's events carry the step that failed. Checks read the journal only (:func:`read_journal`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, MutableMapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TextIO

import structlog
import structlog.contextvars

from testbed.core.errors import TestbedError

#: Fields that depend on the host (process ids, Ray's node ids and messages, paths; and
#: every ``wall*`` field); everything else is a function of the scenario and seed.
HOST_FIELDS = frozenset(
    {
        "pid",
        "old_pid",
        "new_pid",
        "pids",
        "spares",
        "node",
        "nodes",
        "hosts",
        "ray_error",
        "path",
        "run",
        "file",
        "text",
        # the testbed that wrote the journal: a resume must match it; not part of a run's behaviour
        "testbed_version",
    }
)


def _host_dependent(key: str) -> bool:
    return key in HOST_FIELDS or key.startswith("wall")


class Journal:
    """Append-only JSON-lines journal of one run, with an in-memory copy."""

    def __init__(
        self,
        path: Path,
        run_id: str,
        listener: Callable[[dict[str, Any]], None] | None = None,
        prior: list[dict[str, Any]] | None = None,
    ) -> None:
        """Append to ``path`` (``prior``: the events it already holds, for a run that goes on: the
        numbering continues after them)."""
        self.path = path
        self.run_id = run_id
        self.listener = listener  # told of every event as it is written (a progress display)
        self.events: list[dict[str, Any]] = list(prior or [])
        self._t0 = time.monotonic()
        self._seq = int(self.events[-1].get("seq", len(self.events))) if self.events else 0
        self._file: TextIO = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._log = structlog.wrap_logger(
            structlog.WriteLogger(self._file),
            processors=[
                structlog.contextvars.merge_contextvars,
                self._stamp,
            ],
        ).bind(run=run_id)

    def _stamp(self, _logger: Any, _name: str, event: MutableMapping[str, Any]) -> str:
        """Number and time the event, keep it as it will read back, and render its line (one JSON
        encoding for both: a step's event is kilobytes, encoded once per step on the driver)."""
        self._seq += 1
        event["seq"] = self._seq
        event["wall_s"] = round(time.monotonic() - self._t0, 6)
        line = json.dumps(event, sort_keys=True, default=str)
        self.events.append(json.loads(line))
        if self.listener is not None:
            self.listener(self.events[-1])
        return line

    def emit(self, event: str, **fields: Any) -> None:
        """Append one event (with the context bound by :meth:`bound`; a field given here wins)."""
        self._log.info(event, **fields)

    def bound(self, **context: Any) -> AbstractContextManager[Any]:
        """Bind ``context`` (``step``, ``fault``, ``rank``) to every event emitted inside the block."""
        return structlog.contextvars.bound_contextvars(**context)

    def tear(self) -> None:
        """Write the first half of an event line and no newline, as a writer killed in the middle of
        an event leaves it (for rehearsing a torn journal; nothing may be emitted after it)."""
        line = json.dumps({"event": "torn", "run": self.run_id, "seq": self._seq + 1})
        self._file.write(line[: len(line) // 2])
        self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()


def last_time(events: list[dict[str, Any]]) -> float:
    """The latest virtual time any of ``events`` carries (0 for none)."""
    return max((float(e["t"]) for e in events if isinstance(e.get("t"), (int, float))), default=0.0)


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Every event of a journal file, in order. A torn last line (what a writer killed in the middle
    of an event leaves: no newline after it) is left out; a damaged line before it is an error that
    names it."""
    lines = Path(path).read_text(encoding="utf-8", errors="replace").split("\n")
    events: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as err:
            event, why = None, err.msg
        else:
            why = "not an event (a JSON object)"
        if isinstance(event, dict):
            events.append(event)
        elif number == len(lines):  # torn: the writer died before the newline
            break
        else:
            raise TestbedError(
                f"{path}:{number}: not a journal line ({why}); the journal is damaged before its last "
                "line, so it cannot be read as a run's record"
            )
    return events


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not _host_dependent(k)}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def deterministic_view(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The journal without host-dependent fields (at any depth): equal for equal scenario and seed."""
    return [_strip(e) for e in events]
