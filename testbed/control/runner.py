"""One scenario run from start to verdict: Ray, cluster, controller, checks, report.

Whatever happens mid-run (a crash, a safeguard, Ctrl-C), the journal keeps
what happened and ``report.json`` is written with the verdict it came to.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from faults.effects import fault_effects
from testbed.actors.cluster import Cluster
from testbed.actors.session import RaySession
from testbed.actors.shared_storage import refuse_unless_shared, resolve, write_marker
from testbed.control.controller import Controller
from testbed.control.serve_run import serve
from testbed.core.errors import (
    CollectiveTimeout,
    DeviceFault,
    HarnessHang,
    LinkSetupError,
    LinkSetupTimeout,
    PeerLost,
    RecoveryFailed,
    SafeguardTripped,
    ScenarioError,
    UnsupportedOperator,
)
from testbed.core.journal import Journal, read_journal
from testbed.recovery.registry import strategy
from testbed.report.against_estimate import against_estimate
from testbed.report.checks import CheckResult, declared, run_checks, verdict
from testbed.report.fault_rows import fault_rows
from testbed.report.goodput import goodput
from testbed.report.hotspot import diagnose
from testbed.report.run_report import Report
from testbed.report.serving_report import serving_report
from testbed.scenario.hostfit import refuse_unless_local_fits
from testbed.scenario.job_estimate import scenario_job
from testbed.scenario.model import Scenario
from testbed.scenario.overrides import replay_command
from testbed.scenario.plan import plan_warnings
from testbed.topology.layout import split_tp_groups
from testbed.train.rank_spec import RankSpec
from workloads import WORKLOADS

EXIT_PASS, EXIT_FAIL, EXIT_UNKNOWN, EXIT_ABORTED = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_INVALID, EXIT_CRASH = 130, 254, 255

#: Failures of the modelled job (not of the testbed) that no recovery handled.
MODELLED_FAILURES = (
    LinkSetupTimeout,
    LinkSetupError,
    CollectiveTimeout,
    PeerLost,
    UnsupportedOperator,
    DeviceFault,
)


def rank_spec(scenario: Scenario) -> RankSpec:
    """The start-up spec every NPU of ``scenario`` receives."""
    w = scenario.workload
    job = scenario_job(scenario)
    return RankSpec(
        topology=scenario.cluster.topology(),
        seed=scenario.seed,
        workload_factory=WORKLOADS[w.name].factory,
        workload_options=dict(w.options),
        connect_timeout_s=scenario.policy.timeouts.connect_s,
        exec_timeout_s=scenario.policy.timeouts.exec_s,
        algorithm=scenario.policy.collectives.algorithm,
        warmup=scenario.policy.collectives.warmup,
        device_bytes=scenario.cluster.device_bytes(),
        memory_policy=scenario.policy.memory.on_oom,
        pool_share=scenario.policy.memory.pool_share,
        layout=w.layout(),
        compute_scale=w.compute_scale,
        state_scale=w.state_scale,
        job=job,
        setup_scale=scenario.cluster.setup_scale(),
        step_snapshot=strategy(scenario.policy.recovery.strategy).step_snapshot
        or _replays(scenario)
        or aborts_on_notice(scenario),
        payload_checksums=scenario.policy.integrity is not None and scenario.policy.integrity.checksums,
    )


def aborts_on_notice(scenario: Scenario) -> bool:
    """Whether a preemption's notice aborts the step in flight (which needs each step's snapshot)."""
    preemption = scenario.policy.preemption
    return preemption is not None and preemption.on_notice == "abort"


def _replays(scenario: Scenario) -> bool:
    """Whether the integrity policy replays suspect steps (which needs each step's snapshot)."""
    integrity = scenario.policy.integrity
    return integrity is not None and integrity.replay is not None


def prepare_out_dir(out_dir: Path) -> None:
    """Create ``out_dir``; refuse one that already holds a run."""
    if (out_dir / "journal.jsonl").exists():
        msg = (
            f"{out_dir} already holds a run (journal.jsonl); pass another --out, or remove that "
            "directory first"
        )
        raise ScenarioError(msg)
    out_dir.mkdir(parents=True, exist_ok=True)


def _interrupt_once(signum: int, _frame: Any) -> None:
    """First Ctrl-C (or SIGTERM) interrupts the run; later ones are ignored so clean-up can finish."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, _interrupt_once)
    signal.signal(signal.SIGTERM, _interrupt_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])


def _checkpoint_dir(
    cluster: Cluster, journal: Journal, out_dir: Path, storage: str | None, run_id: str
) -> Path | None:
    """Where checkpoints go: a folder of this run under ``storage``, else the run's own folder. On a
    multi-node cluster, or with ``storage``, every supernode must see the storage the driver writes."""
    if storage is None and cluster.placement is None:
        return None
    where = storage if storage is not None else str(out_dir)
    token = write_marker(where)
    seen = cluster.storage_seen(where)
    refuse_unless_shared(where, token, seen)
    ckpt_dir = (
        out_dir / "checkpoints" if storage is None else resolve(storage) / f"run-{run_id}" / "checkpoints"
    )
    journal.emit("storage_shared", storage=where, checkpoints=str(ckpt_dir), supernodes=len(seen))
    return ckpt_dir


def _drive(
    scenario: Scenario, journal: Journal, out_dir: Path, where: tuple[str | None, str | None], run_id: str
) -> None:
    address, storage = where
    with RaySession(address) as session:
        cluster = Cluster(rank_spec(scenario))
        try:
            cluster.start()
            ckpt_dir = _checkpoint_dir(cluster, journal, out_dir, storage, run_id)
            lost_nodes = [f.index for f in scenario.faults if f.params.get("scope") == "ray_node"]
            if lost_nodes and cluster.placement is None:
                msg = (
                    f"faults[{lost_nodes[0]}]: scope: ray_node needs a Ray cluster of several nodes, each "
                    "supernode on one; this one has a single node. Run with --address of a multi-node "
                    "cluster, or drop 'scope: ray_node' to kill the supernode's processes instead"
                )
                raise ScenarioError(msg)
            recovery = scenario.policy.recovery
            spares = {}
            if strategy(recovery.strategy).hot_spares and recovery.spares_per_supernode:
                spares = cluster.start_spares(recovery.spares_per_supernode)
            journal.emit(
                "cluster_started",
                world=cluster.topology.world,
                node_ip=session.node_ip,
                pids={str(r): p for r, p in cluster.pids.items()},
                spares={str(n): p for n, p in spares.items()},
                ray_started=session.started,
                nodes={str(r): n for r, n in cluster.nodes.items()},
                hosts={str(r): a[0] for r, a in cluster.addresses.items()},
                placement=cluster.placement.strategy if cluster.placement else None,
            )
            if scenario.trains:
                Controller(scenario, cluster, journal, out_dir, ckpt_dir).run()
            if scenario.serves:  # alone, or beside the training just journalled
                serve(scenario, cluster, journal)
        finally:
            journal_refusals(cluster, journal)
            cluster.stop()


def journal_refusals(cluster: Cluster, journal: Journal) -> None:
    """A ``peer_refused`` event for each connection the run's listeners refused (none in a run that
    no stranger reached); a supernode that cannot answer any more is skipped, never fatal."""
    try:
        refused = cluster.refusals()
    except Exception:  # the run is ending on an error already: keep that one
        return
    for refusal in refused:
        journal.emit("peer_refused", **refusal)


def journal_placement(journal: Journal, scenario: Scenario) -> None:
    """A ``placement`` event naming the TP groups the placement split across supernodes, if any: what
    the hotspot diagnosis needs to tell a placement's slow links from a fault's."""
    topology = scenario.cluster.topology()
    split = split_tp_groups(scenario.workload.layout(), topology)
    if split:
        journal.emit(
            "placement",
            split_tp_groups=split,
            supernode_of={str(r): topology.supernode_of(r) for group in split for r in group},
        )


def run(
    scenario: Scenario,
    out_dir: str | Path,
    address: str | None = None,
    listener: Callable[[dict[str, Any]], None] | None = None,
    storage: str | None = None,
) -> Report:
    """Run ``scenario`` (its seed already chosen: :meth:`Scenario.with_seed` picks another) and write
    its journal and report under ``out_dir``, which must be new or empty.

    Without ``address`` a private Ray instance on 127.0.0.1 is started and ended with the run; with
    one, that cluster is used. ``listener`` (a progress display, say) is told of every journal event.
    ``storage`` is where checkpoints go (a folder per run under it; default: ``out_dir``): on a
    multi-node cluster, a path every node shares, which is checked before training starts.
    A failed run still returns its :class:`Report` (see ``verdict`` and ``exit_code``).
    """
    out_dir = Path(out_dir)
    if address is None:
        refuse_unless_local_fits(scenario.local_estimate(), scenario.where("cluster"))
    prepare_out_dir(out_dir)
    run_id = uuid.uuid4().hex[:12]
    journal = Journal(out_dir / "journal.jsonl", run_id, listener)
    wall0 = time.monotonic()
    journal.emit(
        "run_start",
        scenario=scenario.name,
        file=scenario.file,
        **({"overrides": list(scenario.overrides)} if scenario.overrides else {}),
        seed=scenario.seed,
        scenario_sha256=scenario.digest(),
        world=scenario.cluster.topology().world,
        timeouts={"connect_s": scenario.policy.timeouts.connect_s, "exec_s": scenario.policy.timeouts.exec_s},
    )
    for warning in (*scenario.warnings, *plan_warnings(scenario)):
        journal.emit("warning", message=warning)
    journal_placement(journal, scenario)
    w = scenario.workload
    info = WORKLOADS[w.name]
    journal.emit(
        "workload",
        name=w.name,
        steps=w.steps,
        layout={"dp": w.dp, "tp": w.tp, "pp": w.pp, "ep": w.ep},
        components=list(info.factory(w.options, scenario.seed, 0, w.layout()).components),
        rng_per_rank=info.rng_per_rank,
        include=list(scenario.policy.checkpoint.include),
    )
    outcome, code, error = "", EXIT_PASS, None
    try:
        with _interruptible():
            _drive(scenario, journal, out_dir, (address, storage), run_id)
    except MODELLED_FAILURES as exc:  # the modelled job failed for good: the checks judge it
        journal.emit(
            "job_failed",
            error_type=type(exc).__name__,
            error=str(exc),
            **{k: v for k, v in exc.fields.items() if isinstance(v, (int, float, str, list))},
        )
    except KeyboardInterrupt:
        outcome, code, error = "interrupted", EXIT_INTERRUPTED, "interrupted by the user (Ctrl-C)"
    except ScenarioError as exc:  # valid on paper, not on this Ray cluster
        outcome, code, error = "invalid", EXIT_INVALID, str(exc)
    except (HarnessHang, RecoveryFailed, SafeguardTripped) as exc:
        outcome, code, error = "aborted", EXIT_ABORTED, f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        outcome, code, error = "crash", EXIT_CRASH, f"{type(exc).__name__}: {exc}"
        journal.emit("traceback", text=traceback.format_exc())
    if error:
        journal.emit("run_error", outcome=outcome, error=error)
    effects = fault_effects(journal.events)
    if effects:
        journal.emit("fault_effects", effects={k: e.as_dict() for k, e in effects.items()})
    journal.emit("run_end", seed=scenario.seed, wall_total_s=round(time.monotonic() - wall0, 3))
    journal.close()
    events = read_journal(out_dir / "journal.jsonl")
    results = run_checks(events, scenario.expect)
    if not outcome:
        outcome, code = verdict(results)
    report = build_report(scenario, events, results, outcome, code, error, out_dir)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True, default=str))
    write_outputs(report, events, out_dir)
    return Report(outcome, code, out_dir, report)


def write_outputs(report: dict[str, Any], events: list[dict[str, Any]], out_dir: Path) -> None:
    """Beside the report: ``junit.xml`` (a test case per check), ``timeline.png`` and, for a
    serving run, ``serving.png``."""
    from testbed.report.junit import write_junit
    from testbed.report.serving_plot import serving_figure
    from testbed.report.timeline_plot import timeline_figure

    write_junit(report, out_dir / "junit.xml")
    title = f"{report['scenario']} (seed {report['seed']}): {report['verdict']}"
    timeline_figure(events, out_dir / "timeline.png", title)
    serving_figure(events, out_dir / "serving.png", title)


def step_time(steps: list[dict[str, Any]]) -> dict[str, float] | None:
    """Median over steps of the slowest rank's compute, comm wait and bubble; FLOPs of a step in all.

    The median keeps the first step's link set-up out of the typical step.
    """
    if not steps or "bubble_s" not in steps[0]:
        return None
    out = {k: statistics.median(max(e[k]) for e in steps) for k in ("compute_s", "comm_wait_s", "bubble_s")}
    out["flops"] = statistics.median(sum(e["flops"]) for e in steps)
    return out


def memory_trend(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Device memory by step, in step order, each figure the maximum over the ranks and over every
    run of that step (a step recomputed after a recovery counts once)."""
    by_step: dict[int, dict[str, Any]] = {}
    for e in steps:
        if "memory" not in e:
            continue
        now = {k: max(e["memory"][k]) for k in ("fragmentation", "allocated", "reserved")}
        seen = by_step.setdefault(int(e["step"]), {"step": int(e["step"]), **now})
        for k, v in now.items():
            seen[k] = max(seen[k], v)
    return [by_step[step] for step in sorted(by_step)]


