"""The resume audit on PyTorch programs (the ``torch`` extra): the control resumes bit for bit at
every kill point over two seeds, and each planted bug is caught and named by its component."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.audit import KILL_POINTS, AuditPlan, audit_resume
from testbed.audit.segments import RankPool, Stretch, run_segment
from testbed.audit.verdict import first_divergence
from tests.conftest import ROOT

pytest.importorskip("torch")

PROGRAMS = ROOT / "workloads" / "programs"
BUGS = sorted(PROGRAMS.glob("bug_*.py"))


def test_two_uninterrupted_runs_are_bitwise_equal_and_another_seed_is_not(tmp_path: Path) -> None:
    plan = AuditPlan(entry=str(PROGRAMS / "control_torch.py"), ranks=2, steps=4)
    with (tmp_path / "ranks.log").open("ab") as log:
        pool = RankPool(plan.entry, log)
        try:
            runs = [
                run_segment(pool, plan, Stretch(seed, tmp_path / f"run{i}"))
                for i, seed in enumerate((3, 3, 4))
            ]
        finally:
            pool.close()
    assert sorted(runs[0].boundaries) == [0, 1, 2, 3, 4]
    assert first_divergence(runs[0].boundaries, runs[1].boundaries, "before_kill") is None
    other = first_divergence(runs[0].boundaries, runs[2].boundaries, "before_kill")
    assert other is not None and other.boundary == 0  # the comparison can fail: another seed, other weights


def test_a_rank_forked_from_the_zygote_runs_as_one_in_a_fresh_interpreter_does(tmp_path: Path) -> None:
    plan = AuditPlan(entry=str(PROGRAMS / "control_torch.py"), ranks=2, steps=3)
    runs = {}
    for start in ("fresh", "zygote"):
        with (tmp_path / "ranks.log").open("ab") as log:
            pool = RankPool(plan.entry, log, start=start)
            try:
                runs[start] = run_segment(pool, plan, Stretch(0, tmp_path / start))
            finally:
                pool.close()
    assert sorted(runs["fresh"].boundaries) == [0, 1, 2, 3]
    assert first_divergence(runs["fresh"].boundaries, runs["zygote"].boundaries, "before_kill") is None


def test_the_torch_control_resumes_bit_for_bit_at_every_kill_point_over_two_seeds(tmp_path: Path) -> None:
    plan = AuditPlan(entry=str(PROGRAMS / "control_torch.py"), ranks=2, steps=8, seeds=(0, 1))
    result = audit_resume(plan, tmp_path)
    assert result.exit_code == 0, "\n".join(c.verdict.describe() for c in result.cases) + result.problem
    assert len(result.cases) == 2 * len(KILL_POINTS)
    assert all(c.death and c.death["point"] == c.point for c in result.cases)


def test_the_bug_suite_has_one_program_per_bug_each_named_for_a_component() -> None:
    components = {p.stem.split("_")[1] for p in BUGS}
    assert len(BUGS) >= 8
    assert components >= {"rng", "sampler", "scheduler", "scaler", "ema", "accumulation", "optimizer"}


@pytest.mark.parametrize("program", BUGS, ids=lambda p: p.stem)
def test_each_planted_bug_fails_the_audit_naming_its_component(program: Path, tmp_path: Path) -> None:
    # one resume from inside an accumulation window, in the second epoch, shows every planted bug
    plan = AuditPlan(
        entry=str(program), ranks=2, steps=8, kill_steps=(4,), kill_points=("after_save",), twin_run=False
    )
    result = audit_resume(plan, tmp_path)
    assert result.exit_code == 1, result.problem
    d = result.cases[0].verdict.divergence
    assert d is not None and d.component == program.stem.split("_")[1], d
    hidden = program.stem == "bug_ema_counter_plain_int"
    assert d.when == ("later" if hidden else "after_load")
