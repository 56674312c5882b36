"""A check: training made progress (the main phase's last loss is below its first)."""

from __future__ import annotations

from typing import Any

import testbed


def loss_fell(events: list[dict[str, Any]], expect: testbed.Expect) -> testbed.CheckResult:
    """The last loss of the main phase is lower than the first."""
    losses = [
        e["loss"]
        for e in events
        if e.get("event") == "step_end" and e.get("phase") == "main" and e.get("loss") is not None
    ]
    if len(losses) < 2:
        return testbed.CheckResult("loss_fell", "unknown", "fewer than two steps logged a loss")
    first, last = losses[0], losses[-1]
    status = "pass" if last < first else "fail"
    return testbed.CheckResult(
        "loss_fell", status, f"loss {first:.4g} -> {last:.4g}", {"first": first, "last": last}
    )
