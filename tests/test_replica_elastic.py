"""The replica and elastic recovery strategies, end to end on the session's Ray, and their parts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from testbed.actors.outcome import Outcome
from testbed.control.runner import run
from testbed.core.errors import CollectiveTimeout
from testbed.core.journal import read_journal
from testbed.recovery.elastic import Shrunk, why_not
from testbed.report.goodput import goodput
from testbed.report.run_report import Report
from testbed.scenario.parse import load_scenario, parse_scenario
from testbed.topology.layout import Layout
from testbed.topology.presets import PRESETS, Topology
from testbed.train.replica_store import ReplicaGeneration, ReplicaStore, holder_of, usable
from tests.conftest import SCENARIOS

SMALL = """\
version: 1
name: small
seed: 11
cluster: {{preset: atlas-800t-a2, supernodes: 2, npus_per_supernode: 2}}
workload: {{name: mlp, steps: 16, parallel: {{dp: 4}}, hidden: 32}}
policy:
  checkpoint: {{every: 5}}
  recovery: {recovery}
faults: {faults}
expect: {expect}
"""


def small(tmp_path: Path, name: str, recovery: str, faults: str, expect: str = "{}") -> Report:
    text = SMALL.format(recovery=recovery, faults=faults, expect=expect)
    return run(parse_scenario(text, f"{name}.yaml"), tmp_path / name)


def events_of(result: Report, name: str) -> list[dict[str, Any]]:
    return [e for e in read_journal(result.out_dir / "journal.jsonl") if e["event"] == name]


# --- the parts ---------------------------------------------------------------


def test_a_holder_is_the_same_index_in_the_next_supernode() -> None:
    topo = Topology(PRESETS["atlas-800t-a2"], 3, 2)
    assert [holder_of(r, topo) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    alone = Topology(PRESETS["atlas-800t-a2"], 1, 4)
    assert [holder_of(r, alone) for r in range(4)] == [0, 1, 2, 3]  # nobody else to hold it


def test_a_replica_store_keeps_two_generations_of_each_copy() -> None:
    store = ReplicaStore()
    for step in (1, 2, 3):
        store.keep_own(step, {"params": {"w": np.full(2, step)}})
        store.hold(7, step, {"params": {"w": np.full(2, -step)}})
        store.hold(8, step, {"params": {"w": np.full(2, 10 * step)}})
    assert sorted(store.own) == [2, 3]
    assert sorted(store.held) == [(7, 2), (7, 3), (8, 2), (8, 3)]
    assert store.held[(8, 3)]["params"]["w"].tolist() == [30, 30]


def test_only_replicas_that_arrived_before_the_failure_are_usable() -> None:
    gens = [ReplicaGeneration(4, 10.0, 100), ReplicaGeneration(5, 12.5, 100)]
    assert [g.step for g in usable(gens, 12.0)] == [4]
    assert [g.step for g in usable(gens, 12.5)] == [5, 4]
    assert usable(gens, 9.0) == []


def _ctrl(options: dict[str, Any], dp: int = 4, shrunk: Shrunk | None = None) -> Any:
    workload = SimpleNamespace(options=options, layout=lambda: Layout(dp=dp))
    return SimpleNamespace(scenario=SimpleNamespace(workload=workload), shrunk=shrunk)


class ActorDiedError(Exception):
    """Named as Ray's: what a call to a killed actor raises."""


def test_elastic_refuses_what_a_shrink_cannot_handle() -> None:
    dead = {0: Outcome(error=ActorDiedError("gone")), 1: Outcome(value={})}
    assert why_not(_ctrl({}), dead) is None
    timeout = {0: Outcome(error=CollectiveTimeout("slow", t=1.0)), 1: Outcome(value={})}
    assert "no rank was lost" in str(why_not(_ctrl({}), timeout))
    assert "zero: 1" in str(why_not(_ctrl({"zero": 1}), dead))
    assert "already out" in str(why_not(_ctrl({}, shrunk=Shrunk((1, 2, 3), 5.0, 3)), dead))
    assert "every data-parallel replica" in str(why_not(_ctrl({}, dp=1), dead))


def test_goodput_counts_a_shrunk_step_at_the_share_of_replicas_that_trained() -> None:
    def step(n: int, share: float) -> dict[str, Any]:
        return {
            "event": "step_end",
            "phase": "main",
            "step": n,
            "t_start": n - 1.0,
            "t": float(n),
            "dp_share": share,
        }

    end = {"event": "phase_end", "phase": "main", "t": 4.0}
    full = goodput([step(1, 1.0), step(2, 1.0), step(3, 1.0), step(4, 1.0), end])
    shrunk = goodput([step(1, 1.0), step(2, 0.5), step(3, 0.5), step(4, 1.0), end])
    assert full is not None and shrunk is not None
    assert full["goodput"] == 1.0 and shrunk["goodput"] == pytest.approx(0.75)


