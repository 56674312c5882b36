"""Training steps per wall second of a parallel layout, on real NPU actors.

``python -m testbed.experiments.stepbench scenarios/parallel_2x2x2.yaml --steps 40``
starts a private Ray on 127.0.0.1 and the scenario's cluster (faults are not
injected), opens the groups, trains a few warm-up steps (link set-up and
first-touch costs), then times ``--steps`` more, each driven as the
controller drives it: one Ray call per rank per step. It prints and, with
``--out``, writes JSON: steps per second, the wall time of a step (median
and quartiles), the model's size, the layout and the workload options
(``--option KEY=NUMBER`` overrides one, e.g. ``micro_batches=2``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from testbed.actors.cluster import Cluster
from testbed.actors.session import RaySession
from testbed.control.runner import rank_spec
from testbed.scenario.model import Scenario
from testbed.scenario.parse import load_scenario


def parameters(scenario: Scenario) -> int:
    """The model's parameter count (all ranks' parts, each counted once)."""
    from workloads import WORKLOADS
    from workloads.blockspec import full_shapes, options_of

    w = scenario.workload
    if w.name == "transformer":
        return sum(math.prod(s) for s in full_shapes(options_of(w.options)).values())
    probe = WORKLOADS[w.name].factory(w.options, scenario.seed, 0, w.layout())
    return sum(int(v.size) for v in probe.state("params").values())


def measure(scenario: Scenario, steps: int, warmup: int) -> dict[str, Any]:
    """Time ``steps`` training steps after ``warmup`` ones."""
    with RaySession(None):
        cluster = Cluster(rank_spec(scenario))
        try:
            cluster.start()
            cluster.call_ok("open_group", 0, cluster.addresses, 0.0)
            for step in range(1, warmup + 1):
                cluster.call_ok("train_step", step)
            times = []
            t_start = time.perf_counter()
            for step in range(warmup + 1, warmup + steps + 1):
                t0 = time.perf_counter()
                cluster.call_ok("train_step", step)
                times.append(time.perf_counter() - t0)
            total = time.perf_counter() - t_start
        finally:
            cluster.stop()
    q = statistics.quantiles(times, n=4)
    return {
        "scenario": scenario.name,
        "layout": scenario.workload.layout().describe(),
        "options": {k: v for k, v in scenario.workload.options.items() if k != "steps"},
        "world": scenario.workload.layout().world,
        "parameters": parameters(scenario),
        "steps": steps,
        "steps_per_s": steps / total,
        "step_ms": {"median": 1e3 * statistics.median(times), "q1": 1e3 * q[0], "q3": 1e3 * q[2]},
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(
        prog="python -m testbed.experiments.stepbench", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("scenarios", nargs="+", help="scenario files (their layouts and models; faults ignored)")
    p.add_argument("--steps", type=int, default=40, help="timed steps (default 40)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=NUMBER",
        help="override a workload option (repeatable), e.g. --option micro_batches=2",
    )
    args = p.parse_args(argv)
    overrides = {}
    for item in args.option:
        key, _, value = item.partition("=")
        try:
            overrides[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            p.error(f"--option {item}: write KEY=NUMBER, e.g. micro_batches=2")
    results = []
    for path in args.scenarios:
        scenario = load_scenario(path)
        w = scenario.workload
        steps = max(w.steps, args.warmup + args.steps)  # the schedule must cover the steps timed
        changed = dataclasses.replace(w, steps=steps, options={**w.options, **overrides, "steps": steps})
        scenario = dataclasses.replace(scenario, workload=changed)
        r = measure(scenario, args.steps, args.warmup)
        results.append(r)
        print(
            f"{r['scenario']}: {r['layout']} ({r['world']} ranks, {r['parameters'] / 1e6:.2f} M parameters): "
            f"{r['steps_per_s']:.1f} steps/s; step {r['step_ms']['median']:.1f} ms "
            f"(quartiles {r['step_ms']['q1']:.1f}-{r['step_ms']['q3']:.1f})",
            flush=True,
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
