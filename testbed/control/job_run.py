"""A run of a scenario with a ``job`` section: the modelled job's sizes and times, made the run's.

Each NPU derives its scales from the job (:class:`testbed.train.rank_spec.RankSpec`
carries it): its proxy's FLOPs count ``compute_scale`` times (the job's FLOPs
per NPU over the proxy's), so a step computes for as long as the job's does;
each of its collectives is timed as the job's collectives it stands for
(``job_scale``, per group: the job's latency per call and bandwidth time per
byte of the proxy's); its
state at the job's bytes (``state_scale``), so snapshots take the job's time.
A checkpoint write counts each component at the job's size (the weights and
the optimizer state; the small ones as written), and a load of it as long.
Once the cluster is up the ranks report the scales they derived; the
journal's ``job`` event holds them beside the job's figures and the estimate
the run is then checked against (:mod:`testbed.report.against_estimate`).
"""

from __future__ import annotations

from typing import Any

from testbed.actors.cluster import Cluster
from testbed.control.state import RunState
from testbed.core.journal import Journal
from testbed.job import figures
from testbed.job.estimate import Estimate
from testbed.scenario.job_estimate import scenario_estimate
from testbed.scenario.model import Scenario


def _estimate_fields(e: Estimate) -> dict[str, Any]:
    """The estimate's figures the run is compared with."""
    return {
        "step_s": e.step.total_s,
        "compute_s": e.step.compute_s,
        "bubble_s": e.step.bubble_s,
        "comm_s": e.step.comm_s,
        "collectives": {
            c.name: {"seconds": c.seconds, "count": c.count, "nbytes": c.nbytes, "algo": c.algo}
            for c in e.step.collectives
        },
        "micro_batches": e.job.micro_batches,
        # only when interleaved: the journals of plain 1F1B jobs stay as they were
        **({"virtual_stages": e.job.virtual_stages} if e.job.virtual_stages > 1 else {}),
        "checkpoint_write_s": e.checkpoint_write_s,
        "mtbf_s": e.mtbf_s,
        "interval_s": e.interval_s,
        "goodput": e.goodput,
        "mfu": e.mfu,
    }


def take_over(scenario: Scenario, cluster: Cluster, journal: Journal, state: RunState) -> None:
    """Journal the job, its estimate and the scales the ranks derived; checkpoint writes and loads
    then take the job's bytes (``state.state_scale``). Nothing without a ``job`` section."""
    e = scenario_estimate(scenario)
    if e is None:
        return
    job, m = e.job, e.job.model
    modelled_scale = job.world > scenario.cluster.topology().world
    scales = cluster.call_ok("job_scales")
    proxy_bytes = sum(s["proxy_state_bytes"] for s in scales.values())
    state.job_checkpoint = dict(e.checkpoint)
    state.state_scale = sum(e.checkpoint.values()) / max(1.0, proxy_bytes)  # until a checkpoint is written
    compute = [s["compute_scale"] for s in scales.values()]
    groups = sorted({g for s in scales.values() for g in s["job_scale"]})
    names = ("latency_s_per_call", "transfer_s_per_byte", "job_bytes_per_call", "job_group")
    job_scale: dict[str, dict[str, dict[str, float]]] = {}
    for g in groups:
        rows = [s["job_scale"][g] for s in scales.values() if g in s["job_scale"]]
        job_scale[g] = {
            name: {"min": min(r[i] for r in rows), "max": max(r[i] for r in rows)}
            for i, name in enumerate(names)
        }
    journal.emit(
        "job",
        model=m.name,
        params=m.params(),
        active_params=m.active_params(),
        seq=job.seq,
        global_batch=job.global_batch,
        micro_batch=job.micro_batch,
        tokens_per_step=job.tokens_per_step,
        flops_per_npu_step=figures.flops_per_npu(job),
        checkpoint_bytes=sum(e.checkpoint.values()),
        checkpoint_components=state.job_checkpoint,
        compute_scale={"min": min(compute), "max": max(compute)},
        job_scale=job_scale,
        state_scale=state.state_scale,
        proxy_micro_batches=int(scenario.workload.options.get("micro_batches", 1)),
        # a pipelined proxy waits the job's pipeline schedule, not its own (testbed.job.pipeline)
        **({"pipeline": "job"} if scenario.workload.layout().pp > 1 else {}),
        estimate=_estimate_fields(e),
        layout=job.layout.describe(),
        npus={"run": scenario.cluster.topology().world, "job": job.world},
        # what the run's processes did for real, and what the job model gave them
        run=["training steps", "collectives' data", "failures", "restarts", "checkpoint files"],
        modelled=[
            "flops_per_npu_step",
            "checkpoint_bytes",
            "estimate",
            "virtual times of compute, collectives, checkpoints and loads",
        ]
        + (
            ["collectives at the job's group sizes", "failure rate at the job's size"]
            if modelled_scale
            else []
        ),
    )
