"""Driving a run on a cluster: the ranks' start-up spec, Ray, the cluster, the controller.

:func:`drive` is the part of a run between its first events and its
conclusion: it starts (or joins) Ray and the cluster, checks the checkpoint
storage every node must share, and hands the cluster to the controller (a
fresh run's, or a resumed run's that takes over from its journal). Whatever
happens, the connections its listeners refused are journalled and the
cluster is stopped: on an error at once, else by the caller, beside its
report.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from testbed.actors.cluster import Cluster
from testbed.actors.head_watch import HeadWatch
from testbed.actors.session import RaySession
from testbed.actors.shared_storage import refuse_unless_shared, resolve, write_marker
from testbed.control.controller import Controller
from testbed.control.serve_run import serve
from testbed.core.errors import ScenarioError
from testbed.core.journal import Journal
from testbed.recovery.registry import strategy
from testbed.scenario.job_estimate import scenario_job
from testbed.scenario.model import Scenario
from testbed.train.rank_spec import RankSpec
from workloads import WORKLOADS


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


def drive(
    scenario: Scenario,
    journal: Journal,
    out_dir: Path,
    where: tuple[str | None, str | None],
    run_id: str,
    controller: Callable[..., Controller] = Controller,
) -> Callable[[], None]:
    """Start Ray (or join ``where``'s address) and the cluster, and drive the training and the serving
    of ``scenario`` with ``controller`` (a resumed run's takes over from its journal). ``where``: the
    Ray address and the checkpoint storage.

    Returns the run's ending: the cluster's stop, then Ray's when this run started it, for the caller
    to run while it writes the report (:func:`testbed.control.conclusion.conclude`), since the
    processes take a second or more to end. On an error the ending runs before the error goes on."""
    address, storage = where
    session = RaySession(address).__enter__()
    cluster: Cluster | None = None

    def ending() -> None:
        try:
            if cluster is not None:
                cluster.stop()
        finally:
            session.__exit__(None, None, None)

    try:
        # on a Ray that outlives this run (a test session's, a suite's), supernodes are kept for the next
        cluster = Cluster(rank_spec(scenario), pooled=not session.connected)
        cluster.head = HeadWatch.of_current_ray()
        try:
            _on_cluster(scenario, cluster, session, journal, out_dir, storage, run_id, controller)
        finally:
            cluster.head.stop()
            journal_refusals(cluster, journal)
    except BaseException:
        ending()
        raise
    return ending


def _on_cluster(
    scenario: Scenario,
    cluster: Cluster,
    session: RaySession,
    journal: Journal,
    out_dir: Path,
    storage: str | None,
    run_id: str,
    controller: Callable[..., Controller],
) -> None:
    """Start ``cluster`` and drive the run on it."""
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
        controller(scenario, cluster, journal, out_dir, ckpt_dir).run()
    if scenario.serves:  # alone, or beside the training just journalled
        serve(scenario, cluster, journal)


def journal_refusals(cluster: Cluster, journal: Journal) -> None:
    """A ``peer_refused`` event for each connection the run's listeners refused (none in a run that
    no stranger reached); a supernode that cannot answer any more is skipped, never fatal."""
    try:
        refused = cluster.refusals()
    except Exception:  # the run is ending on an error already: keep that one
        return
    for refusal in refused:
        journal.emit("peer_refused", **refusal)
