"""``report.html``: one run as a page that needs nothing but itself.

Built from the run's report (``report.json``) and journal, as ``testbed report
RUN_DIR --html`` builds it again. It holds the verdict and every check with its
evidence, the timeline (one lane per rank, every fault's window from injection
to heal; see :mod:`testbed.report.html_timeline`), the faults and what each
did, each recovery cut into its parts, goodput, the hotspot diagnosis and
memory by step; a serving run adds its figures.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from testbed.report.fault_rows import BREAKDOWN_ORDER, recovered_how
from testbed.report.html_charts import (
    BREAKDOWN_COLOURS,
    GOODPUT_PARTS,
    goodput_bar,
    memory_chart,
    recovery_bar,
)
from testbed.report.html_page import as_json, page, seconds, table, verdict_badge
from testbed.report.html_timeline import legend, timeline_svg
from testbed.report.netem_counts import render as render_netem

Events = list[dict[str, Any]]


def _header(report: dict[str, Any]) -> list[str]:
    steps = report.get("steps") or {}
    facts = [
        ("scenario", escape(str(report.get("scenario")))),
        ("seed", escape(str(report.get("seed")))),
        ("exit code", escape(str(report.get("exit_code")))),
        ("plan", f"<code>{escape(str(report.get('plan_sha256') or '')[:12])}</code>"),
        (
            "steps",
            f"{steps.get('completed')}/{steps.get('planned')} ({steps.get('run')} run)" if steps else "",
        ),
        ("virtual time", seconds(report.get("virtual_time_s"))),
        ("wall time", seconds(report.get("wall_s"))),
        ("layout", escape(str(report.get("layout") or ""))),
    ]
    out = [
        f"<h1>{verdict_badge(str(report['verdict']))} {escape(str(report.get('scenario')))}</h1>",
        "<p>" + " &middot; ".join(f"{k}: {v}" for k, v in facts if v) + "</p>",
    ]
    if report.get("error"):
        out.append(f'<p class="error"><b>error:</b> {escape(str(report["error"]))}</p>')
    declared = report.get("declared") or {}
    if declared and declared.get("verdict") != "pass":
        how = "as declared" if declared.get("as_declared") else f"NOT as declared: {declared.get('why')}"
        out.append(f"<p>declared: {escape(str(declared.get('verdict')))} ({escape(how)})</p>")
    replay = report.get("replay") or f"testbed run {report.get('file')} --seed {report.get('seed')}"
    out.append(f'<p>replay: <code id="replay">{escape(str(replay))}</code></p>')
    out.extend(f'<p class="muted">warning: {escape(str(w))}</p>' for w in report.get("warnings") or [])
    return out


def _checks(report: dict[str, Any]) -> list[str]:
    rows = []
    for c in report.get("checks") or []:
        evidence = f"<details><summary>evidence</summary><pre>{as_json(c.get('evidence'))}</pre></details>"
        rows.append((c, evidence))
    body = "".join(
        f'<tr class="status-{escape(c["status"])}" data-name="{escape(c["name"])}" '
        f'data-status="{escape(c["status"])}"><td>{escape(c["name"])}</td>'
        f"<td>{escape(c['status'].upper())}</td><td>{escape(str(c['summary']))}{ev}</td></tr>"
        for c, ev in rows
    )
    return [
        "<h2>Checks</h2>",
        '<table id="checks"><thead><tr><th>check</th><th>status</th><th>what it found</th></tr></thead>'
        f"<tbody>{body}</tbody></table>",
    ]


def _timeline(events: Events) -> list[str]:
    svg = timeline_svg(events)
    if not svg:
        return []
    keys = "".join(f'<span><i style="background:{c}"></i>{escape(n)}</span>' for n, c in legend(events))
    return [
        "<h2>Timeline (virtual clock)</h2>",
        '<p class="muted">One lane per rank: each step as it ran, its collectives in their place and '
        "compute between them (or, when the journal does not keep them, by part, one after another from "
        "the rank's start). Shaded across the lanes: time outside training (recovery, failed attempts, "
        "checkpoint holds) and each fault's window from injection to heal, labelled in its row above. "
        "Dashed lines: red, a failure detected; green, training resumed.</p>",
        f'<div class="legend">{keys}</div>',
        '<div id="zoom" style="display:none"><button data-zoom="0.5">zoom in</button>'
        '<button data-zoom="2">zoom out</button><button data-zoom="0">reset</button>'
        '<span class="muted" id="zoom-range"></span> <span class="muted">(wheel to zoom, drag to pan, '
        "double-click to reset)</span></div>",
        svg,
    ]


def _faults(report: dict[str, Any]) -> list[str]:
    rows = report.get("fault_table") or []
    if not rows:
        return ["<h2>Faults</h2><p>No fault fired in training.</p>"]
    cells = [
        [escape(str(r.get(k, ""))) for k in ("when", "what", "target", "effect", "detected", "recovered")]
        for r in rows
    ]
    netem = [f'<p class="netem">{escape(line)}</p>' for line in render_netem(report.get("netem") or [])]
    return [
        "<h2>Faults</h2>",
        table(["when", "what", "target", "effect", "detected", "recovered"], cells, "faults"),
        *netem,
    ]


def _recoveries(report: dict[str, Any]) -> list[str]:
    recoveries = [r for r in report.get("recoveries") or [] if r.get("phase", "main") == "main"]
    if not recoveries:
        return []
    keys = [k for k in BREAKDOWN_ORDER if any(k in (r.get("breakdown") or {}) for r in recoveries)]
    head = ["step", "how", "detected by"] + [k[:-2] for k in keys] + ["total", "parts"]
    rows = [
        [str(r.get("fail_step")), escape(recovered_how(r)), escape(str(r.get("detected_by")))]
        + [seconds((r.get("breakdown") or {}).get(k)) for k in keys]
        + [seconds(r.get("total_s")), recovery_bar(r)]
        for r in recoveries
    ]
    keyed = "".join(f'<span><i style="background:{BREAKDOWN_COLOURS[k]}"></i>{k[:-2]}</span>' for k in keys)
    numeric = range(3, 4 + len(keys))
    return [
        "<h2>Recovery breakdown (virtual seconds)</h2>",
        table(head, rows, "recoveries", numeric),
        f'<div class="legend">{keyed}</div>',
    ]


def _goodput(report: dict[str, Any]) -> list[str]:
    g = report.get("goodput") or {}
    if not g or not g.get("total_s"):
        return []
    rows = [
        [f'<i style="display:inline-block;width:10px;height:10px;background:{colour}"></i> {name}',
         seconds(g.get(key)), f"{float(g.get(key) or 0) / float(g['total_s']):.1%}"]
        for key, (name, colour) in GOODPUT_PARTS.items() if g.get(key)
    ]  # fmt: skip
    return [
        f"<h2>Goodput: {float(g.get('goodput') or 0):.1%}</h2>",
        f"<p>{float(g.get('useful_s') or 0):.4g} s of {float(g['total_s']):.4g} s virtual time trained; "
        f"{g.get('steps_kept')} step(s) kept of {g.get('steps_run')} run.</p>",
        goodput_bar(g),
        table(["where the time went", "virtual", "share"], rows, "goodput", (1, 2)),
    ]


def _hotspot(report: dict[str, Any]) -> list[str]:
    hot = report.get("hotspot") or {}
    if not hot:
        return []
    out = ["<h2>Hotspot</h2>", f"<p>{escape(str(hot.get('message', '')))}</p>"]
    rows = [["rank " + escape(str(r)), f"{float(x):.3g}x"] for r, x in (hot.get("slow_ranks") or {}).items()]
    rows += [["link " + escape(str(k)), f"{float(x):.3g}x"] for k, x in (hot.get("slow_links") or {}).items()]
    if rows:
        out.append(table(["slow", "slower than typical"], rows, "hotspot", (1,)))
    return out


def _memory(report: dict[str, Any]) -> list[str]:
    trend = report.get("memory_trend") or []
    if not trend:
        return []
    peak = max(trend, key=lambda m: m["fragmentation"])
    return [
        "<h2>Memory by step</h2>",
        f"<p>Red: fragmentation (1 - largest free block / free), the most of any rank; blue: reserved bytes. "
        f"Peak fragmentation {peak['fragmentation']:.3f} at step {peak['step']}.</p>",
        memory_chart(trend),
    ]


def _serving(report: dict[str, Any]) -> list[str]:
    serving = report.get("serving") or {}
    run = serving.get("run") if isinstance(serving, dict) else None
    if not isinstance(run, dict):
        return []
    rows = [
        [escape(k), escape(f"{v:.4g}" if isinstance(v, float) else str(v))] for k, v in sorted(run.items())
    ]
    return ["<h2>Serving</h2>", table(["figure", "this run"], rows, "serving", (1,))]


def render(report: dict[str, Any], events: Events) -> str:
    """The page of one run (see the module)."""
    body = _header(report) + _checks(report) + _timeline(events) + _faults(report) + _recoveries(report)
    body += _goodput(report) + _hotspot(report) + _memory(report) + _serving(report)
    body.append(
        f'<p class="muted">journal: <code>{escape(str(report.get("journal")))}</code> &middot; '
        "the same figures as report.json; rebuild with <code>testbed report RUN_DIR --html</code></p>"
    )
    title = f"{report.get('scenario')} (seed {report.get('seed')}): {str(report['verdict']).upper()}"
    return page(title, body)


def write_html(report: dict[str, Any], events: Events, path: Path) -> Path:
    """Write the run's page to ``path``; returns it."""
    path.write_text(render(report, events), encoding="utf-8")
    return path