# --- end to end ----------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_replica_restores_the_lost_rank_from_its_holder_and_recomputes_nothing(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "replica.yaml"), tmp_path / "replica")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    taken = events_of(result, "replica_taken")
    assert [e["step"] for e in taken if e["phase"] == "main"][:3] == [1, 2, 3]
    (resume,) = [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert resume["source"] == "replica" and resume["from_step"] == 26 and resume["fetched"] == {"5": 1}
    (rec,) = result.data["recoveries"]
    assert rec["strategy"] == "replica" and rec["resume_step"] == 27
    # the replica is loaded over the fabric and from host memory: far less than the checkpoint's read
    assert rec["breakdown"]["load_s"] < 1e-3 and rec["breakdown"].get("recompute_s", 0.0) == 0.0
    assert events_of(result, "phase_end")[-1]["phase"] == "probe"  # the storage checkpoint is proven too


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_replica_falls_back_to_storage_when_a_rank_and_its_holder_die_together(tmp_path: Path) -> None:
    faults = (
        "[{kind: node_kill, target: {rank: 0}, at: {step: 8}},"
        " {kind: node_kill, target: {rank: 2}, at: {step: 8}}]"
    )
    result = small(tmp_path, "both", "{strategy: replica}", faults, "{matches_uninterrupted: true}")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (why,) = events_of(result, "replica_unavailable")
    assert "[0, 2]" in why["reason"] and "lost together" in why["reason"]
    (rec,) = result.data["recoveries"]
    assert rec["strategy"] == "restart" and rec["resume_step"] == 6


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_replica_survives_a_whole_supernode_because_the_copies_live_in_the_other(tmp_path: Path) -> None:
    faults = "[{kind: node_kill, target: {supernode: 1}, at: {step: 9, during: allreduce}}]"
    result = small(tmp_path, "sn", "{strategy: replica}", faults, "{matches_uninterrupted: true}")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (resume,) = [e for e in events_of(result, "resume") if e["phase"] == "main"]
    assert resume["source"] == "replica" and resume["from_step"] == 8
    assert resume["fetched"] == {"2": 0, "3": 1}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_elastic_drops_the_replica_trains_on_and_rejoins(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "elastic.yaml"), tmp_path / "elastic")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (shrink,) = events_of(result, "elastic_shrink")
    (rejoin,) = events_of(result, "elastic_rejoin")
    assert shrink["dropped_dp"] == [5] and shrink["ranks_out"] == [5]
    assert rejoin["ranks"] == [5] and rejoin["step"] == 30 and rejoin["t"] >= shrink["t_ready"]
    steps = {e["step"]: e for e in events_of(result, "step_end") if e["phase"] == "main"}
    assert [len(steps[s]["t_ranks"]) for s in (26, 27, 29, 30)] == [8, 7, 7, 8]
    assert steps[28]["dp_share"] == pytest.approx(7 / 8)
    (rec,) = result.data["recoveries"]
    assert rec["strategy"] == "elastic" and set(rec["breakdown"]) == {"detect_s", "relink_s", "recompute_s"}
    assert not events_of(result, "npu_replaced") or all(
        e["spare"] is False for e in events_of(result, "npu_replaced")
    )


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_elastic_defers_checkpoints_while_a_replica_is_out(tmp_path: Path) -> None:
    faults = "[{kind: node_kill, target: {supernode: 0}, at: {step: 8, during: allreduce}}]"
    expect = "{matches_uninterrupted: false}"
    result = small(tmp_path, "never", "{strategy: elastic, replace_s: 1.0e+9}", faults, expect)
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (shrink,) = events_of(result, "elastic_shrink")
    assert shrink["dropped_dp"] == [0, 1] and shrink["dp_active"] == [2, 3]
    assert [e["step"] for e in events_of(result, "checkpoint_deferred")] == [10, 15]
    assert not events_of(result, "elastic_rejoin")
    main_end = next(e for e in events_of(result, "phase_end") if e["phase"] == "main")
    assert main_end["ranks_out"] == [0, 1]
    assert result.data["goodput"]["goodput"] < 1.0


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("ray_session")
def test_compare_sets_the_four_strategies_side_by_side_on_one_fault(tmp_path: Path) -> None:
    from testbed.experiments.compare import compare

    names = ["restart", "replica", "hot_spare", "elastic"]
    rows = {r["strategy"]: r for r in compare(load_scenario(SCENARIOS / "strategies.yaml"), names, tmp_path)}
    assert all(r["verdict"] == "pass" for r in rows.values()), rows
    assert [rows[n]["recoveries"] for n in names] == [[n] for n in names]
    restart, replica, spare, elastic = (rows[n] for n in names)
    # restart and hot spare load the same checkpoint and recompute the same steps; only activation differs
    assert restart["recovery_s"] - spare["recovery_s"] == pytest.approx(30.0 - 5.0)
    # the replica is read from memory instead of storage, and only the failed step is run again
    assert replica["breakdown"]["load_s"] < restart["breakdown"]["load_s"] / 10
    assert replica["steps_lost"] < restart["steps_lost"]
    # elastic restarts nothing: detection, re-link, the step again, and later the rejoin
    assert set(elastic["breakdown"]) == {"detect_s", "relink_s", "recompute_s", "rejoin_s"}
    assert elastic["recovery_s"] < replica["recovery_s"] < restart["recovery_s"]
    assert max(rows.values(), key=lambda r: r["goodput"])["strategy"] == "elastic"
    assert restart["goodput"] == min(r["goodput"] for r in rows.values())
    assert (tmp_path / "compare.png").stat().st_size > 10_000


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_step_retry_alone_runs_the_whole_step_again_without_a_restart(tmp_path: Path) -> None:
    result = run(load_scenario(SCENARIOS / "step_retry.yaml"), tmp_path / "step")
    assert (result.verdict, result.exit_code) == ("pass", 0), result.data["checks"]
    (rec,) = result.data["recoveries"]
    assert rec["strategy"] == "step_retry" and rec["fail_step"] == rec["resume_step"] == 8
    assert set(rec["breakdown"]) == {"detect_s", "hold_s", "interval_s", "recompute_s"}
    assert rec["breakdown"]["recompute_s"] > 0
    assert not events_of(result, "npu_replaced") and not events_of(result, "op_retry")
    assert not [e for e in events_of(result, "resume") if e["phase"] == "main"]
