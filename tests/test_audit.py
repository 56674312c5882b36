"""The resume audit on numpy programs: real rank processes, real SIGKILLs, real files; the verdict's
pure functions on hand-made leaves; bad programs named with exit 254 and nothing left running."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from testbed.audit import KILL_POINTS, AuditPlan, audit_resume
from testbed.audit.scenario import load_audit, parse_audit
from testbed.audit.segments import RankPool, Stretch, run_segment
from testbed.audit.store import newest
from testbed.audit.verdict import first_leaf, judge
from testbed.cli import main
from testbed.core.errors import ScenarioError
from testbed.testing.suite import load_suite, run_suite
from tests.conftest import ROOT, SCENARIOS

NUMPY = str(ROOT / "workloads/programs/control_numpy.py")
BAD = ROOT / "tests/programs"


def _rank_processes() -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if "testbed.audit.rank_process" in " ".join(p.cmdline())]


def _leaves(**values: object) -> dict[str, list[object]]:
    return {k: [f"h{v}", v] for k, v in values.items()}


# --- the verdict, pure ------------------------------------------------------------------------------
def test_the_first_leaf_that_differs_is_named_in_rank_then_program_order() -> None:
    ref = {0: _leaves(a=1, b=2), 1: _leaves(a=1, b=2)}
    assert first_leaf(ref, {0: _leaves(a=1, b=2), 1: _leaves(a=1, b=2)}) is None
    assert first_leaf(ref, {0: _leaves(a=1, b=3), 1: _leaves(a=9, b=2)}) == (0, "b", 3, 2)
    assert first_leaf(ref, {1: _leaves(a=1)}) == (1, "b", "(absent)", 2)  # rank 0 never reported


def test_judge_tells_a_state_the_load_missed_from_one_that_diverged_later() -> None:
    ref = {b: {0: _leaves(**{"scheduler.last_epoch": b, "model.w": b})} for b in range(6)}
    same = {b: ref[b] for b in (4, 5)}
    assert judge(ref, {3: ref[3]}, 3, ref[3], same).status == "pass"
    missed = judge(ref, {}, 3, {0: _leaves(**{"scheduler.last_epoch": 0, "model.w": 3})}, same)
    assert (missed.status, missed.divergence.when, missed.divergence.component) == (
        "diverged",
        "after_load",
        "scheduler",
    )
    assert "scheduler.last_epoch 0 != 3" in missed.describe()
    later = judge(
        ref, {}, 3, ref[3], {4: ref[4], 5: {0: _leaves(**{"scheduler.last_epoch": 5, "model.w": 7})}}
    )
    assert (later.divergence.when, later.divergence.leaf, later.divergence.boundary) == (
        "later",
        "model.w",
        5,
    )
    early = judge(ref, {2: {0: _leaves(**{"scheduler.last_epoch": 2, "model.w": 9})}}, 3, ref[3], same)
    assert early.status == "undecided"


def test_a_plan_names_each_problem_with_its_fix() -> None:
    problems = AuditPlan(entry="x.py", ranks=0, kill_points=("later",), kill_steps=(9,), steps=8).problems()
    text = "; ".join(problems)
    assert (
        "ranks 0" in text and "kill points later" in text and "kill step 9: a step of the run is 0..7" in text
    )
    assert AuditPlan(entry="x.py", ranks=2, victim=2).problems() == [
        "victim rank 2: a rank of the run is 0..1"
    ]
    saves = AuditPlan(entry="x.py", save_every=2, kill_points=("in_save",), kill_steps=(4,)).problems()
    assert saves and "(s + 1) % 2 == 0" in saves[0]


# --- real processes -----------------------------------------------------------------------------------
def test_the_numpy_control_resumes_bit_for_bit_at_every_kill_point(tmp_path: Path) -> None:
    plan = AuditPlan(entry=NUMPY, ranks=3, steps=8, kill_steps=(3, 5))
    result = audit_resume(plan, tmp_path)
    assert result.exit_code == 0, [c.verdict.describe() for c in result.cases]
    assert len(result.cases) == len(KILL_POINTS) * 2
    for case in result.cases:  # each kill fired, where it was armed, on the victim
        assert case.death is not None and case.death["point"] == case.point
        assert case.death["rank"] == 2 and case.death["step"] == case.step
        assert case.resumed_at == case.step + (1 if case.point == "after_save" else 0)
    in_save = next(c for c in result.cases if c.point == "in_save")
    assert in_save.death and "mid-write" in in_save.death["detail"]
    journal = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert [e["event"] for e in journal][-1] == "audit_finished"
    assert sum(e["event"] == "case" for e in journal) == len(result.cases)
    assert not _rank_processes()


def test_a_save_killed_midway_is_never_committed_and_the_resume_takes_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from testbed.audit import segments

    sockets: dict[str, list[str]] = {}  # the stretch's socket folder -> what it held once the ranks listened
    start = segments._start_jobs

    def started(procs: Any, plan: AuditPlan, stretch: Stretch, folder: str) -> None:
        start(procs, plan, stretch, folder)
        sockets[folder] = sorted(os.listdir(folder))

    monkeypatch.setattr(segments, "_start_jobs", started)
    plan = AuditPlan(entry=NUMPY, ranks=2, steps=8)
    with (tmp_path / "ranks.log").open("ab") as log:
        pool = RankPool(plan.entry, log)
        try:
            killed = run_segment(
                pool, plan, Stretch(0, tmp_path, kill={"rank": 0, "step": 4, "point": "in_save"})
            )
        finally:
            pool.close()
    assert killed.committed == [1, 2, 3, 4] and killed.death and killed.death["point"] == "in_save"
    assert (tmp_path / "step_00000005.tmp").is_dir() and not (tmp_path / "step_00000005").exists()
    assert newest(tmp_path) == (4, tmp_path / "step_00000004")
    (tmp_path / "step_00000004" / "rank_00001" / "state.json").write_text("{}")  # a flipped file
    assert newest(tmp_path) == (3, tmp_path / "step_00000003")  # its sha256 no longer matches
    assert not _rank_processes()
    # both ranks' unix sockets were in the stretch's folder, and the folder went with the stretch
    # (the killed rank never removes its own socket)
    ((folder, held),) = sockets.items()
    assert len([name for name in held if name.endswith(".sock")]) == 2, held
    assert not os.path.exists(folder)


def test_a_program_with_hidden_state_is_caught_after_the_load(tmp_path: Path) -> None:
    plan = AuditPlan(entry=str(BAD / "hidden_counter.py"), kill_points=("before_forward",), kill_steps=(1,))
    result = audit_resume(plan, tmp_path)
    assert result.exit_code == 1
    d = result.cases[0].verdict.divergence
    assert d is not None and d.when == "later" and d.component == "model"


@pytest.mark.parametrize(
    ("program", "says", "extra"),
    [
        ("broken_import.py", "importing it failed: ModuleNotFoundError", []),
        ("no_method.py", "it has no method optimizer_step()", []),
        ("load_raises.py", "load() raised RuntimeError: checkpoint format 2", []),
        ("save_nothing.py", "returned having written no file there", []),
        ("hangs.py", "made no progress for 2 s (rank 0 in forward_backward of step 2", ["--timeout", "2"]),
        ("nondeterministic.py", "two uninterrupted runs of seed 0 differ (model.w2", []),
    ],
)
def test_a_bad_program_is_named_exits_254_and_leaves_nothing_running(
    program: str, says: str, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["audit-resume", str(BAD / program), "--kill-points", "after_step", "--out", str(tmp_path), *extra]
    )
    out = capsys.readouterr().out
    assert code == 254 and says in out, out
    report = json.loads((tmp_path / "report.json").read_text())
    assert says in report["problem"] and report["exit_code"] == 254
    assert "<error" in (tmp_path / "junit.xml").read_text()
    assert not _rank_processes()


def test_the_command_refuses_bad_arguments_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["audit-resume", "no/such/train.py"]) == 254
    assert main(["audit-resume", NUMPY, "--kill-points", "sometime"]) == 254
    assert main(["audit-resume", NUMPY, "--option", "novalue"]) == 254
    err = capsys.readouterr().err
    assert "no such file" in err and "choose from before_forward" in err and "KEY=VALUE" in err


def test_the_command_writes_junit_and_exits_0_on_the_control(tmp_path: Path) -> None:
    junit = tmp_path / "elsewhere" / "audit.xml"
    code = main(
        [
            "audit-resume",
            NUMPY,
            "--kill-points",
            "mid_reduction,after_save",
            "--out",
            str(tmp_path / "o"),
            "--junit",
            str(junit),
        ]
    )
    assert code == 0
    xml = junit.read_text()
    assert 'tests="2"' in xml and 'failures="0"' in xml and "mid_reduction@step4" in xml


# --- the scenario form --------------------------------------------------------------------------------
def test_an_audit_scenario_runs_in_a_suite_to_the_verdict_it_declares(tmp_path: Path) -> None:
    scenarios = load_suite([SCENARIOS / "audit" / "audit_control_numpy.yaml"])
    rows = run_suite(scenarios, tmp_path)
    assert [(r.got, r.as_declared) for r in rows] == [("pass", True)]
    assert (tmp_path / "audit_control_numpy" / "summary.txt").read_text().count("PASS") == len(KILL_POINTS)


def test_an_audit_scenario_declaring_the_wrong_verdict_is_not_as_declared(tmp_path: Path) -> None:
    text = (SCENARIOS / "audit" / "audit_control_numpy.yaml").read_text()
    text = text.replace("expect: {verdict: pass}", "expect: {verdict: fail, component: scheduler}")
    text = text.replace("entry: workloads.programs.control_numpy", f"entry: {NUMPY}")
    text = text.replace("audit: {ranks: 2", "audit: {kill_points: [after_step], ranks: 2")
    (tmp_path / "wrong.yaml").write_text(text)
    rows = run_suite(load_suite([tmp_path / "wrong.yaml"]), tmp_path / "out")
    assert not rows[0].as_declared and "declared fail (resume_audit: scheduler), got pass" in rows[0].why


def test_a_bad_audit_scenario_names_every_problem() -> None:
    text = """
