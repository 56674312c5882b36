"""What a resume audit costs, and where the time goes: ``python -m testbed.experiments.audit_bench``.

Runs the audit of the PyTorch control (every kill point, one step) on
``--ranks`` ranks twice side by side, its rank processes forked from the
zygote and each a fresh interpreter, and prints per mode: the whole audit,
one kill point (its killed and its resumed stretch), the uninterrupted run,
and what starting the processes cost (the zygote's import once, or each fresh
interpreter's import of numpy and PyTorch). Times are wall seconds on this
machine; compare the two modes within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from testbed.audit import AuditPlan, audit_resume

CONTROL = "workloads.programs.control_torch"


def measure(ranks: int, start: str, entry: str = CONTROL) -> dict[str, Any]:
    """One audit of ``entry`` in start mode ``start``: its figures."""
    plan = AuditPlan(entry=f"{entry}:make", ranks=ranks, start=start)
    with tempfile.TemporaryDirectory() as tmp:
        result = audit_resume(plan, Path(tmp))
    if result.exit_code != 0:
        raise SystemExit(f"the control did not pass ({start}): {result.problem}")
    per_case = [c.wall_s for c in result.cases]
    return {
        "start": start,
        "ranks": ranks,
        "cases": len(per_case),
        "audit_s": round(result.wall_s, 2),
        "kill_point_s": round(statistics.mean(per_case), 3),
        "reference_s": round(float(result.costs["reference_s"]), 3),
        "processes": result.costs["processes"],
        "zygote_import_s": result.costs["zygote_s"],
        "import_s_per_process": result.costs["import_s_mean"],
    }


def main(argv: list[str] | None = None) -> int:
    """Measure both start modes; print a table; write JSON with ``--out``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    rows = [measure(args.ranks, start) for start in ("zygote", "fresh")]
    head = list(rows[0])
    print(" | ".join(head))
    for row in rows:
        print(" | ".join(str(row[k]) for k in head))
    print(f"fresh / zygote, whole audit: {rows[1]['audit_s'] / rows[0]['audit_s']:.1f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
