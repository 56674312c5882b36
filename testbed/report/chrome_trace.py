"""The run's virtual timeline as a Chrome/Perfetto trace: a pure function of the journal.

The output follows the Trace Event Format
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU): a JSON object
with ``traceEvents``, ``displayTimeUnit`` and ``otherData``; ``X`` (complete) events with ``ts``
and ``dur`` in microseconds, ``i`` (instant) events and ``M`` (metadata) events naming processes
and threads. The clock is the run's virtual clock of its main phase (virtual seconds x 1e6).

Three processes (see docs/trace.md):

- ``ranks`` (pid 1), a thread per rank: each step's span holding its data wait, its collectives
  (``bytes``, ``algorithm``, ``group`` in their args), its pipeline receives (``bubble``) and the
  compute between them; the spans that are not training (a recovery and its parts, a failed
  attempt, a checkpoint write, a link setup); faults and failures as instant events.
- ``links`` (pid 2), a thread per directed link that carried bytes: its busy time in each step.
- ``faults`` (pid 3): a thread for checkpoint writes, then one per fault, with its window (from
  injection to heal) when it has one.

Spans on one thread nest: a span that would overlap another only in part is cut where the other
ends (its args then say by how much: ``cut_us``).
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

from testbed.report.timeline_plot import recovery_spans

Events = list[dict[str, Any]]

RANKS_PID, LINKS_PID, FAULTS_PID = 1, 2, 3
#: the thread of the ``faults`` process that holds the checkpoint writes (each fault has its own after)
CHECKPOINT_TID = 0
#: where a step's span ranks among equal spans: job-wide spans before it, its own parts after
STEP_ORDER = 4


def _ns(t: float) -> int:
    """Virtual seconds as whole nanoseconds: every comparison is exact, so equal times stay equal."""
    return round(float(t) * 1e9)


def _us(ns: int) -> float:
    """Nanoseconds as the trace's microseconds."""
    return ns / 1000


