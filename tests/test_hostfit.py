"""Host memory: one NPU process must fit this machine, and a local run all of them at once."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest

from testbed.core.errors import ScenarioError
from testbed.core.units import format_bytes
from testbed.scenario.hostfit import (
    BASE_BYTES,
    PROCESS_BYTES,
    SUPERNODE_BYTES,
    HostMemory,
    LocalEstimate,
    rank_problems,
    refuse_unless_local_fits,
    workload_bytes,
)
from testbed.topology.layout import Layout
from workloads import WORKLOADS


def _peak(make: Callable[[], object]) -> int:
    """The most memory (numpy arrays included) held at once while ``make`` builds a workload."""
    tracemalloc.start()
    try:
        workload = make()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del workload
    return peak


@pytest.mark.parametrize(
    ("name", "options", "layout"),
    [
        ("mlp", {"hidden": 256, "layers": 4, "samples": 20_000}, Layout(dp=4)),
        (
            "transformer",
            {"d_model": 128, "ffn": 512, "layers": 4, "moe_every": 2, "experts": 8},
            Layout(dp=2, tp=2, pp=2),
        ),
    ],
    ids=["mlp", "transformer"],
)
def test_a_workloads_estimate_bounds_the_memory_a_rank_takes_to_start_without_being_wild(
    name: str, options: dict[str, int], layout: Layout
) -> None:
    info = WORKLOADS[name]
    peak = _peak(lambda: info.factory({**options, "steps": 10}, 1, 0, layout))
    estimate = workload_bytes(name, options, layout)
    assert peak <= estimate <= 6 * peak, (peak, estimate)  # an upper estimate: the steps need more


def test_one_process_that_cannot_fit_the_machine_is_a_problem_naming_both_sizes() -> None:
    host = HostMemory(total=16 * 2**30, available=8 * 2**30)
    assert rank_problems("mlp", {"hidden": 64}, Layout(dp=8), host) == []
    (problem,) = rank_problems("mlp", {"hidden": 1_000_000}, Layout(dp=8), host)
    assert "one NPU process would hold about 29.1 TiB" in problem and "16 GiB of memory" in problem


def test_a_local_run_is_every_process_with_its_workload_and_ray() -> None:
    need = LocalEstimate.of(supernodes=2, npus=8, workload=10 * 2**20)
    assert need.total == BASE_BYTES + 10 * 2**20 + 8 * (PROCESS_BYTES + 10 * 2**20) + 2 * SUPERNODE_BYTES
    refuse_unless_local_fits(need, "s.yaml:9", HostMemory(total=need.total, available=need.total))
    with pytest.raises(ScenarioError) as err:
        refuse_unless_local_fits(need, "s.yaml:9", HostMemory(total=2**30, available=need.total - 1))
    text = str(err.value)
    assert text.startswith("s.yaml:9: cluster: a local run needs about 8 NPU processes x")
    assert f"= {format_bytes(need.total)}" in text and "--address" in text and "nothing was started" in text


def test_sizes_read_as_people_write_them() -> None:
    assert [format_bytes(n) for n in (0, 512, 1024, 93 * 2**20, 4.7e9, 3 * 2**40)] == [
        "0 bytes",
        "512 bytes",
        "1 KiB",
        "93 MiB",
        "4.38 GiB",
        "3 TiB",
    ]
    assert format_bytes(7.4e24) == "7.4e+24 bytes"
    assert format_bytes(10**400) == "1.00e+400 bytes"  # past any float (a fuzzed size): no OverflowError
