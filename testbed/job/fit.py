"""Whether a job fits its NPUs' memory, stage by stage, and if not, what to change.

The most common out-of-memory of Ascend training reports is a badly balanced pipeline split: one
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
    plain = dataclasses.replace(job, virtual_stages=1)
    if job.stages and all(s.total <= hbm for s in figures.memory(even)):
        fix = f"split the layers as evenly as they go, stages: {list(even.stage_layers())}, which fits"
    elif job.virtual_stages > 1 and all(s.total <= hbm for s in figures.memory(plain)):
        fix = "virtual_stages: 1 (interleaving keeps more activations in flight), which fits"
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


def virtual_stages_problem(job: Job) -> str:
    """Why ``job``'s interleaving cannot be laid out ("" if it can): it needs a pipeline, and a layer
    for each chunk of every stage."""
    v, fewest = job.virtual_stages, min(job.stage_layers())
    if v == 1:
        return ""
    if job.layout.pp == 1:
        return f"{v} model chunks per pipeline rank need a pipeline; give pp > 1 or virtual_stages: 1"
    if v > fewest:
        return (
            f"{v} model chunks per pipeline rank, but a stage of {fewest} layers cannot give each chunk a "
            f"layer; give at most {fewest}"
        )
    m, p = job.micro_batches, job.layout.pp
    if m % p:  # Megatron-LM refuses it too: the (p-1)/(v m) bubble needs whole rounds of p
        return (
            f"{v} model chunks per pipeline rank need micro-batches in whole rounds of pp {p}, and each "
            f"pipeline runs {m}; make global_batch / (micro_batch x dp x ep) a multiple of {p}, or give "
            "virtual_stages: 1"
        )
    return ""


def cluster_problem(job: Job) -> str:
    """Why ``job``'s declared cluster cannot hold it ("" if it can, or if it declares none)."""
    if not job.cluster:
        return ""
    supernodes, per = job.cluster
    most = job.npu.max_npus_per_supernode
    if per > most:
        return (
            f"a supernode of {per} NPUs, but one of {job.npu.name} holds at most {most}; give "
            f"npus_per_supernode: {most} or fewer"
        )
    if supernodes * per < job.world:
        return (
            f"{supernodes} supernodes of {per} NPUs hold {supernodes * per}, and the job runs on "
            f"{job.world}; "
            f"give supernodes: {-(-job.world // per)} or more, or leave cluster out (the preset's supernodes)"
        )
    return ""