class _Track:
    """The spans and instants of one (pid, tid)."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int, int, str, str, dict[str, Any]]] = []
        self.instants: list[dict[str, Any]] = []

    def span(
        self, name: str, cat: str, start: float, end: float, args: dict[str, Any], rank: int = 5
    ) -> None:
        """A span from ``start`` to ``end`` (virtual seconds); ``rank`` orders equal spans (outer first)."""
        if end >= start:
            self.spans.append((_ns(start), _ns(end), rank, name, cat, args))

    def instant(self, name: str, cat: str, t: float, args: dict[str, Any]) -> None:
        """A mark at ``t`` (virtual seconds)."""
        self.instants.append({"name": name, "cat": cat, "ph": "i", "s": "t", "ts": _us(_ns(t)), "args": args})

    def _yield_to_steps(self) -> list[tuple[int, int, int, str, str, dict[str, Any]]]:
        """The spans, those drawn on every rank (ranked below a step: a recovery, a link setup) cut
        where one of this rank's steps overlaps them in part: ranks start and end a step at
        different times, a job-wide span at one."""
        steps = sorted((s[0], s[1]) for s in self.spans if s[4] == "step")
        starts = [a for a, _ in steps]
        out = []
        for span in self.spans:
            start, end, order, name, cat, args = span
            if order < STEP_ORDER and steps:
                i = bisect.bisect_left(starts, end) - 1  # the last step that starts before the end
                if i >= 0 and start < steps[i][0] < end < steps[i][1]:
                    end, args = steps[i][0], {**args, "cut_us": _us(end - steps[i][0])}
                j = bisect.bisect_right(starts, start) - 1  # the step this one starts in
                if j >= 0 and steps[j][0] < start < steps[j][1] < end:
                    start, args = steps[j][1], {**args, "cut_us": _us(steps[j][1] - start)}
            out.append((start, end, order, name, cat, args))
        return out

    def events(self, pid: int, tid: int) -> Events:
        """Its trace events, the spans nested (see the module)."""
        out: Events = []
        stack: list[int] = []  # the ends of the open spans
        for start, end, _, name, cat, args in sorted(
            self._yield_to_steps(), key=lambda s: (s[0], -s[1], s[2])
        ):
            while stack and start >= stack[-1]:
                stack.pop()
            if stack and end > stack[-1]:
                args = {**args, "cut_us": _us(end - stack[-1])}
                end = stack[-1]
            stack.append(end)
            out.append(
                {"name": name, "cat": cat, "ph": "X", "ts": _us(start), "dur": _us(end - start), "args": args}
            )
        return [{**e, "pid": pid, "tid": tid} for e in out + self.instants]


def _pieces(start: float, end: float, cuts: list[float]) -> list[tuple[float, float]]:
    """``[start, end]`` cut at each of ``cuts`` inside it."""
    points = [start, *sorted(c for c in cuts if start < c < end), end]
    return list(itertools.pairwise(points))


def _overlay(
    events: Events, world: list[int], ranks: dict[int, _Track], other: dict[str, _Track]
) -> list[tuple[float, float]]:
    """What is not training, on every rank's thread: recoveries in their parts, failed attempts,
    checkpoint writes, link setups and failures; each fault on its own thread. Returns the spans
    in which no step trained (each part of a recovery but its recomputed steps)."""
    gaps: list[tuple[float, float]] = []
    done = {(int(e["step"]), float(e["t_start"])) for e in events if e["event"] == "step_end"}
    t_now = 0.0
    for e in events:
        kind, spans = e["event"], []
        if kind == "recovery_complete":
            parts = recovery_spans(e)
            if parts:
                args = {k: e.get(k) for k in ("fail_step", "resume_step", "strategy", "detected_by")}
                spans.append(
                    (f"recovery ({e.get('strategy')})", "recovery", parts[0][1], parts[-1][2], args, 1)
                )
                spans += [
                    (label, "recovery", a, b, {"fail_step": e.get("fail_step")}, 2) for label, a, b in parts
                ]
        elif kind == "failure_detected" and "t_start" in e:
            if (int(e["step"]), float(e["t_start"])) not in done:
                args = {"step": e["step"], "detected_by": e.get("detected_by"), "dead": e.get("dead")}
                spans.append(
                    ("failed attempt", "recovery", float(e["t_start"]), float(e["t_death"]), args, 2)
                )
            for r in e.get("dead") or world:
                if r in ranks:
                    ranks[r].instant(
                        "failure", "fault", float(e["t_death"]), {"step": e["step"], "dead": e["dead"]}
                    )
        elif kind == "checkpoint_committed":
            start = float(e.get("t_saved", float(e["t"]) - float(e.get("write_s", 0.0))))
            args = {k: e.get(k) for k in ("step", "bytes", "write_s", "asynchronous", "paused")}
            spans.append(("checkpoint write", "checkpoint", start, float(e["t_resume"]), args, 2))
            other["checkpoint writes"].span(
                f"checkpoint step {e['step']}", "checkpoint", start, float(e["t"]), args
            )
        elif kind == "group_open":
            args = {"epoch": e.get("epoch"), "link_setup_max_s": e.get("link_setup_max_s")}
            spans.append(("link setup", "setup", float(e["t_start"]), float(e["t"]), args, 3))
        elif kind in ("recovery_failed", "relink_failed", "job_failed"):
            for track in ranks.values():
                args = {k: e.get(k) for k in ("stage", "error")}
                track.instant(kind.replace("_", " "), "recovery", float(e.get("t", t_now)), args)
        elif kind == "fault_injected":
            _fault(e, t_now, world, ranks, other)
        elif kind == "fault_healed" and str(e.get("id")) in other:
            other[str(e["id"])].instant("healed", "fault", float(e["t"]), {"id": e["id"]})
        if isinstance(e.get("t"), (int, float)) and kind != "fault_injected":
            t_now = max(t_now, float(e["t"]))
        for name, cat, a, b, args, order in spans:
            for r in world:
                ranks[r].span(name, cat, a, b, args, order)
            if order == 2 and name != "recompute" and b > a:
                gaps.append((a, b))
    return gaps


def _fault(
    e: dict[str, Any], t_now: float, world: list[int], ranks: dict[int, _Track], other: dict[str, _Track]
) -> None:
    """A fault as it fired: a mark on the ranks it targets, and its own thread with its window."""
    record, params = e.get("record") or {}, e.get("params") or {}
    t = float(record.get("t0", params.get("at_time", t_now)))
    args = {k: e.get(k) for k in ("id", "kind", "step", "point", "rank", "params")}
    label = f"{e['kind']} ({e.get('id')})"
    links = params.get("links") or record.get("links") or []
    targets = [int(e["rank"])] if isinstance(e.get("rank"), int) and e["rank"] >= 0 else []
    targets = (
        targets or [int(r) for r in params.get("ranks") or []] or sorted({int(r) for ln in links for r in ln})
    )
    for r in targets or world:
        if r in ranks:
            ranks[r].instant(label, "fault", t, args)
    track = other.setdefault(str(e.get("id")), _Track())
    track.instant(label, "fault", t, args)
    if isinstance(record.get("t_end"), (int, float)):
        track.span(f"{e['kind']} in force", "fault", t, float(record["t_end"]), args)


def _ends(e: dict[str, Any]) -> dict[int, float]:
    """Each rank that trained the step, in the order of the step's per-rank lists, to its end."""
    ends = e.get("t_ranks") or []
    ops = e.get("ops") or {}
    order = e.get("ranks") or (sorted(int(r) for r in ops) if len(ops) == len(ends) else range(len(ends)))
    return {int(r): float(t) for r, t in zip(order, ends)}