def build_report(
    scenario: Scenario,
    events: list[dict[str, Any]],
    results: list[CheckResult],
    outcome: str,
    code: int,
    error: str | None,
    out_dir: Path,
) -> dict[str, Any]:
    """The report: verdict, seed, steps, faults, recoveries and checks, from the journal."""
    main_steps = [e for e in events if e.get("event") == "step_end" and e.get("phase") == "main"]
    end = next((e for e in events if e.get("event") == "phase_end" and e.get("phase") == "main"), None)
    return {
        "scenario": scenario.name,
        "file": scenario.file,
        "seed": scenario.seed,
        "replay": replay_command(scenario),
        "verdict": outcome,
        "exit_code": code,
        "error": error,
        "steps": {
            "planned": scenario.workload.steps,
            "completed": max((e["step"] for e in main_steps), default=0),
            "run": len(main_steps),
        },
        "loss": {
            "first": main_steps[0]["loss"] if main_steps else None,
            "last": main_steps[-1]["loss"] if main_steps else None,
        },
        "virtual_time_s": end["t"] if end else None,
        "layout": scenario.workload.layout().describe(),
        "warnings": [e["message"] for e in events if e.get("event") == "warning"],
        "refused_peers": [
            {k: e.get(k) for k in ("listener", "peer", "reason")}
            for e in events
            if e.get("event") == "peer_refused"
        ],
        "step_time": step_time(main_steps),
        "goodput": goodput(events),
        "against_estimate": against_estimate(events),
        "hotspot": diagnose(events).as_dict(),
        "learned_timeouts": next(
            (
                {k: v for k, v in e.items() if k in ("setup", "step", "checkpoint")}
                for e in reversed(events)
                if e.get("event") == "timeouts_learned"
            ),
            None,
        ),
        "final_digest": end["digest"] if end else None,
        "plan_sha256": next((e.get("plan_sha256") for e in events if e.get("event") == "plan"), None),
        "faults": [e for e in events if e.get("event") == "fault_injected"],
        "fault_table": fault_rows(events),
        "failures": [e for e in events if e.get("event") == "failure_detected"],
        "recoveries": [e for e in events if e.get("event") == "recovery_complete"],
        "rejoins": [e for e in events if e.get("event") == "elastic_rejoin"],
        "checks": [r.as_dict() for r in results],
        "declared": declared(scenario.expect, outcome, [r.as_dict() for r in results]),
        "memory_events": [
            {"step": e["step"], "rank": int(r), **ev}
            for e in main_steps
            for r, evs in e.get("memory_events", {}).items()
            for ev in evs
        ],
        "memory_trend": memory_trend(main_steps),
        "serving": serving_report(events),
        "journal": str(out_dir / "journal.jsonl"),
        "wall_s": next((e["wall_total_s"] for e in events if e.get("event") == "run_end"), None),
    }
