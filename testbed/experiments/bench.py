"""Allreduce benchmark of the testbed's data plane, in the peers' result format.

``python -m testbed.experiments.bench --n 4 --out ours_n4.json`` starts a private Ray on
127.0.0.1, one actor per rank, and times float32 SUM allreduces of 4 KiB to
32 MiB with the conventions of ``shared/bench/peers`` (rank r holds r+1,
3 warm-up iterations, then 50/30/15/10 timed ones; per-iteration latency is
the maximum over ranks after a barrier; the first and last results are
checked). Two modes, as the peers report Ray: ``in_actor`` (each actor loops)
and ``driver`` (one Ray call per rank per allreduce). It also records the
start-up time and each rank's memory (RSS and PSS) at rest, and, with
``--npu-memory``, the PSS of real NPU actors of the quick-start scenario.
The peers' ``make_table.py --extra`` prints the file beside torch gloo,
ray.util.collective and OpenMPI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from testbed.actors.loopback import keep_ray_on_loopback
from testbed.collectives import Communicator, Endpoint
from testbed.core.secret import RunSecret
from testbed.fabric.clock import RankClock
from testbed.fabric.dataplane import DataPlane
from testbed.topology.presets import PRESETS, Topology

KiB, MiB = 1024, 1024 * 1024


def sizes() -> list[int]:
    """Payload sizes in bytes (``PB_SIZES`` overrides, as for the peers)."""
    env = os.environ.get("PB_SIZES")
    return [int(x) for x in env.split(",")] if env else [4 * KiB, 256 * KiB, 4 * MiB, 32 * MiB]


def iters_for(nbytes: int) -> int:
    """Timed iterations per size (the peers' ``iters_for``, with ``PB_ITER_SCALE``)."""
    scale = float(os.environ.get("PB_ITER_SCALE", "1"))
    base = 50 if nbytes <= 4 * KiB else 30 if nbytes <= 256 * KiB else 15 if nbytes <= 4 * MiB else 10
    return max(10, int(base * scale)) if scale >= 1 else max(2, int(base * scale))


def memory_mib(pid: int | None = None) -> dict[str, float]:
    """RSS and PSS of a process, MiB."""
    import psutil

    info = psutil.Process(pid or os.getpid()).memory_full_info()
    return {"rss": info.rss / MiB, "pss": getattr(info, "pss", info.rss) / MiB}


class BenchRank:
    """One rank of the benchmark: a data plane, an endpoint, a communicator."""

    def __init__(self, rank: int, n: int, socket_dir: str, secret: RunSecret) -> None:
        self.rank, self.n = rank, n
        self.plane = DataPlane(rank, secret, socket_dir=socket_dir, world=n)
        topo = Topology(PRESETS["atlas-900-a3"], 1, n)
        self.ep = Endpoint(rank, self.plane, RankClock(), topo, seed=0)
        self.comm: Communicator | None = None

    def address(self) -> tuple[str, int, str, str, str]:
        """Where peers connect."""
        return self.plane.address

    def connect(self, addresses: dict[int, tuple[Any, ...]]) -> dict[str, float]:
        """Open the group, pass one barrier; returns this rank's memory at rest."""
        self.ep.new_epoch(0, {int(k): tuple(v) for k, v in addresses.items()})
        self.comm = Communicator(self.ep, "bench", list(range(self.n)))
        self.comm.barrier()
        return memory_mib()

    def _once(self, src: np.ndarray, algo: str) -> tuple[float, bool]:
        assert self.comm is not None
        buf = src.copy()
        self.comm.barrier()
        t0 = time.perf_counter()
        out = self.comm.allreduce(buf, algo=algo, out=buf)  # in place, as the peers' allreduce
        dt = time.perf_counter() - t0
        return dt, bool(np.all(out == self.n * (self.n + 1) / 2))

    def loop(self, nbytes: int, iters: int, warmup: int, algo: str) -> dict[str, Any]:
        """In-actor mode: warm-up, then ``iters`` timed allreduces; the first and last are checked."""
        src = np.full(nbytes // 4, self.rank + 1, dtype=np.float32)
        times, ok = [], True
        for i in range(warmup + iters):
            dt, good = self._once(src, algo)
            if i >= warmup:
                times.append(dt)
                if i in (warmup, warmup + iters - 1):
                    ok = ok and good
        return {"times": times, "ok": ok, "algorithm": self.ep.algorithms_run[-1]}

    def one(self, nbytes: int, algo: str) -> bool:
        """Driver mode: one allreduce per call."""
        src = np.full(nbytes // 4, self.rank + 1, dtype=np.float32)
        assert self.comm is not None
        buf = src.copy()
        out = self.comm.allreduce(buf, algo=algo, out=buf)
        return bool(np.all(out == self.n * (self.n + 1) / 2))


def _summary(times: list[float], ok: bool, nbytes: int, n: int) -> dict[str, Any]:
    med = statistics.median(times)
    algbw = nbytes / med / 1e9
    return {
        "times_s": times,
        "median_s": med,
        "ok": ok,
        "iters": len(times),
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * 2 * (n - 1) / n,
    }


def run(n: int, algo: str, label: str, warmup: int) -> dict[str, Any]:
    """The benchmark for ``n`` ranks; returns the result object in the peers' format."""
    keep_ray_on_loopback()
    import ray

    from testbed.actors.session import RaySession

    t_launch = time.perf_counter()
    socket_dir = tempfile.mkdtemp(prefix="tb-bench-", dir="/tmp")
    with RaySession():
        t_ray = time.perf_counter()
        actor: Any = ray.remote(num_cpus=0)(BenchRank)
        secret = RunSecret.new()  # the benchmark's links authenticate as a run's do
        ranks: list[Any] = [actor.remote(r, n, socket_dir, secret) for r in range(n)]
        addrs = dict(enumerate(ray.get([a.address.remote() for a in ranks], timeout=120)))
        mem = ray.get([a.connect.remote(addrs) for a in ranks], timeout=120)
        startup = time.perf_counter() - t_launch
        in_actor: dict[str, Any] = {}
        driver: dict[str, Any] = {}
        algorithms = {}
        for nbytes in sizes():
            iters = iters_for(nbytes)
            per_rank = ray.get([a.loop.remote(nbytes, iters, warmup, algo) for a in ranks], timeout=600)
            times = [max(r["times"][i] for r in per_rank) for i in range(iters)]
            in_actor[str(nbytes)] = _summary(times, all(r["ok"] for r in per_rank), nbytes, n)
            algorithms[str(nbytes)] = per_rank[0]["algorithm"]
            d_times, d_ok = [], True
            for i in range(warmup + iters):
                t0 = time.perf_counter()
                oks = ray.get([a.one.remote(nbytes, algo) for a in ranks], timeout=600)
                if i >= warmup:
                    d_times.append(time.perf_counter() - t0)
                    d_ok = d_ok and all(oks)
            driver[str(nbytes)] = _summary(d_times, d_ok, nbytes, n)
        for a in ranks:
            ray.kill(a)
    shutil.rmtree(socket_dir, ignore_errors=True)
    return {
        "label": label,
        "peer": "testbed",
        "n": n,
        "sizes_in_actor": in_actor,
        "sizes_driver": driver,
        "algorithms": algorithms,
        "startup_s": startup,
        "startup_breakdown": {"group_ready_after_ray_up_s": startup - (t_ray - t_launch)},
        "rss_ready_mib": [m["rss"] for m in mem],
        "pss_ready_mib": [m["pss"] for m in mem],
    }


def npu_memory(scenario_path: str) -> dict[str, Any]:
    """PSS and RSS of every NPU actor of a scenario's cluster, at rest after its group opened."""
    from testbed.actors.cluster import Cluster
    from testbed.actors.session import RaySession
    from testbed.control.runner import rank_spec
    from testbed.scenario.parse import load_scenario

    scenario = load_scenario(scenario_path)
    with RaySession():
        cluster = Cluster(rank_spec(scenario))
        try:
            cluster.start()
            cluster.call_ok("open_group", 0, cluster.addresses, 0.0)
            cluster.call_ok("train_step", 1)
            time.sleep(1.0)
            mem = {r: memory_mib(pid) for r, pid in cluster.pids.items()}
        finally:
            cluster.stop()
    return {
        "scenario": scenario.name,
        "pss_mib": [m["pss"] for m in mem.values()],
        "rss_mib": [m["rss"] for m in mem.values()],
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m testbed.experiments.bench --n 4 --out FILE``."""
    p = argparse.ArgumentParser(
        prog="python -m testbed.experiments.bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--n", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--algo", default="auto", help="allreduce algorithm (default auto)")
    p.add_argument("--label", default=None, help="column label in the peers' tables")
    p.add_argument("--out", required=True, help="result JSON file")
    p.add_argument("--npu-memory", metavar="SCENARIO", help="also measure the NPU actors of this scenario")
    args = p.parse_args(argv)
    warmup = int(os.environ.get("PB_WARMUP", "3"))
    result = run(args.n, args.algo, args.label or f"testbed data plane ({args.algo})", warmup)
    if args.npu_memory:
        result["npu_memory"] = npu_memory(args.npu_memory)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for size, s in result["sizes_in_actor"].items():
        print(
            f"n={args.n} {int(size):>9} B  in-actor {s['median_s'] * 1e3:8.3f} ms  "
            f"driver {result['sizes_driver'][size]['median_s'] * 1e3:8.3f} ms  ok={s['ok']}  "
            f"({result['algorithms'][size]})"
        )
    print(
        f"startup {result['startup_s']:.2f} s; PSS per rank at rest "
        f"{max(result['pss_ready_mib']):.0f} MiB (max)"
    )
    if args.npu_memory:
        print(
            f"NPU actors of {args.npu_memory}: PSS max {max(result['npu_memory']['pss_mib']):.0f} MiB, "
            f"RSS max {max(result['npu_memory']['rss_mib']):.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
