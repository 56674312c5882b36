"""The preemption ladder: ``notice >= scheduler grace >= launcher timeout >= step + save``.

A preemption's notice bounds everything under it; the scheduler's grace
(SIGTERM to SIGKILL) must fit in the notice, the launcher's own timeout in
the grace, and the emergency checkpoint (drain the step in flight, write
every rank's state, commit) in the launcher's timeout. A rung out of order
loses the save: the node is gone, or SIGKILL comes, before the commit. Each
violation is a warning that names both values, where each comes from, and,
for the save, the storage bandwidth at which it would fit and what the
periodic checkpoint then loses instead.

The step and the save are the job model's (``testbed estimate``): a save
writes the checkpoint's bytes at the preset's storage bandwidth.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from faults.preemption import notices
from testbed.scenario.job_estimate import scenario_estimate
from testbed.scenario.preemption_section import PreemptionPolicy

if TYPE_CHECKING:
    from testbed.scenario.model import Scenario


def preemption_warnings(scenario: Scenario) -> list[str]:
    """One warning per rung of ``policy.preemption``'s ladder that is out of order (none without the
    section; the last rung needs a ``job`` section to time the step and the save)."""
    p = scenario.policy.preemption
    if p is None:
        return []
    out: list[str] = []
    notice = f"the notice {p.notice_s:g} s (policy.preemption.notice_s)"
    grace = f"the scheduler's grace {p.grace_s:g} s (policy.preemption.grace_s, SIGTERM to SIGKILL)"
    launcher = f"the launcher's timeout {p.launcher_timeout_s:g} s (policy.preemption.launcher_timeout_s)"
    if p.grace_s > p.notice_s:
        out.append(
            f"preemption ladder: {grace} is longer than {notice}: the node is gone before SIGKILL; "
            "plan the save for the notice, or lower grace_s to it"
        )
    if p.launcher_timeout_s > p.grace_s:
        out.append(
            f"preemption ladder: {launcher} is longer than {grace}: SIGKILL comes before the launcher "
            "gives up; lower launcher_timeout_s below grace_s"
        )
    est = scenario_estimate(scenario)
    if est is None:
        return out
    limit = min(p.notice_s, p.grace_s, p.launcher_timeout_s)
    step_s, save_s = est.step.total_s, est.checkpoint_write_s
    if step_s + save_s <= limit:
        return out
    nbytes = sum(est.checkpoint.values())
    bandwidth = est.job.npu.storage_Bps
    save = (
        f"a {nbytes / 2**30:.0f} GiB save takes {save_s:.1f} s at {bandwidth / 1e9:.3g} GB/s, and the step "
        f"in flight {step_s:.2f} s to drain: {step_s + save_s:.1f} s, past the {limit:g} s it has"
    )
    if step_s < limit:
        needed = nbytes / (limit - step_s)
        fix = f"it would fit at {needed / 1e9:.3g} GB/s of storage ({needed / bandwidth:.2g}x)"
    else:
        fix = "no bandwidth makes it fit: the step alone outlasts the limit"
    every = scenario.policy.checkpoint.every
    fallback = (
        f"; without it, the periodic checkpoint every {every} step(s) loses up to "
        f"{every * step_s:.4g} s of work ({math.ceil(every / 2)} step(s) on average)"
        if every
        else "; and no periodic checkpoint is set (policy.checkpoint.every): a preemption loses the run"
    )
    out.append(f"preemption ladder: {save}; {fix}{fallback}")
    return out


def notice_problems(scenario: Scenario) -> list[tuple[tuple[str | int, ...], str]]:
    """A problem for each ``preempt`` entry at a step whose window to SIGKILL outlasts the rest of the
    run by the job's own step time: the job would end before the node is reclaimed, and the entry
    rehearse nothing. Only a scenario with a ``job`` section has a step time to judge by; a run
    without one says so in its preemption checks instead."""
    entries = notices(scenario.faults)
    est = scenario_estimate(scenario) if entries else None
    if est is None:
        return []
    policy = scenario.policy.preemption or PreemptionPolicy()
    step_s, steps = est.step.total_s, scenario.workload.steps
    out: list[tuple[tuple[str | int, ...], str]] = []
    for f in entries:
        window = policy.window(f.params)
        left = steps - int(f.at["step"]) + 1
        if window > left * step_s:
            out.append(
                (
                    ("faults", f.index),
                    f"preempt at step {f.at['step']}: its {window:g} s from SIGTERM to "
                    f"SIGKILL outlast the rest of the run ({left} step(s) of {step_s:.3g} s by the job's "
                    f"estimate, {left * step_s:.4g} s): the job ends before the node is reclaimed. Preempt "
                    f"at an earlier step, give more steps, or shorten notice_s/grace_s below "
                    f"{left * step_s:.4g} s",
                )
            )
    return out
