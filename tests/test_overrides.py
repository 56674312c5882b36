"""``--set FIELD=VALUE``: a scenario file with fields changed, validated as any file; its replay line
carries the changes, so pasted it runs the same scenario."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.core.errors import ScenarioError
from testbed.scenario.overrides import load, replay_command, split, with_overrides
from testbed.scenario.parse import load_scenario
from tests.conftest import SCENARIOS

QUICK = SCENARIOS / "quickstart.yaml"


def test_a_set_changes_one_field_as_yaml_and_the_digest_follows_the_content() -> None:
    base = load_scenario(QUICK)
    changed = load(QUICK, ["policy.timeouts.exec_s=300", "policy.checkpoint.include=[params, optimizer]"])
    assert changed.policy.timeouts.exec_s == 300 and changed.policy.checkpoint.include == (
        "params",
        "optimizer",
    )
    assert changed.file == str(QUICK) and changed.overrides[0] == "policy.timeouts.exec_s=300"
    assert changed.digest() != base.digest()
    same = load(QUICK, [f"policy.timeouts.exec_s={base.policy.timeouts.exec_s:g}"])
    assert same.digest() == base.digest()  # the changes' text is not hashed: only what they change


def test_the_replay_line_pasted_loads_the_same_scenario() -> None:
    changed = with_overrides(load_scenario(QUICK).with_seed(9), ["policy.recovery.strategy=hot_spare"])
    line = replay_command(changed)
    assert line == f"testbed run {QUICK} --set policy.recovery.strategy=hot_spare --seed 9"
    argv = shlex.split(line)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert load(argv[2], sets).with_seed(int(argv[-1])) == changed


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("policy", "write FIELD=VALUE with a dotted field"),
        ("=3", "write FIELD=VALUE"),
        ("policy..x=1", "write FIELD=VALUE"),
        ("policy.timeouts.exec_s=[1,", "the value is not YAML"),
        ("seed.x=1", "--set seed.x: 'seed' in"),
        ("policy.nope=1", "[--set policy.nope=1]:"),
    ],
)
def test_a_bad_set_is_refused_naming_it(override: str, needle: str) -> None:
    with pytest.raises(
        ScenarioError, match=needle.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")
    ):
        load(QUICK, [override])


def test_the_commands_take_set_and_refuse_a_bad_one_with_254(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(QUICK), "--set", "seed=5", "--out", str(tmp_path / "plan.json")]) == 0
    assert '"seed": 5' in (tmp_path / "plan.json").read_text()
    assert main(["run", str(QUICK), "--set", "policy", "--out", str(tmp_path / "run")]) == 254
    assert "write FIELD=VALUE" in capsys.readouterr().err
    assert split("a.b= x ") == ("a.b", "x")
