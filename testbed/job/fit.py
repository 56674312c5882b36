"""Whether a job fits its NPUs' memory, stage by stage, and if not, what to change.

The seeds' most common out-of-memory is a badly balanced pipeline split: one
stage holds more layers (or the embedding and the most micro-batches in
flight) than its NPUs' HBM takes. Each stage that does not fit is named with
the bytes it needs, part by part, the bytes an NPU has, and a fix.
"""

from __future__ import annotations

import dataclasses

from testbed.job import figures
from testbed.job.figures import gib
from testbed.job.spec import Job


def job_memory_problems(job: Job) -> list[str]:
    """One message per pipeline stage whose NPUs need more memory than they have (none: it fits)."""
    hbm = job.npu.hbm_bytes
    over = [s for s in figures.memory(job) if s.total > hbm]
    if not over:
        return []
    even = dataclasses.replace(job, stages=())
    if job.stages and all(s.total <= hbm for s in figures.memory(even)):
        fix = f"split the layers as evenly as they go, stages: {list(even.stage_layers())}, which fits"
    elif job.recompute != "full":
        fix = "recompute: full, or more tensor or pipeline parallelism"
    else:
        fix = "more tensor or pipeline parallelism, or a distributed optimizer"
    return [
        f"out of memory: pipeline stage {s.stage} ({s.layers} layers) needs {gib(s.total)} per NPU "
        f"(weights {gib(s.weights)}, gradients {gib(s.grads)}, optimizer {gib(s.optimizer)}, "
        f"activations {gib(s.activations)}) and an NPU of {job.npu.name} has {gib(hbm)}; {fix}"
        for s in over
    ]
