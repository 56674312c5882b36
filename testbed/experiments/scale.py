"""The scale benchmark: the quick-start failure at growing size, and what an NPU process costs.

The test job is the quick start's failure at N NPUs: an MLP in pure data
parallelism, 16 NPUs per supernode, 12 steps, a checkpoint every 5, rank 3
``SIGKILL``ed mid-allreduce at step 8 (or, with ``--lose supernode``, all the
NPUs of supernode 1), a restart, and every check including
the bit-for-bit comparison with the uninterrupted (reference) run. Each size
runs as its own ``testbed run`` process with its own private Ray; this
process samples the machine's memory meanwhile and, once the job trains,
takes a census of its NPU processes' PSS. From the journal it reads the wall
time of the start, of a step and of the recovery, and the journal's size.

``hosting`` compares the two ways an NPU can be hosted, side by side in one
run: a Ray actor per NPU (version 0.2) and a process forked by its
supernode's NPU host (now): PSS at rest, and start time (a whole cluster's
start per NPU, the NPU host's own start included; one more NPU on a warm
host; a Ray actor's creation to its first answer).

    python -m testbed.experiments.scale --sizes 8 32 64 128 --out scale.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

#: The test job, at ``{npus}`` NPUs in supernodes of ``{per}``.
JOB = """\
version: 1
name: scale-{npus}
seed: 7
cluster: {{preset: atlas-900-a3, supernodes: {supernodes}, npus_per_supernode: {per}}}
workload: {{name: mlp, steps: 12, parallel: {{dp: {npus}}}, hidden: 64, layers: 2}}
policy:
  checkpoint: {{every: 5}}
  recovery: {{strategy: restart, max_restarts: 2}}
faults:
  - {{kind: node_kill, target: {{{target}}}, at: {{step: 8, during: allreduce}}}}
expect: {{recovered: true, checkpoint_complete: true, matches_uninterrupted: true}}
"""

MIB = 2**20


#: What the test job loses at step 8: one NPU, or every NPU of a supernode.
TARGETS = {"rank": "rank: 3", "supernode": "supernode: 1"}


def job_text(npus: int, per: int = 16, lose: str = "rank") -> str:
    """The test job's scenario at ``npus`` NPUs (supernodes of ``per``, or one smaller one), losing
    rank 3 or (``lose="supernode"``) supernode 1 at step 8."""
    per = min(per, npus)
    return JOB.format(npus=npus, per=per, supernodes=npus // per, target=TARGETS[lose])


def used_bytes() -> int:
    """Memory in use on the machine now (total less available)."""
    vm = psutil.virtual_memory()
    return int(vm.total - vm.available)


def npu_census() -> dict[str, Any]:
    """PSS of every NPU process (the children of every NPU host) on this machine, at this moment."""
    pss: list[int] = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "testbed.actors.npu_host" not in cmd:
            continue
        for child in proc.children():
            try:
                pss.append(int(child.memory_full_info().pss))
            except psutil.Error:
                continue
    return {
        "npu_processes": len(pss),
        "pss_mib_median": statistics.median(pss) / MIB if pss else None,
        "pss_mib_total": sum(pss) / MIB,
    }


class _Sampler(threading.Thread):
    """Samples the machine's memory every 0.2 s; takes one NPU census once the journal has a step."""

    def __init__(self, journal: Path, census_after_step: int) -> None:
        super().__init__(daemon=True)
        self.journal = journal
        self.after = census_after_step
        self.base = used_bytes()
        self.peak = self.base
        self.census: dict[str, Any] | None = None
        self.stop = threading.Event()

    def _trained(self) -> bool:
        try:
            text = self.journal.read_text()
        except OSError:
            return False
        return text.count('"event": "step_end"') >= self.after

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, used_bytes())
            if self.census is None and self._trained():
                self.census = npu_census()


