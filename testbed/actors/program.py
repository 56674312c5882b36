"""What an NPU process runs: the training program and the serving calls, in one object."""

from __future__ import annotations

from testbed.serve.rank import ServeRank
from testbed.train.npu import NPU


class NPUProgram(NPU, ServeRank):
    """A rank's program: it trains (:class:`~testbed.train.npu.NPU`) and it serves
    (:class:`~testbed.serve.rank.ServeRank`), whichever the controller asks of it."""
