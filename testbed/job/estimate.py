"""``testbed estimate``: the analytic picture of a job, with nothing started.

Per step: compute, the pipeline bubble and each collective; memory per NPU
and its headroom, stage by stage; the checkpoint's size and write time; the
job's mean time between failures from its size; the Young/Daly checkpoint
interval and the goodput to expect from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.job import figures
from testbed.job.figures import gib
from testbed.job.spec import Job
from testbed.topology.presets import Topology

#: Mean time between failures of one accelerator, in hours: Llama 3 405B's pre-training saw 419
#: unexpected interruptions in a 54-day snapshot on 16,384 GPUs ("The Llama 3 Herd of Models",
#: Meta 2024, section 3.3.4): 54 x 24 / 419 h for the job, times 16,384 for one GPU.
NPU_MTBF_H = 54 * 24 / 419 * 16384


def kokolis_ettr(mtbf_s: float, restart_s: float, interval_s: float, write_s: float = 0.0) -> float:
    """Expected effective training time ratio (Kokolis et al., "Revisiting Reliability in
    Large-Scale Machine Learning Research Clusters", HPCA 2025, as transcribed):
    ``(1 - (u0 + dt / 2) / M) / (1 + w / dt)``, with ``M`` the job's MTBF (``1 / (N r_f)``),
    ``u0`` the restart's cost, ``dt`` the checkpoint interval and ``w`` a checkpoint's blocking
    write. It reproduces the paper's 0.7 (hourly) and 0.93 (every 5 minutes) for 16K GPUs."""
    return (1 - (restart_s + interval_s / 2) / mtbf_s) / (1 + write_s / interval_s)


def job_mtbf_s(job: Job) -> float:
    """Seconds between failures of ``job``: one NPU's MTBF (:data:`NPU_MTBF_H`) over its NPUs."""
    return NPU_MTBF_H * 3600 / job.world


@dataclass(frozen=True)
class Estimate:
    """The analytic figures of one job."""

    job: Job
    step: figures.StepTime
    memory: tuple[figures.StageMemory, ...]
    hbm_bytes: int
    checkpoint: dict[str, int]
    checkpoint_write_s: float
    mtbf_s: float
    restart_s: float
    #: where :attr:`mtbf_s` comes from: ``job`` (its NPUs at :data:`NPU_MTBF_H`) or ``scenario``
    #: (the failure process its faults give)
    mtbf_from: str = "job"
    #: where the job's NPUs sit (:func:`testbed.job.figures.job_topology`)
    topology: Topology | None = None

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: the step's FLOPs over what the NPUs could do in its time."""
        return figures.flops_per_npu(self.job) / (self.job.npu.peak_flops * self.step.total_s)

    @property
    def interval_s(self) -> float:
        """Young/Daly: ``sqrt(2 C M)`` of checkpoint write ``C`` and MTBF ``M`` (Young 1974)."""
        return math.sqrt(2 * self.checkpoint_write_s * self.mtbf_s)

    @property
    def goodput(self) -> float:
        """Expected fraction of time training at the Young/Daly interval ``T`` (Daly 2006, first
        order): ``1 - C / T - (T / 2 + R) / M``, with ``R`` the restart's cost."""
        t = self.interval_s
        lost = self.checkpoint_write_s / t + (t / 2 + self.restart_s) / self.mtbf_s
        return max(0.0, 1.0 - lost)

    def worst_stage(self) -> figures.StageMemory:
        """The stage whose NPUs need the most memory."""
        return max(self.memory, key=lambda s: s.total)


def estimate(
    job: Job, topo: Topology, restart_s: float, sync_algo: str = "auto", mtbf_s: float | None = None
) -> Estimate:
    """The figures of ``job`` on ``topo``; ``restart_s``: what a failure costs before training resumes
    (detection, restart), not counting the recomputed steps; ``sync_algo``: the gradient sync's
    algorithm if the scenario names one; ``mtbf_s``: the failures' mean interval if the scenario
    gives its own (else the job's, from its size)."""
    ckpt = figures.checkpoint_bytes(job)
    write_s = sum(ckpt.values()) / job.npu.storage_Bps
    return Estimate(
        job=job,
        step=figures.step_time(job, topo, sync_algo),
        memory=tuple(figures.memory(job)),
        hbm_bytes=job.npu.hbm_bytes,
        checkpoint=ckpt,
        checkpoint_write_s=write_s,
        mtbf_s=job_mtbf_s(job) if mtbf_s is None else mtbf_s,
        restart_s=restart_s + write_s,  # the load reads what a write wrote
        mtbf_from="job" if mtbf_s is None else "scenario",
        topology=topo,
    )


def _failures(e: Estimate) -> str:
    own = job_mtbf_s(e.job)
    rate = f"{e.job.world} NPUs at {NPU_MTBF_H:,.0f} h each, Llama 3's rate"
    if e.mtbf_from == "job" or math.isclose(e.mtbf_s, own):
        return f"failures: MTBF {e.mtbf_s / 3600:.2f} h ({rate})"
    return (
        f"failures: MTBF {e.mtbf_s / 3600:.2f} h, as the scenario's faults give "
        f"(the job's size would give {own / 3600:.2f} h: {rate})"
    )


def _bubble_formula(j: Job) -> str:
    p, v, m = j.layout.pp, j.virtual_stages, j.micro_batches
    if v == 1:
        return f"(p-1)/m = {p - 1}/{m}"
    return f"(p-1)/(v m) = {p - 1}/({v} x {m}), interleaved"


def _placement(e: Estimate) -> list[str]:
    """Where the job's NPUs and rank 0's groups sit."""
    topo, j = e.topology, e.job
    if topo is None:
        return []
    whose = "as its cluster declares" if j.cluster else f"{topo.preset.name}'s supernodes"
    groups = "; ".join(f"{name} {n} {where}" for name, n, where in figures.group_placement(j, topo))
    noun = "supernode" if topo.supernodes == 1 else "supernodes"
    line = f"placement: {topo.supernodes} {noun} of {topo.npus_per_supernode} NPUs ({whose})"
    return [line + (f"; rank 0's groups: {groups}" if groups else "")]


def render(e: Estimate) -> str:
    """The estimate as text."""
    j, m = e.job, e.job.model
    lay = j.layout
    lines = [
        f"job: {m.name} ({m.params() / 1e9:.1f}B parameters, {m.active_params() / 1e9:.1f}B per token), "
        f"sequence {j.seq}, global batch {j.global_batch} ({j.tokens_per_step / 1e6:.2f}M tokens), "
        f"micro-batch {j.micro_batch}",
        f"layout: {lay.describe()} on {j.world} NPUs ({j.npu.name}: "
        f"{j.npu.peak_flops / 1e12:.0f} TFLOPs peak, efficiency {j.efficiency:.2f}, "
        f"HBM {gib(e.hbm_bytes)}); {j.micro_batches} micro-batches per pipeline, "
        f"recompute {j.recompute}",
        *_placement(e),
        "",
        f"step: {e.step.total_s:.3f} s (MFU {e.mfu:.1%}), nothing overlapped",
        f"  compute            {e.step.compute_s:.3f} s",
        f"  pipeline bubble    {e.step.bubble_s:.3f} s  ({_bubble_formula(j)})",
    ]
    for c in e.step.collectives:
        lines.append(
            f"  {c.name:<18} {c.seconds:.3f} s  ({c.count} x {c.nbytes / 2**20:.1f} MiB over {c.group} "
            f"ranks, {c.algo} on {c.link})"
        )
    lines += ["", "memory per NPU (weights + grads + optimizer + activations = total; headroom):"]
    for s in e.memory:
        room = e.hbm_bytes - s.total
        flag = "" if room >= 0 else "  OUT OF MEMORY"
        lines.append(
            f"  stage {s.stage} ({s.layers} layers): {gib(s.weights)} + {gib(s.grads)} + "
            f"{gib(s.optimizer)} + {gib(s.activations)} = {gib(s.total)}; {gib(room)}{flag}"
        )
    ckpt = sum(e.checkpoint.values())
    lines += [
        "",
        f"checkpoint: {gib(ckpt)} ({', '.join(f'{k} {gib(v)}' for k, v in e.checkpoint.items())}), "
        f"{e.checkpoint_write_s:.1f} s to write at {j.npu.storage_Bps / 1e9:.0f} GB/s",
        _failures(e),
        f"checkpoint every {e.interval_s / 60:.1f} min "
        f"(Young/Daly; {e.interval_s / e.step.total_s:.0f} steps), "
        f"expected goodput {e.goodput:.1%} with restart (restart and load {e.restart_s:.0f} s)",
    ]
    return "\n".join(lines)