def _step(e: dict[str, Any], again: bool, tracks: dict[int, _Track], gaps: list[tuple[float, float]]) -> None:
    """One ``step_end`` on each rank's thread: the step's span and what it held, in time, cut where
    ``gaps`` (what was not training) begin and end."""
    ops: dict[str, Any] = e.get("ops") or {}
    for i, (rank, t_end) in enumerate(_ends(e).items()):
        track = tracks.get(rank)
        if track is None:
            continue
        mine = ops.get(str(rank)) or {}
        t0, t1 = float(mine.get("t_start", e["t_start"])), t_end
        parts: dict[str, Any] = {
            k: e[k][i] for k in ("compute_s", "comm_wait_s", "bubble_s", "data_wait_s", "flops") if k in e
        }
        more = int(mine.get("more", 0))
        args = {"step": e["step"], "loss": e.get("loss"), "dp_share": e.get("dp_share"), **parts}
        track.span(
            f"step {e['step']}" + (" (run again)" if again else ""),
            "step",
            t0,
            t1,
            {**args, "ops_unrecorded": more},
            STEP_ORDER,
        )
        data_end = t0 + float(parts.get("data_wait_s", 0.0))
        children: list[tuple[str, str, float, float, dict[str, Any]]] = []
        if data_end > t0:
            children.append(("data wait", "data", t0, data_end, {"seconds": data_end - t0}))
        if "run" not in mine:  # a journal from before ops were recorded: the totals, laid end to end
            at = data_end
            for key, name in (("compute_s", "compute"), ("comm_wait_s", "comm wait"), ("bubble_s", "bubble")):
                seconds = float(parts.get(key, 0.0))
                children.append(
                    (name, name.split()[0], at, min(t1, at + seconds), {"seconds": seconds, "laid_out": True})
                )
                at = min(t1, at + seconds)
        for op, algo, group, nbytes, a, b in mine.get("run", []):
            if algo == "p2p":
                children.append(
                    ("bubble", "bubble", float(a), float(b), {"op": op, "bytes": nbytes, "group": group})
                )
            else:
                args = {"bytes": nbytes, "algorithm": algo, "group": group, "step": e["step"]}
                children.append((op, "collective", float(a), float(b), args))
        if "run" in mine:  # the rest is compute, less what was not training (an op retry's hold)
            taken = sorted([(c[2], c[3]) for c in children] + [g for g in gaps if g[1] > t0 and g[0] < t1])
            at = data_end
            for a, b in taken:
                if a > at:
                    children.append(("compute", "compute", at, a, {}))
                at = max(at, b)
            if t1 > at:
                name = "untraced" if more else "compute"
                children.append((name, name, at, t1, {"ops_unrecorded": more} if more else {}))
        cuts = [t for g in gaps for t in g]
        for name, cat, a, b, args in children:
            for x, y in _pieces(max(a, t0), min(b, t1), cuts):
                track.span(name, cat, x, y, args, 6)


