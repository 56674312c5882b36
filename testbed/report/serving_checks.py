"""The checks of a serving run: pure functions of its journal and the scenario's ``expect``.

- ``lost_requests``: how many requests ended without their output (at most
  ``expect.lost_requests``); each one is named with its error, a KV-cache
  OOM with its request, its length and the cache's state.
- ``serving_latency``: the p99 time to first token and time per output
  token within ``expect.ttft_p99_s`` and ``expect.tpot_p99_s``.
- ``slo_attainment``: the share of requests within the SLO, at least
  ``expect.slo_attainment``.
- ``tokens_identical``: every completed output equals the undisturbed run's,
  token for token (``expect.tokens_identical``, checked unless false).
- ``colocation``: beside training, the policy the scenario names keeps the
  p99 TTFT and TPOT within the SLO; it shows what training's checkpoints and
  allreduces raise them by without the policy, and what is left with it.
- ``autoscaling``: under an autoscaling policy, the run spent fewer instance-seconds
  than every instance running throughout; it sets the run's SLO share
  beside the fleets fixed at the minimum and at the most.
"""

from __future__ import annotations

import math
from typing import Any

from testbed.report.check_result import FAIL, PASS, UNKNOWN, CheckResult, Events, judge, of
from testbed.scenario.expect import Expect


def serving_figures(events: Events) -> dict[str, Any] | None:
    """The run's figures (``serve_end``), None if it did not end."""
    end = of(events, "serve_end")
    return end[-1] if end else None


def _unknown(name: str, bound: object) -> CheckResult:
    status = UNKNOWN if bound is not None else PASS
    return CheckResult(name, status, "the serving run did not end", {"bound": bound})


def describe_failure(e: dict[str, Any]) -> str:
    """One failed request, as its error names it."""
    error = e.get("error") or {}
    text = str(error.get("error", "failed"))
    return f"{e['request']} on {e.get('instance')}: {text}"


def check_lost_requests(events: Events, expect: Expect) -> CheckResult:
    """Requests that ended without their output; fails above ``expect.lost_requests``."""
    bound = expect.lost_requests
    figures = serving_figures(events)
    if figures is None:
        return _unknown("lost_requests", bound)
    failed = [e for e in of(events, "request_end") if e.get("status") != "done"]
    run = figures["run"]
    summary = f"{run['lost']} of {run['requests']} request(s) lost"
    if failed:
        summary += "; first: " + describe_failure(failed[0])
    evidence = {"lost": run["lost"], "bound": bound, "failed": [describe_failure(e) for e in failed[:10]]}
    if bound is None:
        return CheckResult("lost_requests", PASS, summary + " (no bound set)", evidence)
    return CheckResult(
        "lost_requests", PASS if run["lost"] <= bound else FAIL, f"{summary}, bound {bound}", evidence
    )


def check_serving_latency(events: Events, expect: Expect) -> CheckResult:
    """p99 TTFT and TPOT within ``expect.ttft_p99_s`` and ``expect.tpot_p99_s``."""
    bounds = {"ttft_p99_s": expect.ttft_p99_s, "tpot_p99_s": expect.tpot_p99_s}
    figures = serving_figures(events)
    set_bounds = {k: v for k, v in bounds.items() if v is not None}
    if figures is None:
        return _unknown("serving_latency", set_bounds or None)
    run, calm = figures["run"], figures["undisturbed"]
    if not run["completed"]:
        status = UNKNOWN if set_bounds else PASS
        return CheckResult("serving_latency", status, "no request completed: no latency to judge", {})
    parts, over = [], []
    for key, bound in bounds.items():
        part = f"{key} {run[key]:.4g} s (undisturbed {calm[key]:.4g} s)"
        if bound is not None:
            part += f" bound {bound:.4g} s"
            if run[key] > bound:
                over.append(key)
        parts.append(part)
    summary = "; ".join(parts) + ("" if set_bounds else " (no bound set)")
    evidence = {**{k: run[k] for k in bounds}, "bounds": bounds, "over": over}
    return CheckResult("serving_latency", FAIL if over else PASS, summary, evidence)


