"""The resume audit: your own training program, killed for real at every phase of a step.

:func:`audit_resume` runs a program (:mod:`workloads.program`) as one fresh
interpreter per data-parallel rank, averaging its gradients over the
testbed's fabric. It runs it twice uninterrupted (two runs that differ mean
the resume cannot be judged), then, for each kill point and step, SIGKILLs a
rank there, restarts every rank as a fresh process that calls the program's
own ``load`` from the newest committed checkpoint, runs on to the end, and
compares every leaf of every Stateful, step by step, with the uninterrupted
run: it passes, or names the first leaf that diverged and whether it already
differed right after the load.
"""

from testbed.audit.plan import KILL_POINTS, AuditPlan
from testbed.audit.sweep import AuditResult, audit_resume

__all__ = ["KILL_POINTS", "AuditPlan", "AuditResult", "audit_resume"]
