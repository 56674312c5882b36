"""The journal file as a record that survives its writer: a torn last line is left out, a damaged
line before it is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.core.errors import TestbedError
from testbed.core.journal import Journal, read_journal


def _written(tmp_path: Path, n: int = 3) -> Path:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path, "r1")
    for i in range(n):
        journal.emit("step_end", phase="main", step=i + 1)
    journal.close()
    return path


def test_a_torn_last_line_is_left_out_and_every_whole_event_kept(tmp_path: Path) -> None:
    path = _written(tmp_path)
    whole = read_journal(path)
    assert [e["step"] for e in whole if e["event"] == "step_end"] == [1, 2, 3]
    line = json.dumps({"event": "step_end", "phase": "main", "step": 4})
    for cut in (1, len(line) // 2, len(line) - 1):  # a writer killed anywhere in its last event
        with open(path, "a", encoding="utf-8") as f:
            f.write(line[:cut])
        assert read_journal(path) == whole
        path.write_text("".join(json.dumps(e) + "\n" for e in whole))


def test_a_damaged_line_before_the_last_is_an_error_that_names_it(tmp_path: Path) -> None:
    path = _written(tmp_path)
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:10]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TestbedError) as err:
        read_journal(path)
    assert f"{path}:2: not a journal line" in str(err.value) and "damaged before its last line" in str(
        err.value
    )
    path.write_text('{"event": "run_start"}\n[1, 2]\n')  # JSON, but not an event
    with pytest.raises(TestbedError, match=r":2: not a journal line \(not an event"):
        read_journal(path)
