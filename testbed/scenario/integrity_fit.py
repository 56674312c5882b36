"""``policy.integrity`` against the job it watches: the detectors its layout can run, and a rollback
that has checkpoints to go back to."""

from __future__ import annotations

from testbed.scenario.model import Policy
from testbed.scenario.source import Path as YPath
from testbed.topology.layout import Layout


def integrity_problems(policy: Policy, layout: Layout, workload: str) -> list[tuple[YPath, str]]:
    """Each problem as (where in the file, what is wrong and how to fix it); none when it fits."""
    integrity = policy.integrity
    if integrity is None:
        return []
    where: YPath = ("policy", "integrity")
    problems: list[tuple[YPath, str]] = []
    if workload == "program":
        problems.append(
            (where, "the resume audit of a program runs no integrity detectors; drop policy.integrity")
        )
    if integrity.hash is not None and layout.dp < 2:
        problems.append(
            (
                (*where, "hash"),
                f"a cross-replica hash compares data-parallel replicas, and this job has dp={layout.dp}; "
                "use dp of 2 or more (3 or more to tell which replica is wrong), or drop hash",
            )
        )
    if integrity.on_detect == "rollback" and integrity.restore == "verified" and integrity.hash is None:
        problems.append(
            (
                (*where, "restore"),
                "restore: verified needs a hash to vouch for checkpoints; add hash: {every: N}, or write "
                "restore: newest to roll back to the newest checkpoint before the detected step",
            )
        )
    if integrity.replay is not None and integrity.validators is None:
        problems.append(
            (
                (*where, "replay"),
                "replay runs again a step the validators suspect, and none run; add validators: {}, "
                "or drop replay",
            )
        )
    if integrity.skip_batches and integrity.on_detect != "rollback":
        problems.append(
            (
                (*where, "skip_batches"),
                "skip_batches skips data when a detection rolls back, and on_detect is report; write "
                "on_detect: rollback, or drop skip_batches",
            )
        )
    if integrity.on_detect == "rollback" and not policy.checkpoint.every:
        problems.append(
            (
                (*where, "on_detect"),
                "on_detect: rollback needs checkpoints to roll back to; set policy.checkpoint.every, or "
                "write on_detect: report",
            )
        )
    return problems
