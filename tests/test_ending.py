"""A run's ending (its processes' stop) runs beside its report, and the run waits for it."""

from __future__ import annotations

import threading

import pytest

from testbed.control.ending import Ending


def test_the_ending_runs_while_the_report_is_written_and_is_done_when_the_run_returns() -> None:
    report_started, ended = threading.Event(), threading.Event()

    def end() -> None:
        assert report_started.wait(10), "the ending did not run beside the report"
        ended.set()

    with Ending(end):
        report_started.set()  # the report is being written: the ending goes on meanwhile
    assert ended.is_set()


def test_an_ending_that_fails_says_so_once_the_report_is_written() -> None:
    def end() -> None:
        raise RuntimeError("a process would not end")

    written = []
    with pytest.raises(RuntimeError, match="would not end"), Ending(end):
        written.append("report")
    assert written == ["report"]


def test_the_reports_own_error_is_not_hidden_by_the_endings() -> None:
    def end() -> None:
        raise RuntimeError("ending")

    with pytest.raises(ValueError, match="report"), Ending(end):
        raise ValueError("report")


def test_no_ending_is_nothing_to_wait_for() -> None:
    with Ending(None) as ending:
        assert ending is not None
