"""One scenario run from start to verdict: Ray, cluster, controller, checks, report.

Whatever happens mid-run (a crash, a safeguard, Ctrl-C), the journal keeps
what happened and ``report.json`` is written with the verdict it came to.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.control.conclusion import EXIT_CRASH as EXIT_CRASH
from testbed.control.conclusion import EXIT_INVALID as EXIT_INVALID
from testbed.control.conclusion import conclude
from testbed.control.conclusion import write_outputs as write_outputs
from testbed.control.controller_loss import become_host
from testbed.control.drive import drive
from testbed.control.drive import rank_spec as rank_spec
from testbed.control.hosted import hosted_run, needs_host
from testbed.control.resume import keep_scenario, version
from testbed.core.errors import ScenarioError
from testbed.core.journal import Journal
from testbed.report.run_report import Report
from testbed.scenario.hostfit import refuse_unless_local_fits
from testbed.scenario.model import Scenario
from testbed.scenario.plan import plan_warnings
from testbed.topology.layout import split_tp_groups
from workloads import WORKLOADS


def prepare_out_dir(out_dir: Path) -> None:
    """Create ``out_dir``; refuse one that already holds a run."""
    if (out_dir / "journal.jsonl").exists():
        msg = (
            f"{out_dir} already holds a run (journal.jsonl); pass another --out, or remove that "
            "directory first"
        )
        raise ScenarioError(msg)
    out_dir.mkdir(parents=True, exist_ok=True)


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
    if needs_host(scenario):  # its controller is to be killed: not this process
        return hosted_run(scenario, out_dir, _as_host, address, storage)
    keep_scenario(scenario, out_dir)
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
        testbed_version=version(),
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
    where = (address, storage)
    body = lambda: drive(scenario, journal, out_dir, where, run_id)  # noqa: E731
    return conclude(scenario, journal, out_dir, wall0, body)


def _as_host(scenario: Scenario, out_dir: str, address: str | None, storage: str | None) -> None:
    """In the process hosting a run whose controller may be killed: run it there."""
    become_host()
    run(scenario, out_dir, address, storage=storage)
