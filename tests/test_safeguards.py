"""Safeguards end a run with exit 3 and say which one tripped: a diverged loss, a wall-time budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.control.runner import run
from testbed.core.errors import ScenarioError
from testbed.core.journal import read_journal
from testbed.scenario.parse import parse_scenario

TINY = """\
version: 1
name: guarded
seed: 3
cluster: {{preset: atlas-800t-a2, supernodes: 1, npus_per_supernode: 2}}
workload: {{name: mlp, steps: 12, parallel: {{dp: 2}}, hidden: 16{extra}}}
policy: {{checkpoint: {{every: 5}}}}
{safeguards}
"""


def test_safeguards_parse_with_defaults_and_refuse_a_bad_budget() -> None:
    s = parse_scenario(TINY.format(extra="", safeguards=""), "s.yaml")
    assert (s.safeguards.nan_loss, s.safeguards.wall_s, s.safeguards.max_failures) == (True, None, None)
    s = parse_scenario(
        TINY.format(extra="", safeguards="safeguards: {wall_s: 10m, nan_loss: false}"), "s.yaml"
    )
    assert (s.safeguards.nan_loss, s.safeguards.wall_s) == (False, 600.0)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(TINY.format(extra="", safeguards="safeguards: {wall_s: soon}"), "s.yaml")
    assert "safeguards.wall_s" in str(err.value) and "'10m'" in str(err.value)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(
    ("extra", "safeguards", "reason"),
    [
        (", lr: 1.0e+30", "", "the loss is nan"),
        ("", "safeguards: {wall_s: 0.001}", "past safeguards.wall_s = 0.001 s"),
    ],
    ids=["nan-loss", "wall-budget"],
)
def test_a_tripped_safeguard_aborts_with_exit_3_and_says_which(
    tmp_path: Path, extra: str, safeguards: str, reason: str
) -> None:
    result = run(parse_scenario(TINY.format(extra=extra, safeguards=safeguards), "g.yaml"), tmp_path / "g")
    assert (result.verdict, result.exit_code) == ("aborted", 3)
    assert reason in str(result.data["error"])
    (tripped,) = [
        e for e in read_journal(result.out_dir / "journal.jsonl") if e["event"] == "safeguard_tripped"
    ]
    assert reason in tripped["reason"] and (result.out_dir / "report.json").is_file()