def _links(main: Events, steps: Events) -> dict[str, _Track]:
    """Each directed link's busy time per step (the seconds its messages were on it, summed),
    from the receiving rank's first collective of the step; a world past 64 ranks journals its
    links over the whole phase (``link_totals``), drawn as one span."""
    tracks: dict[str, _Track] = {}
    for e in steps:
        links = e.get("links")
        if not isinstance(links, dict):
            continue
        ends = _ends(e)
        for dst, senders in links.items():
            first = [float(o[4]) for o in ((e.get("ops") or {}).get(dst) or {}).get("run", [])]
            at = min(first, default=float(e["t_start"]))
            end = ends.get(int(dst), float(e["t"]))
            for src, obs in senders.items():
                if float(obs[0]) <= 0:
                    continue
                busy = float(obs[1])
                args = {
                    "step": e["step"],
                    "bytes": obs[0],
                    "busy_s": busy,
                    "rated_s": obs[2],
                    "waited_s": obs[3],
                }
                if len(obs) > 5:
                    args["queued_s"] = obs[5]
                track = tracks.setdefault(f"{src}->{dst}", _Track())
                track.span("busy", "link", at, min(end, at + busy), args)
    for e in main:
        if e["event"] == "link_totals" and steps:
            start, end = float(steps[0]["t_start"]), float(steps[-1]["t"])
            for link, obs in (e.get("links") or {}).items():
                if float(obs[0]) > 0:
                    args = {"bytes": obs[0], "busy_s": obs[1], "rated_s": obs[2], "waited_s": obs[3]}
                    tracks.setdefault(link, _Track()).span(
                        "busy (phase)", "link", start, min(end, start + float(obs[1])), args
                    )
    return tracks


def _main_phase(events: Events) -> Events:
    """The events of the main phase: up to its ``phase_end``, those that name no other phase."""
    out, phase = [], "main"  # what comes before it (the first link setup) is the main phase's too
    for e in events:
        if e.get("event") == "phase_start":
            phase = str(e.get("phase"))
        if str(e.get("phase", phase)) == "main" and "event" in e:
            out.append(e)
        if e.get("event") == "phase_end":
            phase = ""
    return out


def _meta(pid: int, name: str, threads: list[tuple[int, str]]) -> Events:
    out: Events = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
    ]
    for tid, label in threads:
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
        out.append(
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        )
    return out


def chrome_trace(events: Events) -> dict[str, Any]:
    """The Trace Event Format object of a journal's ``events`` (see the module)."""
    start = next((e for e in events if e.get("event") == "run_start"), {})
    main = _main_phase(events)
    steps = [e for e in main if e["event"] == "step_end"]
    world_n = int(start.get("world") or 0)
    seen = {int(r) for e in steps for r in (e.get("ops") or {})}
    world = sorted(set(range(world_n)) | seen)
    ranks = {r: _Track() for r in world}
    other: dict[str, _Track] = {"checkpoint writes": _Track()}
    gaps = _overlay(main, world, ranks, other)
    runs: set[int] = set()
    for e in steps:
        _step(e, int(e["step"]) in runs, ranks, gaps)
        runs.add(int(e["step"]))
    links = _links(main, steps)
    link_names = sorted(links, key=lambda k: tuple(int(x) for x in k.split("->")))
    faults = [k for k in other if k != "checkpoint writes"]
    out: Events = _meta(RANKS_PID, "ranks", [(r, f"rank {r}") for r in world])
    out += _meta(LINKS_PID, "links", [(i + 1, f"link {k}") for i, k in enumerate(link_names)])
    out += _meta(
        FAULTS_PID,
        "faults",
        [(CHECKPOINT_TID, "checkpoint writes")] + [(i + 1, f) for i, f in enumerate(faults)],
    )
    for r in world:
        out += ranks[r].events(RANKS_PID, r)
    for i, k in enumerate(link_names):
        out += links[k].events(LINKS_PID, i + 1)
    out += other["checkpoint writes"].events(FAULTS_PID, CHECKPOINT_TID)
    for i, f in enumerate(faults):
        out += other[f].events(FAULTS_PID, i + 1)
    info = {k: start.get(k) for k in ("run", "scenario", "seed", "world")}
    clock = "virtual seconds of the main phase x 1e6 (microseconds)"
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {**info, "clock": clock}}
