"""A run's ending (its cluster's and Ray's processes told to stop and waited for) beside its report.

Stopping a cluster and a private Ray instance takes a second or more of
waiting for processes to end; writing the report, the page and the plots
takes about as long and needs none of them. So the ending runs on a thread
of its own while the report is written, and the run returns only once it is
done: no process outlives the run, and a Ctrl-C meanwhile does not cut the
clean-up short.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from testbed.actors.session import sigint_ignored

#: Longest the run waits for its ending (every wait inside it has a bound of its own, far below).
ENDING_BOUND_S = 120.0


class Ending:
    """Context manager: run ``end`` (if any) on a thread from entry; wait for it on exit."""

    def __init__(self, end: Callable[[], None] | None) -> None:
        self._end = end
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        assert self._end is not None
        try:
            self._end()
        except BaseException as exc:  # handed to the waiting thread
            self._error = exc

    def __enter__(self) -> Ending:
        if self._end is not None:
            self._thread = threading.Thread(target=self._run, name="run-ending", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is None:
            return
        with sigint_ignored():  # a second Ctrl-C waits for the clean-up too
            self._thread.join(ENDING_BOUND_S)
        if self._error is not None and et is None:
            raise self._error
