"""The preemption checks, as pure functions of the journal.

A preemption cycle opens with its ``preempt_notice`` events (a real SIGTERM
each), may hold the ranks' agreement on a step (``preempt_agreed``) and an
emergency checkpoint (committed, found already committed, or abandoned past
the deadline), and closes with the ``failure_detected`` that takes the
noticed ranks out and the ``resume`` that follows. Over every cycle:

- ``preemption_commit``: under ``on_notice: save`` or ``abort``, the emergency
  checkpoint committed by the deadline; the evidence splits the time from the
  notice into drain, agreement, write and commit;
- ``preemption_same_step``: every rank agreed on one step, and the emergency
  checkpoint is of that step and holds every rank;
- ``preemption_lost_work``: the work lost is within the policy's promise
  (``save``: none; ``abort``: the step in flight; ``none``: back to the newest
  checkpoint committed before the SIGKILL);
- ``preemption_no_partial``: no checkpoint committed after a pending
  deadline, and no resume loaded an abandoned one.

They run when the journal holds a ``preempt_notice``; the first two only
when a cycle's policy promised an emergency save.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from testbed.report.check_result import FAIL, PASS, UNKNOWN, CheckResult, Events
from testbed.scenario.expect import Expect

#: the work each ``on_notice`` promises to lose at most, in steps begun and not kept
PROMISED_LOSS = {"save": 0, "abort": 1}


@dataclass
class Cycle:
    """One preemption, from its notices to the resume after it."""

    notices: list[dict[str, Any]] = field(default_factory=list)
    agreed: dict[str, Any] | None = None
    #: the emergency checkpoint's events after the agreement (committed, exists, abandoned)
    saves: list[dict[str, Any]] = field(default_factory=list)
    #: checkpoints committed while the notices were pending (before the exit)
    commits: list[dict[str, Any]] = field(default_factory=list)
    exit: dict[str, Any] | None = None
    resume: dict[str, Any] | None = None

    @property
    def on_notice(self) -> str:
        """The policy the notices were taken under."""
        return str(self.notices[0].get("on_notice", "none"))

    @property
    def deadline(self) -> float:
        """The earliest SIGKILL due."""
        return min(float(n["deadline"]) for n in self.notices)

    @property
    def t_notice(self) -> float:
        """The first SIGTERM (virtual)."""
        return min(float(n["t"]) for n in self.notices)


def cycles(events: Events) -> list[Cycle]:
    """The main phase's preemption cycles, in order (the last may be open: the run ended first)."""
    found: list[Cycle] = []
    open_: Cycle | None = None
    for e in events:
        if e.get("phase") != "main":
            continue
        kind = e.get("event")
        if kind == "preempt_notice":
            if open_ is None or open_.exit is not None:
                open_ = Cycle()
                found.append(open_)
            open_.notices.append(e)
        elif open_ is None:
            continue
        elif kind == "preempt_agreed" and open_.exit is None:
            open_.agreed = e
        elif (
            kind in ("checkpoint_committed", "checkpoint_exists", "checkpoint_unpublished")
            and open_.exit is None
        ):
            (open_.saves if open_.agreed is not None else open_.commits).append(e)
        elif kind == "failure_detected" and open_.exit is None:
            noticed = {int(n["rank"]) for n in open_.notices}
            if noticed & {int(r) for r in e.get("dead", [])}:
                open_.exit = e
        elif kind == "resume" and open_.exit is not None and open_.resume is None:
            open_.resume = e
    return found


def _committed_save(c: Cycle, events: Events) -> dict[str, Any] | None:
    """The emergency checkpoint's commit, as the journal has it (an existing one: its first commit)."""
    for s in c.saves:
        if s["event"] == "checkpoint_committed":
            return s
        if s["event"] == "checkpoint_exists":
            return next(
                (
                    e
                    for e in events
                    if e.get("event") == "checkpoint_committed" and e.get("step") == s["step"]
                ),
                None,
            )
    return None


