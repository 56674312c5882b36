"""The job's pipeline, charged to a proxy that pipelines otherwise.

A proxy pipelines a few micro-batches over a few stages in plain 1F1B; the
job it stands for may pipeline dozens over more stages, interleaved. Left to
its own schedule, the proxy would idle ``(p_r - 1) / m_r`` of the compute
where the job idles ``(p - 1) / (v m)`` (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
sections 2.2.1-2.2.2). So, in a run with a job, a proxy stage's pipeline
receives do not wait for the proxy's sender in virtual time (the data still
flows, and a dead sender is still met there): each stage instead waits the
job's schedule, exactly the estimate's per step: the bubble
``(p - 1) / (v m)`` of the compute and the pipeline's sends on the critical
path, ``2 (v m + p - 1)`` of them (:func:`testbed.job.figures.step_time`).

Where in the step a stage waits follows the job's schedule for the stage it
stands for: with ``f`` and ``b`` one micro-batch's forward and backward of
one model chunk (``f + b = C / (v m)``), stage ``i`` of ``p`` waits ``i f``
for the first forward to reach it, ``(p - 1 - i) b`` for the first gradient
to come back after its warm-up forwards (``min(p - i, m)`` under 1F1B;
Megatron-LM's ``(v - 1) p + 2 (p - i - 1) + 1`` chunks interleaved), and
the rest, ``i b + (p - 1 - i) f``, in the cool-down: ``(p - 1)(f + b)`` in
all, the same on every stage. The sends are spread with the compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.job import figures
from testbed.job.spec import Job
from testbed.topology.presets import Topology


@dataclass(frozen=True)
class PipelineWaits:
    """What one pipeline stage of the job waits per step, and where in its compute."""

    #: the job's FLOPs per NPU per step (the compute the fractions below count)
    flops: float
    bubble_s: float
    sends_s: float
    #: (fraction of the step's compute done, seconds idle from then on), in order
    idle: tuple[tuple[float, float], ...]

    @property
    def total_s(self) -> float:
        """All the stage's pipeline waits in a step."""
        return self.bubble_s + self.sends_s


def forward_share(job: Job) -> float:
    """The forward pass's share of a micro-batch's compute: a third (the backward pass computes
    twice its FLOPs), a quarter with full recomputation (the forward pass runs again in it)."""
    return 0.25 if job.recompute == "full" else 1 / 3


def stage_idle(job: Job, stage: int, compute_s: float) -> tuple[tuple[float, float], ...]:
    """Where ``stage`` of the job's pipeline idles, as (fraction of its compute done, seconds): at the
    start, after its warm-up forwards, and in the cool-down (the module's formula)."""
    p, v, m = job.layout.pp, job.virtual_stages, job.micro_batches
    if p == 1 or compute_s <= 0:
        return ()
    chunk = compute_s / (v * m)
    f = chunk * forward_share(job)
    b = chunk - f
    warm = min(p - stage, m) if v == 1 else min((v - 1) * p + 2 * (p - stage - 1) + 1, v * m)
    later = p - 1 - stage
    return ((0.0, stage * f), (warm * f / compute_s, later * b), (1.0, stage * b + later * f))


def pipeline_waits(job: Job, topo: Topology, stage: int, sync_algo: str = "auto") -> PipelineWaits:
    """The job's pipeline waits per step for a rank standing for ``stage``, totalling the estimate's
    bubble and pipeline sends (rank 0's, so that every stage's pipeline lasts as long as the one
    the estimate times)."""
    st = figures.step_time(job, topo, sync_algo)
    sends = sum(c.seconds for c in st.collectives if c.name == "pp_send")
    idle = stage_idle(job, stage, st.compute_s)
    return PipelineWaits(figures.hardware_flops_per_npu(job), st.bubble_s, sends, idle)


def due_s(waits: PipelineWaits, flops_done: float, charged_s: float, end: bool = False) -> float:
    """Seconds a stage waits now, having computed ``flops_done`` of the step and waited ``charged_s``:
    the idle of its schedule up to this point and the sends in proportion to its compute; at the
    ``end`` of its pipeline, whatever is left."""
    if end:
        return max(0.0, waits.total_s - charged_s)
    done = min(1.0, flops_done / waits.flops) if waits.flops > 0 else 1.0
    idle = sum(s for at, s in waits.idle if at <= done + 1e-9)
    return max(0.0, min(waits.total_s, idle + waits.sends_s * done) - charged_s)
