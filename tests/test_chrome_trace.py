"""``testbed export --format chrome-trace``: a run's virtual timeline as a Trace Event Format file, and
the journal's per-rank ``ops`` it draws the collectives from."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.core.journal import read_journal
from testbed.report.chrome_trace import FAULTS_PID, LINKS_PID, RANKS_PID, chrome_trace
from testbed.scenario.parse import parse_scenario

#: 2 x 2 NPUs, data-parallel: a link between the supernodes slowed from step 2 on, rank 3 killed
#: in the middle of step 6's gradient allreduce, a restart from the step-4 checkpoint
SCENARIO = """
version: 1
name: chrome-trace
seed: 3
cluster: {preset: atlas-900-a3, supernodes: 2, npus_per_supernode: 2}
workload: {name: mlp, steps: 8, parallel: {dp: 4}, hidden: 32}
policy:
  checkpoint: {every: 4}
  recovery: {strategy: restart, max_restarts: 2, restart_s: 30}
  collectives: {algorithm: ring}
faults:
  - {kind: link_degrade, target: {link: [1, 2]}, at: {step: 2}, duration: 1000, bandwidth_factor: 0.5}
  - {kind: node_kill, target: {rank: 3}, at: {step: 6, during: allreduce}}
"""


def nesting_problems(trace: dict[str, Any]) -> list[str]:
    """Each place where two complete events of one (pid, tid) overlap in part (compared at the
    nanosecond, the precision the trace's microseconds carry)."""
    tracks: dict[tuple[Any, Any], list[tuple[int, int, str]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            tracks[(e["pid"], e["tid"])].append((start, start + round(e["dur"] * 1000), e["name"]))
    problems = []
    for track, spans in tracks.items():
        open_spans: list[tuple[int, int, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_spans and start >= open_spans[-1][1]:
                open_spans.pop()
            if open_spans and end > open_spans[-1][1]:
                problems.append(f"{track}: {name} [{start}, {end}] overlaps {open_spans[-1]} in part")
            open_spans.append((start, end, name))
    return problems


def format_problems(trace: dict[str, Any]) -> list[str]:
    """What in ``trace`` the Trace Event Format does not allow (of what this exporter writes)."""
    problems = []
    if not isinstance(trace.get("traceEvents"), list) or trace.get("displayTimeUnit") not in ("ms", "ns"):
        problems.append("not a JSON object with traceEvents and displayTimeUnit")
    for e in trace.get("traceEvents", []):
        missing = [k for k in ("name", "ph", "pid", "tid") if k not in e]
        if e.get("ph") != "M" and not isinstance(e.get("ts"), (int, float)):
            missing.append("ts")
        if missing:
            problems.append(f"{e}: lacks {missing}")
        if e.get("ph") == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            problems.append(f"{e}: a complete event needs a duration >= 0")
        if e.get("ph") not in ("X", "i", "M"):
            problems.append(f"{e}: phase {e.get('ph')!r}")
    return problems


@pytest.fixture(scope="module")
def run(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scenario run once; its directory."""
    from testbed.control.runner import run as run_scenario

    out = tmp_path_factory.mktemp("chrome-trace") / "run"
    run_scenario(parse_scenario(SCENARIO), out)
    return out


def test_the_nesting_check_finds_a_partial_overlap_and_passes_nested_spans() -> None:
    def x(name: str, ts: float, dur: float, tid: int = 0) -> dict[str, Any]:
        return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": tid}

    good = {"traceEvents": [x("step", 0, 10), x("compute", 0, 4), x("allreduce", 4, 6), x("next", 10, 1)]}
    assert nesting_problems(good) == []
    bad = {"traceEvents": [x("step", 0, 10), x("allreduce", 8, 4)]}
    assert len(nesting_problems(bad)) == 1
    assert nesting_problems({"traceEvents": [x("step", 0, 10), x("allreduce", 8, 4, tid=1)]}) == []
    assert format_problems({"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 0, "ts": 0}]})
    assert format_problems({"traceEvents": [{"name": "a", "ph": "i", "pid": 1, "ts": 0}]})


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.chaos
def test_the_export_of_a_run_with_a_kill_and_a_link_fault(run: Path, tmp_path: Path) -> None:
    events = read_journal(run / "journal.jsonl")
    out = tmp_path / "trace.json"
    assert main(["export", str(run), "--out", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert trace == json.loads(json.dumps(chrome_trace(events)))  # a pure function, JSON round trip
    assert format_problems(trace) == []
    assert nesting_problems(trace) == []
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    named = {
        (e["pid"], e["tid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"
    }
    # a track per rank, and one per directed link that carried bytes in the main phase
    assert {(tid, name) for pid, tid, name in named if pid == RANKS_PID} == {
        (r, f"rank {r}") for r in range(4)
    }
    main_steps = [e for e in events if e["event"] == "step_end" and e["phase"] == "main"]
    carried = {
        f"{src}->{dst}" for e in main_steps for dst, s in e["links"].items() for src, o in s.items() if o[0]
    }
    assert {name.removeprefix("link ") for pid, _, name in named if pid == LINKS_PID} == carried
    assert {e["tid"] for e in spans if e["pid"] == LINKS_PID} == {t for p, t, _ in named if p == LINKS_PID}
    # each collective with its bytes and algorithm, inside its step
    collectives = [e for e in spans if e.get("cat") == "collective"]
    assert collectives and all(
        e["args"]["algorithm"] == "ring" and e["args"]["bytes"] > 0 for e in collectives
    )
    for rank in range(4):
        assert any(e["name"] == "step 8" for e in spans if e["pid"] == RANKS_PID and e["tid"] == rank)
    # the faults as instants on their ranks' tracks and their own, the degrade's window as a span
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert {
        e["tid"] for e in instants if e["name"] == "node_kill (f1-node_kill)" and e["pid"] == RANKS_PID
    } == {3}
    assert {e["tid"] for e in instants if e["name"].startswith("link_degrade") and e["pid"] == RANKS_PID} == {
        1,
        2,
    }
    assert any(e["name"] == "link_degrade in force" and e["pid"] == FAULTS_PID for e in spans)
    # the recovery in its parts, on every rank's track
    recovery = {
        e["name"] for e in spans if e["pid"] == RANKS_PID and e["tid"] == 0 and e["cat"] == "recovery"
    }
    assert {"recovery (restart)", "detection", "restart", "re-link", "load", "recompute"} <= recovery
    assert any(e["name"].endswith("(run again)") for e in spans)
    assert any(e["name"] == "checkpoint write" for e in spans)
    # the journal's ops: [op, algo, group, bytes, t_start, t_end], within the rank's step
    for e in main_steps:
        assert set(e["ops"]) == {str(r) for r in range(4)}
        for mine in e["ops"].values():
            assert mine["more"] == 0 and mine["run"]
            assert all(
                o[:3] == ["allreduce", "ring", "world"] and mine["t_start"] <= o[4] <= o[5]
                for o in mine["run"]
            )


@pytest.mark.ray
@pytest.mark.slow
def test_the_default_out_is_the_runs_trace_json(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(run)]) == 0
    assert (run / "trace.json").is_file() and "trace.json" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["{tmp}/none"], "no such folder"),
        (["{tmp}"], "no journal.jsonl"),
        (["{tmp}", "--format", "svg"], "--format 'svg'"),
        (["{run}", "--out", "{tmp}/no/such/dir/trace.json"], "cannot write it"),
        (["{run}", "--out", "{tmp}"], "that is a folder"),
        (["{damaged}"], "not a journal line"),
    ],
)
def test_bad_input_exits_254_with_a_message(
    args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, damaged = tmp_path / "run", tmp_path / "damaged"
    run_dir.mkdir()
    damaged.mkdir()
    (run_dir / "journal.jsonl").write_text('{"event": "run_start", "run": "r", "seq": 1, "world": 2}\n')
    (damaged / "journal.jsonl").write_text('{"event": "run_start"\n{"event": "run_end"}\n')
    given = [a.format(tmp=tmp_path, run=run_dir, damaged=damaged) for a in args]
    assert main(["export", *given]) == 254
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
