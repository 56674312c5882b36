"""A run of a scenario with a ``job`` section: the modelled job's sizes and times, made the run's.

Each NPU charges its proxy's FLOPs times its ``compute_scale``, the job's
FLOPs per NPU over the proxy's, so a step computes for as long as the job's
does; its state is scaled likewise (``state_scale``: the job's checkpoint
bytes per NPU over the proxy's), so snapshots take the job's time; a
checkpoint write counts each component at the job's size (the weights and
the optimizer state; the small ones as written), and a load of it as long.
Once the cluster is up the ranks report the scales they derived; the
journal's ``job`` event holds them beside the job's own figures, each marked
as modelled. The collectives still move the proxy's
bytes (docs/job.md says what comes next).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.actors.cluster import Cluster
from testbed.control.state import RunState
from testbed.core.journal import Journal
from testbed.job import figures
from testbed.job.spec import Job
from testbed.scenario.model import Scenario


@dataclass(frozen=True)
class ModelledJob:
    """The figures of the scenario's job that the run takes over."""

    job: Job
    flops_per_npu: float
    #: the job's checkpoint bytes by component
    checkpoint: dict[str, int]

    @property
    def checkpoint_bytes(self) -> int:
        """The job's whole checkpoint."""
        return sum(self.checkpoint.values())

    @property
    def state_bytes_per_npu(self) -> float:
        """One NPU's share of the checkpoint."""
        return self.checkpoint_bytes / self.job.world


def modelled_job(scenario: Scenario) -> ModelledJob | None:
    """The scenario's job on its layout and NPU preset (None without a ``job`` section)."""
    if scenario.job is None:
        return None
    job = scenario.job.job(scenario.workload.layout(), scenario.cluster.topology().preset)
    flops = job.model.flops_per_token(job.seq) * job.tokens_per_step / job.world
    return ModelledJob(job, flops, figures.checkpoint_bytes(job))


def take_over(scenario: Scenario, cluster: Cluster, journal: Journal, state: RunState) -> None:
    """Journal the job and the scales the ranks derived; checkpoint writes and loads then take the
    job's bytes (``state.state_scale``). Nothing without a ``job`` section."""
    modelled = modelled_job(scenario)
    if modelled is None:
        return
    scales = cluster.call_ok("job_scales")
    proxy_bytes = sum(s["proxy_state_bytes"] for s in scales.values())
    state.state_scale = modelled.checkpoint_bytes / max(1.0, proxy_bytes)  # until a checkpoint is written
    state.job_checkpoint = dict(modelled.checkpoint)
    job, m = modelled.job, modelled.job.model
    compute = [s["compute_scale"] for s in scales.values()]
    fields: dict[str, Any] = {
        "model": m.name,
        "params": m.params(),
        "active_params": m.active_params(),
        "seq": job.seq,
        "global_batch": job.global_batch,
        "micro_batch": job.micro_batch,
        "tokens_per_step": job.tokens_per_step,
        "flops_per_npu_step": modelled.flops_per_npu,
        "compute_s_per_step": modelled.flops_per_npu / (job.npu.peak_flops * job.efficiency),
        "checkpoint_bytes": modelled.checkpoint_bytes,
        "compute_scale": {"min": min(compute), "max": max(compute)},
        "state_scale": state.state_scale,
        "checkpoint_components": state.job_checkpoint,
        "modelled": ["flops_per_npu_step", "compute_s_per_step", "checkpoint_bytes"],
    }
    journal.emit("job", **fields)