def _outlasted(events: Events) -> str:
    """Why a cycle never reached its exit, when the run ended with its SIGKILL still to come."""
    pending = [c for c in cycles(events) if c.exit is None]
    ends = [float(e["t"]) for e in events if e.get("phase") == "main" and e.get("event") == "step_end"]
    if not pending or not ends or max(ends) >= pending[0].deadline:
        return ""
    c, end = pending[0], max(ends)
    return (
        f"; the run ended at t={end:.6g} s, before the SIGKILL due at t={c.deadline:.6g} s: the notice "
        f"outlasts the run. Give it a window under {end - c.t_notice:.3g} s (grace_s or notice_s) or "
        "preempt at an earlier step"
    )


def _promising(events: Events) -> list[Cycle]:
    return [c for c in cycles(events) if c.on_notice in PROMISED_LOSS]


def check_preemption_commit(events: Events, expect: Expect) -> CheckResult:
    """The emergency checkpoint committed by the deadline, split into drain, agreement, write, commit."""
    judged = [c for c in _promising(events) if c.exit is not None]
    if not judged:
        return CheckResult(
            "preemption_commit",
            UNKNOWN,
            "no preemption ran to its exit: nothing to judge" + _outlasted(events),
            {},
        )
    split, late = [], []
    for c in judged:
        a = c.agreed
        if a is None:
            late.append(f"the grace ran out at t={c.deadline:.3f} s before the ranks could agree on a step")
            continue
        commit = _committed_save(c, events)
        row = {
            "step": a["step"],
            "t_notice": c.t_notice,
            "deadline": c.deadline,
            "drain_s": float(a["t_drained"]) - c.t_notice,
            "agree_s": float(a["t"]) - float(a["t_drained"]),
        }
        abandoned = next((s for s in c.saves if s["event"] == "checkpoint_unpublished"), None)
        if commit is None:
            if abandoned is not None:
                over = float(abandoned["t_commit"]) - c.deadline
                late.append(
                    f"the emergency checkpoint of step {a['step']} would have committed at "
                    f"t={abandoned['t_commit']:.3f} s, {over:.3f} s past the deadline (its write takes "
                    f"{abandoned['write_s']:.3f} s); more grace, more storage bandwidth or a smaller save "
                    "would fit it"
                )
            else:
                late.append(f"no emergency checkpoint of step {a['step']} was committed")
            split.append({**row, "committed": False})
            continue
        t_commit = float(commit["t"])
        write_s = float(commit.get("write_s", 0.0))
        row |= {
            "write_s": write_s,
            "commit_s": max(0.0, t_commit - float(a["t"]) - write_s),
            "t_commit": t_commit,
        }
        split.append({**row, "committed": True})
        if t_commit > c.deadline:
            late.append(
                f"step {a['step']}'s emergency checkpoint committed at t={t_commit:.3f} s, after the deadline"
            )
    if late:
        return CheckResult("preemption_commit", FAIL, "; ".join(late), {"cycles": split})
    worst = min(c.deadline - s["t_commit"] for c, s in zip(judged, split, strict=True))
    return CheckResult(
        "preemption_commit",
        PASS,
        f"{len(judged)} emergency checkpoint(s) committed within grace (least margin {worst:.3f} s)",
        {"cycles": split},
    )


def check_preemption_same_step(events: Events, expect: Expect) -> CheckResult:
    """Every rank agreed on one step; the emergency checkpoint is of it and holds every rank."""
    judged = [c for c in _promising(events) if c.agreed is not None]
    if not judged:
        return CheckResult("preemption_same_step", UNKNOWN, "no agreement on a step was journalled", {})
    wrong = []
    for c in judged:
        a = c.agreed or {}
        steps = {int(s) for s in a["ranks"].values()}
        if len(steps) != 1 or steps != {int(a["step"])}:
            wrong.append(f"the ranks stopped at steps {sorted(steps)}, not at one step {a['step']}")
            continue
        commit = _committed_save(c, events)
        if commit is None:
            continue  # nothing committed: preemption_commit says so
        if int(commit["step"]) != int(a["step"]) or set(commit.get("ranks", {})) != set(a["ranks"]):
            wrong.append(
                f"the emergency checkpoint is of step {commit['step']} with ranks "
                f"{sorted(commit.get('ranks', {}))}, "
                f"not step {a['step']} with every rank {sorted(a['ranks'])}"
            )
    if wrong:
        return CheckResult("preemption_same_step", FAIL, "; ".join(wrong), {})
    return CheckResult(
        "preemption_same_step", PASS, f"every rank saved the one step it agreed on, {len(judged)} time(s)", {}
    )