def check_slo_attainment(events: Events, expect: Expect) -> CheckResult:
    """The share of requests within both TTFT and TPOT of the SLO; fails below ``expect.slo_attainment``."""
    bound = expect.slo_attainment
    figures = serving_figures(events)
    if figures is None:
        return _unknown("slo_attainment", bound)
    got, calm = figures["run"]["slo_attainment"], figures["undisturbed"]["slo_attainment"]
    summary = f"{got:.1%} of requests within the SLO (undisturbed {calm:.1%})"
    if bound is None:
        return CheckResult("slo_attainment", PASS, summary + " (no bound set)", {"attainment": got})
    status = PASS if got >= bound else FAIL
    return CheckResult(
        "slo_attainment", status, f"{summary}, bound {bound:.1%}", {"attainment": got, "bound": bound}
    )


def check_tokens_identical(events: Events, expect: Expect) -> CheckResult:
    """Every completed request's tokens equal the undisturbed run's (by digest)."""
    ends = [e for e in of(events, "request_end") if e.get("status") == "done"]
    if serving_figures(events) is None:
        return _unknown("tokens_identical", expect.tokens_identical)
    if not ends:
        return CheckResult("tokens_identical", UNKNOWN, "no request completed: no output to compare", {})
    differ = [e["request"] for e in ends if e["tokens_sha"] != e["undisturbed_sha"]]
    summary = (
        f"all {len(ends)} completed outputs equal the undisturbed run's"
        if not differ
        else f"{len(differ)} of {len(ends)} outputs differ from the undisturbed run's, first {differ[0]}"
    )
    return judge("tokens_identical", not differ, expect.tokens_identical, summary, {"differ": differ[:10]})


def check_serving_faults(events: Events, expect: Expect) -> CheckResult:
    """Every fault the scenario arms on a serving instance struck it: each kill lost its instance at
    its time, each straggler or degraded link slowed an iteration in its window, each fragmentation
    slowed or failed a pass (a fault that never struck rehearses nothing)."""
    start = of(events, "serve_start")
    armed = start[0].get("kills", {}) if start else {}
    windows = start[0].get("faults", {}) if start else {}
    if not armed and not windows:
        return CheckResult("serving_faults", PASS, "no fault armed on serving", {})
    struck = {e["instance"]: e for e in of(events, "instance_lost")}
    missed = [
        f"kill of {n} at {t:.4g} s" for n, t in sorted(armed.items()) if struck.get(n, {}).get("at_s") != t
    ]
    iterations = of(events, "serve_iteration")
    hits: list[str] = []
    for name, ws in sorted(windows.items()):
        for t0, t1, kind in ws:
            n = sum(
                e["instance"] == name and t0 <= e["start_s"] < (t1 or math.inf) and _struck(kind, e)
                for e in iterations
            )
            (hits if n else missed).append(
                f"{kind} on {name} from {t0:.4g} s" + (f": {n} iteration(s)" if n else "")
            )
    kills = [f"{n} killed at {e['at_s']:.4g} s ({e.get('point', '?')})" for n, e in sorted(struck.items())]
    summary = "; ".join([*kills, *hits]) or "nothing struck"
    if missed:
        return CheckResult("serving_faults", FAIL, f"never struck: {', '.join(missed)}", {"missed": missed})
    return CheckResult("serving_faults", PASS, f"every fault struck: {summary}", {"struck": [*kills, *hits]})


def _struck(kind: str, iteration: dict[str, Any]) -> bool:
    """The iteration shows a fault of ``kind`` acting: a fragmentation's workspace cost or failure,
    or another fault's time beyond it."""
    seen = iteration.get("interference") or {}
    if kind == "fragment":
        return bool(seen.get("workspace_s") or seen.get("workspace_failed"))
    return float(seen.get("fault_s", 0.0)) - float(seen.get("workspace_s", 0.0)) > 0.0


