"""The pages of many runs: a suite's index (``testbed suite ... --html DIR``) and a drill's page
(``drill.html``), each linking to the page of every run it kept."""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any

from testbed.report.html_page import page, table, verdict_badge


def _link(run_dir: str | None, index_dir: Path, text: str) -> str:
    """A link from ``index_dir`` to the run's page (or its folder, when it has no page)."""
    if not run_dir:
        return escape(text)
    target = Path(run_dir) / "report.html"
    if not target.is_file():
        target = Path(run_dir)
    href = os.path.relpath(target.resolve(), index_dir.resolve())
    return f'<a href="{escape(Path(href).as_posix())}">{escape(text)}</a>'


def suite_page(rows: list[dict[str, Any]], index_dir: Path, title: str = "suite") -> str:
    """A suite's index: every scenario, what it declares and what it came to, its time, a link to its page.

    ``rows`` are as ``suite.json`` holds them."""
    wrong = [r for r in rows if not r["as_declared"]]
    verdict = "pass" if not wrong else "fail"
    cells = [
        [
            _link(r.get("run_dir"), index_dir, str(r["scenario"])),
            escape(str(r["declared"])),
            escape(str(r["got"])),
            "yes" if r["as_declared"] else f"<b>NO</b>: {escape(str(r.get('why', '')))}",
            f"{float(r['wall_s']):.1f} s",
            escape(", ".join(r.get("tags") or ())),
            f"<code>{escape(str(r['file']))}</code>",
        ]
        for r in rows
    ]
    expected = sum(1 for r in rows if str(r["declared"]).startswith("fail"))
    body = [
        f"<h1>{verdict_badge(verdict)} {escape(title)}</h1>",
        f"<p>{len(rows) - len(wrong)} of {len(rows)} scenario(s) came to what they declare; "
        f"{expected} declare a failure (they demonstrate it); {sum(float(r['wall_s']) for r in rows):.1f} s "
        "of wall time in all.</p>",
        table(["scenario", "declared", "got", "as declared", "wall", "tags", "file"], cells, "suite", (4,)),
    ]
    return page(f"{title}: {len(rows) - len(wrong)}/{len(rows)} as declared", body)


def write_suite_page(rows: list[dict[str, Any]], index_dir: Path) -> Path:
    """Write ``index.html`` into ``index_dir``; returns its path."""
    index_dir.mkdir(parents=True, exist_ok=True)
    path = index_dir / "index.html"
    path.write_text(suite_page(rows, index_dir), encoding="utf-8")
    return path


def drill_page(drill: dict[str, Any], out_dir: Path, minimal_yaml: str | None) -> str:
    """A drill's page: each schedule drawn and how it ended; for a failure, the smallest failing
    schedule as a scenario file and the command that replays it. ``drill`` is ``drill.json``'s content."""
    failed = int(drill.get("failed") or 0)
    body = [
        f"<h1>{verdict_badge('fail' if failed else 'pass')} drill, seed "
        f"{escape(str(drill.get('seed')))}</h1>",
        f"<p>{len(drill.get('examples') or [])} schedule(s) drawn; {failed} failed.</p>",
    ]
    if drill.get("minimal"):
        body += [
            "<h2>The smallest failing schedule</h2>",
            f'<p>replay: <code id="replay">{escape(str(drill.get("replay")))}</code></p>',
            f'<pre id="minimal">{escape(minimal_yaml or "")}</pre>',
        ]
    cells = []
    for e in drill.get("examples") or []:
        faults = "; ".join(f"{f.get('kind')} {f.get('target', '')} at {f.get('at', '')}" for f in e["faults"])
        problems = "; ".join(f"{k}: {v[0]}" for k, v in (e.get("problems") or {}).items())
        cells.append(
            [
                _link(e.get("run_dir"), out_dir, f"{int(e['index']):03d}"),
                escape(faults or "none"),
                escape(str(e["verdict"])),
                escape(problems),
                f"{float(e['wall_s']):.1f} s",
            ]
        )
    body += [
        "<h2>Schedules</h2>",
        table(["example", "faults", "verdict", "problems", "wall"], cells, "drill", (4,)),
    ]
    return page(f"drill seed {drill.get('seed')}: {failed} failed", body)
