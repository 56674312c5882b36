"""A registered numpy workload (``mlp``, ``transformer``) as a program of the program protocol.

One protocol hosts both kinds of training code: the resume audit can run the
testbed's own workloads, and with them the testbed's own checkpoint format,
under real kills. Each checkpoint component (``params``, ``optimizer``,
``lr_scheduler``, ``rng``, ``data_cursor``) is a Stateful; ``save`` writes
the components of ``include`` with the checkpoint writer the engine uses
(one ``.npz`` per component, fsynced, loaded without pickle and only after
its sha256 matches), and ``load`` reads back what is there. Leave a
component out of ``include`` and the audit names it, as the engine's
completeness check does for a run::

    testbed audit-resume workloads.as_program --option workload=mlp \\
        --option include=[params,optimizer,lr_scheduler,data_cursor]

Options: ``workload`` (a registered name, default ``mlp``), ``options`` (its
options), ``include`` (default: every component). Data parallel only: the
workload's step runs without its tensor-, pipeline- or expert-parallel groups.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from testbed.collectives import Communicator, Endpoint
from testbed.core.secret import RunSecret
from testbed.fabric.clock import RankClock
from testbed.fabric.dataplane import DataPlane
from testbed.fabric.listeners import private_folder
from testbed.topology.layout import Layout
from testbed.topology.presets import PRESETS, Topology
from testbed.train.checkpoint import read_component, write_shard
from testbed.train.step_context import StepContext, open_groups
from workloads.base import WORKLOADS, Arrays, Workload
from workloads.program import ProgramError

#: where :meth:`WorkloadProgram.save` records each component's file and sha256
ENTRIES = "entries.json"


class Component:
    """One checkpoint component of a workload, as a Stateful."""

    def __init__(self, workload: Workload, name: str) -> None:
        self.workload, self.name = workload, name

    def state_dict(self) -> dict[str, np.ndarray]:
        """The component's arrays."""
        return self.workload.state(self.name)

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Take them back."""
        self.workload.load(self.name, state)


def _own_groups(seed: int) -> dict[str, Communicator]:
    """Every group of a one-rank layout: what a workload's step at a data-parallel layout reaches
    for (its tensor-, pipeline- and expert-parallel groups hold this rank alone, and move nothing)."""
    folder = private_folder("tb-own-")
    plane = DataPlane(0, RunSecret.new(), socket_dir=folder, world=1)
    shutil.rmtree(folder)  # no peer ever connects to a one-rank group: its socket's folder goes at once
    ep = Endpoint(0, plane, RankClock(), Topology(PRESETS["atlas-900-a3"], 1, 1), seed=seed)
    ep.new_epoch(0, {0: plane.address})
    return open_groups(ep, Layout())


class WorkloadProgram:
    """A workload's step as the phases of a program; its components as Statefuls."""

    def __init__(self, rank: int, world: int, seed: int, options: Mapping[str, Any]) -> None:
        name = str(options.get("workload", "mlp"))
        info = WORKLOADS.get(name)
        if info is None:
            raise ProgramError(
                f"workload {name!r} is not registered; choose from {', '.join(sorted(WORKLOADS))}"
            )
        layout = Layout(dp=world)
        given = {**info.options, **dict(options.get("options") or {})}
        problems = info.validate(given, layout) if info.validate else []
        if problems:
            raise ProgramError(f"workload {name!r}: {'; '.join(problems)}")
        self.workload = info.factory(given, seed, rank, layout)
        components = tuple(self.workload.components)
        self.include = tuple(options.get("include") or components)
        unknown = [c for c in self.include if c not in components]
        if unknown:
            raise ProgramError(f"include {unknown}: the components of {name!r} are {', '.join(components)}")
        self.statefuls = {c: Component(self.workload, c) for c in components}
        self.ctx = StepContext(
            rank, 0, layout, _own_groups(seed), RankClock(), peak_flops=1e15, efficiency=1.0
        )
        self.grads: Arrays = {}
        self.lr = 0.0

    def forward_backward(self) -> float | None:
        """The workload's forward and backward passes on this rank's next batch."""
        loss, self.grads, _ = self.workload.forward_backward(self.ctx)
        self.ctx.step += 1
        return loss

    def gradients(self) -> Arrays:
        """Every gradient, to average over the data-parallel ranks."""
        return self.grads

    def optimizer_step(self) -> None:
        """The workload's clipping and optimizer step."""
        self.lr = self.workload.apply(self.ctx, self.grads)

    def save(self, folder: str) -> None:
        """The components of ``include``, with the engine's checkpoint writer."""
        entries = write_shard(Path(folder), 0, {c: self.workload.state(c) for c in self.include})
        shas = {c: e["sha256"] for c, e in entries.items()}
        (Path(folder) / ENTRIES).write_text(json.dumps(shas))

    def load(self, folder: str) -> None:
        """Every component :meth:`save` wrote, each checked against its sha256."""
        shas = json.loads((Path(folder) / ENTRIES).read_text())
        for component, sha in shas.items():
            arrays = read_component(str(Path(folder) / "rank_00000" / f"{component}.npz"), sha)
            self.workload.load(component, arrays)


def make(rank: int, world: int, seed: int, options: Mapping[str, Any]) -> WorkloadProgram:
    """The workload program of ``rank``."""
    return WorkloadProgram(rank, world, seed, options)