def colocation_text(c: dict[str, Any]) -> str:
    """What training's bursts did to serving, and what the policy left of it."""
    rise, variants = c["rise"], c["variants"]
    both, kept = variants["both"], variants["policy"]
    return (
        f"training's checkpoints raise serving's p99 TTFT by {rise['checkpoint']['ttft_p99_s']:.4g} s, its "
        f"allreduces p99 TPOT by {rise['allreduce']['tpot_p99_s'] * 1e3:.4g} ms (inter-token p99 by "
        f"{rise['allreduce']['itl_p99_s'] * 1e3:.4g} ms); with no policy {both['slo_attainment']:.1%} of "
        f"requests meet the SLO, under {c['policy']} {kept['slo_attainment']:.1%}"
    )


def check_colocation(events: Events, expect: Expect) -> CheckResult:
    """Serving beside training: the named policy keeps the run's p99 TTFT and TPOT within the SLO;
    the summary sets what the bursts did without it beside what is left with it."""
    found = of(events, "colocation")
    start = of(events, "serve_start")
    if not start or not start[0].get("colocated"):
        return CheckResult("colocation", PASS, "serving alone (no training beside it)", {})
    figures = serving_figures(events)
    if figures is None or not found:
        return CheckResult("colocation", UNKNOWN, "the co-located serving run did not end", {})
    slo, run = start[0]["slo"], figures["run"]
    over = [
        f"{k} {run[k]:.4g} s over the SLO's {slo[s]:.4g} s"
        for k, s in (("ttft_p99_s", "ttft_s"), ("tpot_p99_s", "tpot_s"))
        if run[k] > slo[s]
    ]
    c = found[-1]
    summary = colocation_text(c) + ("; " + ", ".join(over) if over else "; the run stays within the SLO")
    evidence = {"policy": c["policy"], "rise": c["rise"], "variants": c["variants"], "over": over}
    return CheckResult("colocation", FAIL if over else PASS, summary, evidence)


def autoscaling_text(e: dict[str, Any]) -> str:
    """What the autoscaled run spent and kept, beside the fixed fleets."""
    lo, hi = e["fixed"]["min"], e["fixed"]["max"]
    return (
        f"{lo['instances']} to {e['peak']} instances running ({e['starts']} start(s), {e['stops']} stop(s)): "
        f"{e['instance_s']:.4g} instance-s, {e['slo_attainment']:.1%} within the SLO; fixed at "
        f"{lo['instances']}: {lo['instance_s']:.4g} instance-s, {lo['slo_attainment']:.1%}; fixed at "
        f"{hi['instances']}: {hi['instance_s']:.4g} instance-s, {hi['slo_attainment']:.1%}"
    )


def check_autoscaling(events: Events, expect: Expect) -> CheckResult:
    """Under an autoscaling policy, the run spent fewer instance-seconds than running every instance
    throughout (or the policy bought nothing: it scaled out too eagerly or stopped too late)."""
    start = of(events, "serve_start")
    if not start or "autoscaling" not in start[0]:
        return CheckResult("autoscaling", PASS, "not autoscaled: every instance runs throughout", {})
    found = of(events, "autoscaling")
    if not found:
        return CheckResult("autoscaling", UNKNOWN, "the autoscaled serving run did not end", {})
    e = found[-1]
    spent, ceiling = e["instance_s"], e["fixed"]["max"]["instance_s"]
    text = autoscaling_text(e)
    if spent >= ceiling:
        why = (
            f"; it saved nothing: {spent:.4g} instance-s against {ceiling:.4g} with every instance running "
            "throughout (raise scale_out_at, or lower scale_in_after)"
        )
        return CheckResult("autoscaling", FAIL, text + why, {"autoscaling": e})
    return CheckResult("autoscaling", PASS, text, {"autoscaling": e})


#: the serving checks, in the order a serving run's report lists them
SERVING: tuple[tuple[str, Any], ...] = (
    ("lost_requests", check_lost_requests),
    ("serving_latency", check_serving_latency),
    ("slo_attainment", check_slo_attainment),
    ("tokens_identical", check_tokens_identical),
    ("serving_faults", check_serving_faults),
    ("colocation", check_colocation),
    ("autoscaling", check_autoscaling),
)
