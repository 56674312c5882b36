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

from testbed.scenario.job_estimate import scenario_estimate

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