def _step_s(events: list[dict[str, Any]]) -> float | None:
    """A step's wall time in the main phase: each run of its steps with no other event between them
    (a checkpoint, a failure, a group's opening end one) took from the event before it to its last
    step's end; their sum over their steps. Steps trained in one call (a stretch) are journalled
    together when the call returns, so the wall gaps between steps say nothing of one step alone."""

    def main_step(e: dict[str, Any]) -> bool:
        return e.get("event") == "step_end" and e.get("phase") == "main"

    runs: list[tuple[float, list[float]]] = []  # (the wall time before a run, its steps' wall times)
    for prev, e in itertools.pairwise(events):
        if main_step(e) and main_step(prev) and runs:
            runs[-1][1].append(e["wall_s"])
        elif main_step(e):
            runs.append((prev["wall_s"], [e["wall_s"]]))
    steps = sum(len(walls) for _, walls in runs)
    return sum(walls[-1] - t0 for t0, walls in runs) / steps if steps else None


def _walls(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Wall seconds of the start, a typical step and the recovery, from a journal."""

    def first(name: str, **match: Any) -> dict[str, Any] | None:
        return next(
            (e for e in events if e.get("event") == name and all(e.get(k) == v for k, v in match.items())),
            None,
        )

    start = first("run_start")
    started = first("cluster_started")
    failed, recovered = first("failure_detected"), first("recovery_complete")
    end = first("run_end")
    step_s = _step_s(events)
    return {
        "start_s": round(started["wall_s"] - start["wall_s"], 2) if start and started else None,
        "step_s": round(step_s, 3) if step_s is not None else None,
        "recovery_s": round(recovered["wall_s"] - failed["wall_s"], 2) if failed and recovered else None,
        "total_s": end.get("wall_total_s") if end else None,
    }


def run_job(npus: int, per: int = 16, workdir: Path | None = None, lose: str = "rank") -> dict[str, Any]:
    """Run the test job at ``npus`` NPUs in a ``testbed run`` process of its own, in ``workdir`` (None:
    a folder removed after); its costs."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="tb-scale-") as scratch:
            return run_job(npus, per, Path(scratch), lose)
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    scenario = root / f"scale-{npus}.yaml"
    scenario.write_text(job_text(npus, per, lose))
    row = measure(scenario, root / f"run-{npus}")
    return {"npus": npus, "supernodes": max(1, npus // per), "lost": lose, **row}


def multinode_job(npus: int, nodes: int, per: int = 16) -> dict[str, Any]:
    """The test job on a Ray cluster of ``nodes`` worker nodes started on this machine (each on an
    address of its own, 127.0.0.2, ...; a head without CPUs), one supernode per node."""
    from testbed.actors.loopback import keep_ray_on_loopback

    keep_ray_on_loopback()
    from ray.cluster_utils import Cluster

    scratch = tempfile.TemporaryDirectory(prefix="tb-scale-")  # the run's folder, removed after
    root = Path(scratch.name)
    scenario = root / f"scale-{npus}.yaml"
    scenario.write_text(job_text(npus, per))
    common = {"object_store_memory": 80 * 2**20}
    head = {"num_cpus": 0, "include_dashboard": False, "node_ip_address": "127.0.0.1", **common}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for i in range(nodes):
            cluster.add_node(num_cpus=1, node_ip_address=f"127.0.0.{i + 2}", object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()
        row = measure(scenario, root / "run", ["--address", cluster.address])
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
        scratch.cleanup()
    return {"npus": npus, "supernodes": max(1, npus // per), "ray_nodes": nodes, **row}


def measure(scenario: Path, out: Path, extra: list[str] | None = None) -> dict[str, Any]:
    """Run ``scenario`` with ``testbed run`` in a process of its own, into ``out``; its costs."""
    sampler = _Sampler(out / "journal.jsonl", census_after_step=3)
    sampler.start()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "run", str(scenario), "--out", str(out), *(extra or [])],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    journal = out / "journal.jsonl"
    events = [json.loads(x) for x in journal.read_text().splitlines()] if journal.exists() else []
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    return {
        "exit": proc.returncode,
        "verdict": report.get("verdict"),
        "wall_s": round(wall, 1),
        **_walls(events),
        "peak_used_gib": round(sampler.peak / 2**30, 2),
        "peak_added_gib": round((sampler.peak - sampler.base) / 2**30, 2),
        **(sampler.census or {}),
        "journal_bytes": journal.stat().st_size if journal.exists() else None,
        "journal_events": len(events),
    }


def hosting(n: int = 16, actors: int = 4) -> dict[str, Any]:
    """Start time and PSS at rest of an NPU hosted both ways, side by side in one Ray session."""
    from testbed.actors.loopback import keep_ray_on_loopback

    keep_ray_on_loopback()  # before ray is imported
    import ray

    from testbed.actors.cluster import Cluster, _actor_class
    from testbed.actors.session import RaySession
    from testbed.control.runner import rank_spec
    from testbed.scenario.parse import parse_scenario
    from testbed.train.npu import NPU

    spec = rank_spec(parse_scenario(job_text(n, n), "hosting.yaml"))
    out: dict[str, Any] = {"n": n}
    with RaySession():
        cluster = Cluster(spec)
        try:
            t0 = time.monotonic()
            cluster.start()
            out["forked_start_s_each"] = round((time.monotonic() - t0) / n, 4)
            cluster.call_ok("open_group", 0, cluster.addresses, 0.0)
            cluster.call_ok("train_step", 1)
            time.sleep(1.0)
            pss = [psutil.Process(p).memory_full_info().pss / MIB for p in cluster.pids.values()]
            out["forked_pss_mib"] = round(statistics.median(pss), 1)
            spawns, ready = [], []  # one more NPU on a warm host: with the Ray call, and fork to ready
            for rank in range(4):
                cluster.kill(rank, 0.0, 0, "boundary")
                t0 = time.monotonic()
                cluster.replace(rank)
                spawns.append(time.monotonic() - t0)
                ready.append(cluster.start_s[rank])
            out["forked_spawn_s"] = round(statistics.median(spawns), 4)
            out["forked_ready_s"] = round(statistics.median(ready), 4)
        finally:
            cluster.stop()
        cls = _actor_class(NPU)
        t0 = time.monotonic()
        handles = [cls.remote(r, spec) for r in range(actors)]
        pids = ray.get([h.pid.remote() for h in handles], timeout=120)
        out["ray_actor_start_s_each"] = round((time.monotonic() - t0) / actors, 4)
        time.sleep(1.0)
        out["ray_actor_pss_mib"] = round(
            statistics.median(psutil.Process(p).memory_full_info().pss / MIB for p in pids), 1
        )
        for h in handles:
            ray.kill(h)
    return out


def per_npu_cost(result: dict[str, Any]) -> dict[str, float]:
    """From the two largest single-host runs: system memory per added NPU (its supernode's share
    included) and CPU seconds per rank-step (wall per step x cores / NPUs)."""
    jobs = sorted((j for j in result["jobs"] if j.get("verdict") == "pass"), key=lambda j: j["npus"])
    small, big = jobs[-2], jobs[-1]
    mem = (big["peak_added_gib"] - small["peak_added_gib"]) * 2**30 / (big["npus"] - small["npus"])
    cpu = big["step_s"] * int(result["cpus"]) / big["npus"]
    return {"bytes_per_npu": mem, "cpu_s_per_rank_step": cpu, "from_npus": big["npus"]}


def project(result: dict[str, Any], npus: int, node_cores: int, node_gib: float) -> dict[str, Any]:
    """What a rehearsal of ``npus`` NPUs needs in Ray nodes of ``node_cores`` cores and ``node_gib``
    GiB, from the measured costs: nodes to hold the processes (at 80 % of memory, less 1 GiB for Ray
    on each node), the wall time of a step spread over them, and the nodes a 1 s step needs."""
    cost = per_npu_cost(result)
    usable = (0.8 * node_gib - 1.0) * 2**30
    nodes = max(1, math.ceil(npus * cost["bytes_per_npu"] / usable))
    cpu_s = cost["cpu_s_per_rank_step"] * npus
    return {
        "npus": npus,
        "node": f"{node_cores} cores, {node_gib:g} GiB",
        "nodes": nodes,
        "step_s": cpu_s / (nodes * node_cores),
        "nodes_for_1s_step": max(nodes, math.ceil(cpu_s / node_cores)),
    }


def table(result: dict[str, Any]) -> str:
    """The measured rows as a markdown table."""
    head = (
        "| NPUs | supernodes | verdict | wall s | start s | step s | recovery s | peak memory GiB "
        "| NPU PSS MiB (median) | NPU PSS GiB (all) | journal MB |\n|" + "---|" * 11
    )
    rows = [
        f"| {j['npus']} | {j['supernodes']} | {j['verdict']} | {j['wall_s']} | {j['start_s']} "
        f"| {j['step_s']} | {j['recovery_s']} | {j['peak_added_gib']} "
        f"| {round(j.get('pss_mib_median') or 0, 1)} "
        f"| {round((j.get('pss_mib_total') or 0) / 1024, 2)} | {round((j['journal_bytes'] or 0) / 1e6, 1)} |"
        for j in result["jobs"]
    ]
    return "\n".join([head, *rows])


def figure(result: dict[str, Any], path: Path) -> None:
    """Wall time and peak memory against NPUs, on log-log axes, with an N^1 guide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = [j for j in result["jobs"] if j.get("verdict") == "pass"]
    n = [j["npus"] for j in jobs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("wall_s", "whole run"), ("start_s", "start"), ("recovery_s", "recovery")):
        a.loglog(n, [j[key] for j in jobs], "o-", label=label)
    a.loglog(n, [jobs[0]["wall_s"] * x / n[0] for x in n], ":", color="grey", label="∝ N")
    a.set(xlabel="NPUs", ylabel="wall seconds", title="test job: wall time")
    a.legend()
    b.loglog(n, [j["peak_added_gib"] for j in jobs], "o-", label="peak system memory")
    b.loglog(n, [(j.get("pss_mib_total") or 0) / 1024 for j in jobs], "s-", label="NPU processes (PSS)")
    b.set(xlabel="NPUs", ylabel="GiB", title="memory")
    b.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m testbed.experiments.scale --sizes 8 32 --out FILE``."""
    p = argparse.ArgumentParser(
        prog="python -m testbed.experiments.scale", description=__doc__.split("\n")[0]
    )
    p.add_argument("--sizes", type=int, nargs="*", default=[8, 32, 64, 128, 256, 384], help="NPU counts")
    p.add_argument("--per", type=int, default=16, help="NPUs per supernode (default 16)")
    p.add_argument("--hosting", action="store_true", help="also compare the two ways to host an NPU")
    p.add_argument(
        "--lose", choices=sorted(TARGETS), default="rank", help="what dies at step 8 (default: rank 3)"
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="also run the largest size on a local Ray cluster of this many nodes",
    )
    p.add_argument("--out", required=True, help="result JSON file")
    p.add_argument("--figure", help="also draw the figure into this PNG")
    p.add_argument("--scenario", help="measure this scenario instead (e.g. scenarios/cloudmatrix384.yaml)")
    p.add_argument("--from-json", action="store_true", help="run nothing: read --out, print the table")
    args = p.parse_args(argv)
    if args.from_json:
        measured = json.loads(Path(args.out).read_text())
        print(table(measured))
        for npus in (4096, 16384):
            for cores, gib in ((32, 128.0), (64, 256.0)):
                print(json.dumps(project(measured, npus, cores, gib)))
        if args.figure:
            figure(measured, Path(args.figure))
        return 0
    if args.scenario:
        with tempfile.TemporaryDirectory(prefix="tb-scale-") as scratch:
            row = measure(Path(args.scenario), Path(scratch) / "run")
        Path(args.out).write_text(json.dumps(row, indent=1))
        print(json.dumps(row))
        return 0 if row["exit"] == 0 else 1
    result: dict[str, Any] = {"cpus": os.cpu_count(), "jobs": []}
    if args.hosting or args.sizes == []:
        result["hosting"] = hosting()
        print(json.dumps(result["hosting"]), flush=True)
    for n in args.sizes:
        row = run_job(n, args.per, lose=args.lose)
        result["jobs"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.nodes:
        result["multinode"] = multinode_job(max(args.sizes), args.nodes, args.per)
        print(json.dumps(result["multinode"]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    if args.figure:
        figure(result, Path(args.figure))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