version: 1
name: x
workload: {name: program, entry: workloads.programs.control_numpy, option: {}}
audit: {ranks: 2, kill_points: [before_forward, whenever], steps: 8}
expect: {verdict: maybe}
"""
    with pytest.raises(ScenarioError) as err:
        parse_audit(text, "x.yaml")
    problems = err.value.fields["problems"]
    joined = "\n".join(problems)
    assert "unknown field 'option'" in joined and "whenever" in joined and "'maybe'" in joined
    assert load_audit(SCENARIOS / "audit" / "audit_bug_scheduler.yaml").component == "scheduler"


# --- the testbed's own workloads as programs ------------------------------------------------------------
@pytest.mark.parametrize("workload", ["mlp", "transformer"])
def test_the_testbeds_own_workloads_and_checkpoint_writer_resume_bit_for_bit(
    workload: str, tmp_path: Path
) -> None:
    plan = AuditPlan(
        entry="workloads.as_program:make",
        options={"workload": workload},
        kill_points=("mid_reduction", "in_save"),
        twin_run=False,
    )
    result = audit_resume(plan, tmp_path)
    assert result.exit_code == 0, [c.verdict.describe() for c in result.cases] + [result.problem]


def test_a_workloads_one_rank_groups_leave_no_socket_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.fabric.dataplane import DataPlane
    from workloads import as_program

    planes: list[DataPlane] = []

    def plane(*args: Any, **kw: Any) -> DataPlane:
        planes.append(DataPlane(*args, **kw))
        return planes[-1]

    monkeypatch.setattr(as_program, "DataPlane", plane)
    as_program.WorkloadProgram(0, 1, 7, {"workload": "mlp"})  # a killed rank never closes its plane
    try:
        (made,) = planes
        assert not os.path.exists(os.path.dirname(made.address[2]))
    finally:
        for each in planes:
            each.close()


def test_a_component_left_out_of_the_workloads_checkpoint_is_named(tmp_path: Path) -> None:
    rows = run_suite(load_suite([SCENARIOS / "audit" / "audit_mlp_rng_left_out.yaml"]), tmp_path)
    assert [(r.got, r.as_declared) for r in rows] == [("fail (resume_audit: rng)", True)]
    summary = (tmp_path / "audit_mlp_rng_left_out" / "summary.txt").read_text()
    assert "rng: rng.pcg64" in summary and "differed right after load" in summary


# A background job of a script starts with Ctrl-C ignored, and Python then never raises
# KeyboardInterrupt: the audit stopped only when its ranks died of the signal (exit 254, not 130).
IGNORING_CTRL_C = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, '-m', 'testbed.cli', *sys.argv[1:]])"
)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_ends_every_rank_process_and_the_zygote_and_keeps_the_report(
    tmp_path: Path, inherited: str
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    start = ["-m", "testbed.cli"] if inherited == "default" else ["-c", IGNORING_CTRL_C]
    cli = subprocess.Popen(
        [sys.executable, *start, "audit-resume", str(BAD / "hangs.py"), "--out", str(tmp_path)],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def ours() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "testbed.audit" in " ".join(p.info["cmdline"] or []) and os.getsid(p.pid) == cli.pid:
                    found.append(p)
            except (ProcessLookupError, psutil.Error):
                continue
        return found

    deadline = time.monotonic() + 60
    while len(ours()) < 3 and time.monotonic() < deadline:  # the zygote and two ranks, hanging
        time.sleep(0.1)
    assert len(ours()) >= 3
    os.killpg(cli.pid, signal.SIGINT)
    assert cli.wait(timeout=60) == 130, cli.stderr.read() if cli.stderr else ""
    time.sleep(0.5)
    assert ours() == []
    report = json.loads((tmp_path / "report.json").read_text())
    assert "KeyboardInterrupt" in report["problem"]
