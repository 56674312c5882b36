"""The serving part of a run's report, from its journal: throughput, latency percentiles beside the
undisturbed run's, the KV cache's occupancy over virtual time, and each instance lost with the
latency spike it caused and how long it lasted."""

from __future__ import annotations

from typing import Any

from testbed.report.check_result import Events, of
from testbed.report.serving_checks import autoscaling_text, colocation_text, describe_failure, serving_figures

#: Where a serving instance's process was SIGKILLed: in an iteration (by what it did), or between calls.
_STRUCK = {
    "decode": "mid-decode",
    "prefill": "mid-prefill",
    "prefill+decode": "mid-iteration (prefill and decode)",
    "idle": "while idle",
}
#: the most points of the occupancy series a report keeps (evenly thinned)
SERIES_POINTS = 240


def _occupancy(events: Events) -> dict[str, Any]:
    its = of(events, "serve_iteration")
    series = [(e["start_s"] + e["duration_s"], e["instance"], e["kv"]["occupancy"]) for e in its]
    step = max(1, len(series) // SERIES_POINTS)
    return {
        "peak": max((o for _, _, o in series), default=0.0),
        "mean": sum(o for _, _, o in series) / len(series) if series else 0.0,
        "iterations": len(series),
        "series": [{"t": t, "instance": i, "occupancy": o} for t, i, o in series[::step]],
    }


def loss_effects(events: Events, tpot_s: float) -> list[dict[str, Any]]:
    """Each instance lost: when, how many requests it moved, the largest delay a request saw against
    the undisturbed run (the spike), and how long requests kept finishing late: from the loss to the
    last request, on any instance, that finished later than undisturbed by more than the SLO's TPOT
    (an instance lost for good leaves the others more load, so this can run to the end of the
    stream)."""
    ends = of(events, "request_end")
    out = []
    for lost in of(events, "instance_lost"):
        at = lost["at_s"]
        delays = [
            (e["finish_s"] - e["undisturbed_finish_s"], e["finish_s"])
            for e in ends
            if e.get("finish_s") is not None
            and e.get("undisturbed_finish_s") is not None
            and e["finish_s"] > at
        ]
        late = [finish for delay, finish in delays if delay > tpot_s]
        out.append(
            {
                "instance": lost["instance"],
                "at_s": at,
                "detected_s": lost["detected_s"],
                "requests_moved": lost["requests"],
                "pid": lost.get("pid"),
                "struck": lost.get("point"),
                **({"rank": lost.get("rank"), "peers": lost["peers"]} if lost.get("peers") else {}),
                "spike_s": max((d for d, _ in delays), default=0.0),
                "lasted_s": (max(late) - at) if late else 0.0,
            }
        )
    return out


def serving_report(events: Events) -> dict[str, Any] | None:
    """The serving figures of a run (None if it served nothing)."""
    start = of(events, "serve_start")
    if not start:
        return None
    figures = serving_figures(events)
    failed = [e for e in of(events, "request_end") if e.get("status") != "done"]
    return {
        "instances": start[0]["instances"],
        "policy": start[0]["policy"],
        "slo": start[0]["slo"],
        "kv_blocks": start[0]["kv_blocks"],
        "figures": figures and {"run": figures["run"], "undisturbed": figures["undisturbed"]},
        "kv": _occupancy(events),
        "memory": _memory(events),
        "losses": loss_effects(events, start[0]["slo"]["tpot_s"]),
        "failed": [describe_failure(e) for e in failed[:10]],
        "colocation": next(iter(of(events, "colocation")[-1:]), None),
        "autoscaling": next(iter(of(events, "autoscaling")[-1:]), None),
        "disaggregation": next(iter(of(events, "disaggregation")[-1:]), None),
    }


def render(s: dict[str, Any]) -> list[str]:
    """The serving lines of the summary."""
    f = s.get("figures")
    lines = [
        f"serving: {len(s['instances'])} instance(s), batch up to {s['policy']['max_batch']}, KV cache "
        f"{s['kv_blocks']} blocks each (cap {s['policy']['kv_cap']:.0%}, "
        f"preemption {s['policy']['preemption']}); "
        f"SLO TTFT {s['slo']['ttft_s']:.4g} s, TPOT {s['slo']['tpot_s'] * 1e3:.4g} ms"
    ]
    if f:
        run, calm = f["run"], f["undisturbed"]
        lines += [
            f"  requests: {run['completed']}/{run['requests']} done, {run['lost']} lost, "
            + (f"{run['rejected']} rejected at admission, " if run.get("rejected") else "")
            + f"{run['preemptions']} preemption(s), {run['moved']} moved; {run['tokens_per_s']:.4g} tokens/s "
            f"(undisturbed {calm['tokens_per_s']:.4g})",
            f"  TTFT p50 {run['ttft_p50_s']:.4g} s, p99 {run['ttft_p99_s']:.4g} s (undisturbed "
            f"{calm['ttft_p99_s']:.4g} s); TPOT p50 {run['tpot_p50_s'] * 1e3:.4g} ms, p99 "
            f"{run['tpot_p99_s'] * 1e3:.4g} ms (undisturbed {calm['tpot_p99_s'] * 1e3:.4g} ms)",
            f"  within the SLO: {run['slo_attainment']:.1%} (undisturbed {calm['slo_attainment']:.1%})",
        ]
    kv = s["kv"]
    lines.append(
        f"  KV cache occupancy: peak {kv['peak']:.0%}, mean {kv['mean']:.0%} "
        f"over {kv['iterations']} iterations"
    )
    m = s.get("memory")
    if m:
        lines.append(
            f"  activation memory: {int(m['passes'])} pass(es) found no block for their workspace: "
            f"{m['borrowed_bytes'] / 1e9:.3g} GB borrowed from the pool, {m['compacted_bytes'] / 1e9:.3g} GB "
            f"compacted, {m['workspace_s'] * 1e3:.4g} ms in all; {int(m['workspace_failed'])} request(s) "
            "failed"
        )
    for loss in s["losses"]:
        lines.append(
            f"  {loss['instance']} lost at {loss['at_s']:.4g} s{_killed(loss)}, noticed at "
            f"{loss['detected_s']:.4g} s: {loss['requests_moved']} request(s) moved; latency spike "
            f"{loss['spike_s']:.4g} s; requests finished late for {loss['lasted_s']:.4g} s after it"
        )
    if s.get("colocation"):
        lines.append(f"  beside training: {colocation_text(s['colocation'])}")
    if s.get("disaggregation"):
        lines.append(f"  disaggregated: {_split_text(s['disaggregation'])}")
    if s.get("autoscaling"):
        lines.append(f"  autoscaling: {autoscaling_text(s['autoscaling'])}")
    lines.extend(f"  lost: {x}" for x in s["failed"][:3])
    return lines


def _killed(loss: dict[str, Any]) -> str:
    """`` (pid P, rank R of its group, SIGKILLed mid-decode; rank Q: PeerLost)``: how each other
    rank's call ended (its collective met the death)."""
    if not loss.get("pid"):
        return ""
    peers = loss.get("peers") or {}
    where = f", rank {loss['rank']} of its group," if peers else ""
    broke = "".join(f"; rank {r}: {how}" for r, how in peers.items())
    return f" (pid {loss['pid']}{where} SIGKILLed {_STRUCK.get(loss['struck'], loss['struck'])}{broke})"


def _split_text(d: dict[str, Any]) -> str:
    """The pools, the KV transfers, and the tails disaggregated against every instance doing both."""
    split, mixed = d["disaggregated"], d["mixed"]
    return (
        f"{len(d['prefill'])} prefill + {len(d['decode'])} decode instance(s); {d['transfers']} KV "
        f"transfer(s), {d['bytes'] / 1e9:.3g} GB per NPU, mean {d['transfer_mean_s'] * 1e3:.3g} ms (max "
        f"{d['transfer_max_s'] * 1e3:.3g} ms); undisturbed, p99 TPOT {split['tpot_p99_s'] * 1e3:.4g} ms and "
        f"TTFT {split['ttft_p99_s']:.4g} s against {mixed['tpot_p99_s'] * 1e3:.4g} ms and "
        f"{mixed['ttft_p99_s']:.4g} s with every instance doing both"
    )


def _memory(events: Events) -> dict[str, float] | None:
    """What the passes' workspaces cost in activation memory (None: nothing)."""
    keys = ("borrowed_bytes", "compacted_bytes", "workspace_s", "workspace_failed")
    hit = [
        e["interference"]
        for e in of(events, "serve_iteration")
        if any(k in (e.get("interference") or {}) for k in keys)
    ]
    if not hit:
        return None
    return {"passes": float(len(hit)), **{k: float(sum(h.get(k, 0.0) for h in hit)) for k in keys}}