def _newest_before(events: Events, t: float) -> int:
    commits = [
        int(e["step"])
        for e in events
        if e.get("phase") == "main" and e.get("event") == "checkpoint_committed" and float(e["t"]) <= t
    ]
    return max(commits, default=0)


def check_preemption_lost_work(events: Events, expect: Expect) -> CheckResult:
    """The steps each preemption cost are within the policy's promise."""
    judged = [c for c in cycles(events) if c.exit is not None and c.resume is not None]
    if not judged:
        return CheckResult(
            "preemption_lost_work",
            UNKNOWN,
            "no preemption ran to a resume: nothing to judge" + _outlasted(events),
            {},
        )
    rows: list[dict[str, Any]] = []
    over: list[str] = []
    for c in judged:
        fail_step, from_step = int((c.exit or {})["step"]), int((c.resume or {})["from_step"])
        begun = fail_step - 1 if c.on_notice == "save" else fail_step
        lost = begun - from_step
        bound = PROMISED_LOSS.get(c.on_notice)
        if bound is None:  # no handler: back to the newest checkpoint committed before the SIGKILL
            bound = begun - _newest_before(events, float((c.exit or {})["t_death"]))
        rows.append({"on_notice": c.on_notice, "lost_steps": lost, "bound": bound, "from_step": from_step})
        if lost > bound:
            over.append(
                f"on_notice: {c.on_notice} lost {lost} step(s) (resumed after step {from_step} of "
                f"{begun} begun), "
                f"more than its {bound}"
            )
    if over:
        return CheckResult("preemption_lost_work", FAIL, "; ".join(over), {"cycles": rows})
    lost_all = sum(r["lost_steps"] for r in rows)
    return CheckResult(
        "preemption_lost_work",
        PASS,
        f"{lost_all} step(s) lost over {len(rows)} preemption(s), within bounds",
        {"cycles": rows},
    )


def check_preemption_no_partial(events: Events, expect: Expect) -> CheckResult:
    """No checkpoint committed after a pending deadline; no resume loaded an abandoned checkpoint."""
    all_cycles = cycles(events)
    if not all_cycles:
        return CheckResult("preemption_no_partial", UNKNOWN, "no preemption notice: nothing to judge", {})
    wrong = []
    for c in all_cycles:
        for e in [*c.commits, *c.saves]:
            if e["event"] == "checkpoint_committed" and float(e["t"]) > c.deadline:
                wrong.append(
                    f"step {e['step']}'s checkpoint committed at t={e['t']:.3f} s, after the SIGKILL at "
                    f"{c.deadline:.3f} s"
                )
        abandoned = {int(s["step"]) for s in c.saves if s["event"] == "checkpoint_unpublished"}
        later = {
            int(e["step"])
            for e in events
            if e.get("event") == "checkpoint_committed" and int(e["step"]) in abandoned
        }
        if c.resume is not None and int(c.resume["from_step"]) in abandoned - later:
            wrong.append(f"the resume loaded step {c.resume['from_step']}, whose save was never published")
    if wrong:
        return CheckResult("preemption_no_partial", FAIL, "; ".join(wrong), {})
    abandoned_n = sum(1 for c in all_cycles for s in c.saves if s["event"] == "checkpoint_unpublished")
    return CheckResult(
        "preemption_no_partial",
        PASS,
        f"nothing committed past a deadline; {abandoned_n} save(s) left unpublished",
        {},
    )


#: the preemption checks, in the order a report lists them
PREEMPTION = (
    ("preemption_commit", check_preemption_commit),
    ("preemption_same_step", check_preemption_same_step),
    ("preemption_lost_work", check_preemption_lost_work),
    ("preemption_no_partial", check_preemption_no_partial),
)


def preemption_checks(events: Events) -> tuple[tuple[str, Any], ...]:
    """The preemption checks that apply: none without a notice; the commit's two only where a cycle's
    policy promised an emergency save."""
    all_cycles = cycles(events)
    if not all_cycles:
        return ()
    if any(c.on_notice in PROMISED_LOSS for c in all_cycles):
        return PREEMPTION
    return PREEMPTION[2:]
