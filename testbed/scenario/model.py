"""The scenario file: one typed, versioned model, validated before any actor starts.

:func:`load_scenario` reads a YAML file and returns a frozen
:class:`Scenario`, or raises :class:`ScenarioError` listing every problem at
once, each as ``file:line: field.path: what is wrong; how to fix it``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from faults.kind import ClusterFacts, FaultKind, FaultSpec, Problems, kinds
from faults.targets import blast_problems
from faults.triggers import as_step, trigger_problems
from testbed.core.errors import ScenarioError
from testbed.core.units import format_bytes, parse_duration, parse_size
from testbed.recovery.learned import LearnPolicy
from testbed.scenario.hostfit import HostMemory, LocalEstimate, rank_problems, workload_bytes
from testbed.scenario.source import Path as YPath
from testbed.scenario.source import Source, load
from testbed.scenario.timeout_ladder import ladder_warnings
from testbed.topology.layout import Layout, placement_warnings
from testbed.topology.presets import PRESETS, Topology
from testbed.topology.ranktable import read_rank_table
from testbed.train.checkpoint import COMPONENTS
from testbed.train.device_memory import POLICIES as MEMORY_POLICIES

VERSION = 1
STRATEGIES = {
    "restart": "re-create lost NPUs, re-link, load the newest committed checkpoint, recompute",
    "op_retry": "re-run a failed collective after a hold (HCCL_OP_RETRY_ENABLE); restart if that fails",
    "step_retry": "re-run the whole failed step from its starting state kept in memory; else restart",
    "ladder": "op retry, then step retry, then restart, as MindCluster's recovery ladder",
    "hot_spare": "a standby NPU process of the same supernode takes the lost rank (spare_s, not restart_s)",
    "replica": "restart lost NPUs and restore every rank from in-memory replicas held in another supernode",
    "elastic": "drop the lost rank's data-parallel replica and train on; it rejoins after replace_s",
}
ALGORITHMS = ("auto", "ring", "mesh", "halving_doubling", "hierarchical", "recursive_doubling")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


#: Device memory is the preset's HBM scaled down by this factor, unless a scenario sets it.
HBM_SCALE = 1e-4


@dataclass(frozen=True)
class ClusterSpec:
    """``cluster``: a preset, its size, and each NPU's device memory in bytes (0: HBM x 1e-4)."""

    preset: str = "atlas-900-a3"
    supernodes: int = 2
    npus_per_supernode: int = 4
    device_memory: int = 0
    #: NPUs of the modelled job for the link-setup load (0: the cluster's): each group sets up as
    #: many links at once as it would at that scale
    modelled_npus: int = 0

    def setup_scale(self) -> float:
        """How many times larger each group is, for link setup, than the NPUs that run it."""
        world = self.supernodes * self.npus_per_supernode
        return max(1.0, self.modelled_npus / world) if self.modelled_npus else 1.0

    def device_bytes(self) -> int:
        """Each NPU's device memory."""
        return self.device_memory or int(PRESETS[self.preset].hbm_bytes * HBM_SCALE)

    def topology(self) -> Topology:
        """The topology this spec describes."""
        return Topology(PRESETS[self.preset], self.supernodes, self.npus_per_supernode)


@dataclass(frozen=True)
class WorkloadSpec:
    """``workload``: which model, how long, how parallel, and its options."""

    name: str = "mlp"
    steps: int = 60
    dp: int = 8
    tp: int = 1
    pp: int = 1
    ep: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    #: FLOPs of the modelled job per FLOP the numpy model computes (virtual compute time only)
    compute_scale: float = 1.0
    #: bytes of the modelled job's state per byte the numpy model holds (virtual checkpoint, load,
    #: snapshot and replica-transfer time only; the files on disk are the numpy model's)
    state_scale: float = 1.0

    def layout(self) -> Layout:
        """The parallel layout."""
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, ep=self.ep)


@dataclass(frozen=True)
class CheckpointPolicy:
    """``policy.checkpoint``: interval (0: never), components saved and restored, how many kept (0: all)."""

    every: int = 10
    include: tuple[str, ...] = ("params", "optimizer", "lr_scheduler", "rng", "data_cursor")
    keep: int = 0
    #: snapshot to host memory, then persist in the background while training goes on
    async_: bool = False
    #: what a resume loads (default: everything saved); leaving one out rehearses "saved but never restored"
    restore: tuple[str, ...] = ("params", "optimizer", "lr_scheduler", "rng", "data_cursor")
    #: in-memory replicas every this many steps (None: every step under the replica strategy, else never)
    replica_every: int | None = None

    def replicas_every(self, strategy: str) -> int:
        """How often in-memory replicas are taken under ``strategy`` (0: never)."""
        if self.replica_every is not None:
            return self.replica_every
        return 1 if strategy == "replica" else 0


@dataclass(frozen=True)
class TimeoutPolicy:
    """``policy.timeouts``: HCCL_CONNECT_TIMEOUT and HCCL_EXEC_TIMEOUT (seconds), HCCL_RDMA_TIMEOUT (an
    exponent) and HCCL_RDMA_RETRY_CNT, and the framework's process-group timeout (seconds; unset: not
    checked)."""

    connect_s: float = 120.0
    exec_s: float = 1836.0
    rdma_timeout: int = 20
    rdma_retry_cnt: int = 7
    pg_timeout_s: float | None = None
    #: learned timeouts (testbed.recovery.learned); None: not learned
    learn: LearnPolicy | None = None


@dataclass(frozen=True)
class DetectionPolicy:
    """``policy.detection``: node heartbeat (MindCluster: every 5 s, dead after 3 missed)."""

    heartbeat_s: float = 5.0
    missed: int = 3


@dataclass(frozen=True)
class OpRetryPolicy:
    """``policy.recovery.op_retry``: HCCL's op retry on A3 (1 retry, 5 s hold, 1 s interval)."""

    retries: int = 1
    hold_s: float = 5.0
    interval_s: float = 1.0


@dataclass(frozen=True)
class RecoveryPolicy:
    """``policy.recovery``: strategy, restart budget, modelled costs (process restart, spare activation),
    op retry, hot spares per supernode."""

    strategy: str = "restart"
    max_restarts: int = 3
    restart_s: float = 30.0
    op_retry: OpRetryPolicy = field(default_factory=OpRetryPolicy)
    spares_per_supernode: int = 1
    spare_s: float = 5.0
    #: elastic: how long until the lost NPU's replacement is ready and its replica rejoins
    replace_s: float = 120.0


@dataclass(frozen=True)
class MemoryPolicy:
    """``policy.memory``: what an allocation that does not fit does, and the supernode pool share."""

    on_oom: str = "none"
    pool_share: float = 0.25


@dataclass(frozen=True)
class CollectivesPolicy:
    """``policy.collectives``: the gradient allreduce's algorithm, and the warm-up of its links."""

    algorithm: str = "auto"
    warmup: bool = True


@dataclass(frozen=True)
class Policy:
    """``policy``: what the job does about checkpoints, timeouts, detection and recovery."""

    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    timeouts: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    detection: DetectionPolicy | None = field(default_factory=DetectionPolicy)
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    collectives: CollectivesPolicy = field(default_factory=CollectivesPolicy)
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)


@dataclass(frozen=True)
class Range:
    """An inclusive tolerance ``[lo, hi]`` (a scalar in a scenario is one end of it, or both)."""

    lo: float
    hi: float

    def holds(self, value: float) -> bool:
        """``lo <= value <= hi``."""
        return self.lo <= value <= self.hi

    def __str__(self) -> str:
        return f"[{self.lo:g}, {self.hi:g}]"


@dataclass(frozen=True)
class Expect:
    """``expect``: what the run must show for a pass verdict (unset: not checked)."""

    recovered: bool | None = None
    max_recovery_s: float | None = None
    checkpoint_complete: bool | None = None
    matches_uninterrupted: bool | None = None
    max_failures: int | None = None
    min_goodput: float | None = None
    #: tolerances: a scalar (failures: exactly; recovery_s: at most; goodput: at least) or [low, high]
    failures: Range | None = None
    recovery_s: Range | None = None
    goodput: Range | None = None
    #: the detectors allowed to find the failures (a name or a list of names)
    detected_by: tuple[str, ...] | None = None
    #: the verdict the scenario means to come to: ``pass``, or ``fail`` (a scenario that demonstrates a
    #: wrong policy), ``aborted`` or ``unknown``; a suite (``testbed suite``) holds the run to it
    verdict: str = "pass"
    #: the checks that must fail, and no other (with ``verdict: fail`` or ``aborted``)
    fails: tuple[str, ...] = ()


@dataclass(frozen=True)
class Safeguards:
    """``safeguards``: conditions that abort the run (exit 3), whatever the checks would say."""

    #: a loss that is NaN or infinite ends the run (training has diverged)
    nan_loss: bool = True
    #: more failures than this in the main phase end the run (None: no limit beyond max_restarts)
    max_failures: int | None = None
    #: wall-clock seconds the run may take (None: no budget)
    wall_s: float | None = None
    #: the most ranks one fault may reach, as a percentage of the cluster (:mod:`faults.targets`)
    blast_radius_percent: float = 50.0


@dataclass(frozen=True)
class Scenario:
    """A whole validated scenario."""

    version: int
    name: str
    seed: int
    cluster: ClusterSpec
    workload: WorkloadSpec
    policy: Policy
    faults: tuple[FaultSpec, ...]
    expect: Expect
    description: str = ""
    file: str = ""
    warnings: tuple[str, ...] = ()
    safeguards: Safeguards = field(default_factory=Safeguards)
    #: labels for choosing scenarios of a suite (``smoke``, ``fast``, ``slow``, a topic)
    tags: tuple[str, ...] = ()
    #: the line of each top-level section in the file, for messages about a section as a whole
    lines: dict[str, int] = field(default_factory=dict)

    def where(self, section: str) -> str:
        """``file:line`` of a top-level section (``file`` alone when the section is not written)."""
        line = self.lines.get(section)
        return f"{self.file or self.name}:{line}" if line else self.file or self.name

    def local_estimate(self) -> LocalEstimate:
        """The system memory a local run of this scenario needs (every NPU, supervisor and spare)."""
        c, w, r = self.cluster, self.workload, self.policy.recovery
        spares = r.spares_per_supernode * c.supernodes if r.strategy == "hot_spare" else 0
        npus = c.supernodes * c.npus_per_supernode + spares
        return LocalEstimate.of(c.supernodes, npus, workload_bytes(w.name, w.options, w.layout()))

    def with_seed(self, seed: int) -> Scenario:
        """The same scenario under another seed."""
        return replace(self, seed=seed)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the plan hash and the report use it)."""
        return asdict(self)

    def digest(self) -> str:
        """sha256 of the scenario's content (not its file name, nor the warnings derived from it)."""
        body = {k: v for k, v in self.as_dict().items() if k not in ("file", "warnings", "lines")}
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


_TOP = (
    "version",
    "name",
    "description",
    "seed",
    "cluster",
    "workload",
    "policy",
    "faults",
    "expect",
    "safeguards",
    "tags",
)


class _Checker:
    """Collects problems while reading the document, each with its line and a fix."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.problems: list[str] = []
        self.reported: set[YPath] = set()  # fields already refused for a NaN or an infinity

    def nonfinite(self) -> None:
        """One problem per NaN or infinity in the document (no scenario field means one); the
        field's own checks then stay quiet about it."""
        for path in self.src.nonfinite:
            value = self._value(path)
            shown = ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
            self.problem(path, f"{shown} is not a finite number; every number in a scenario is finite")
            self.reported.add(path)

    def _value(self, path: YPath) -> Any:
        node = self.src.data
        for key in path:
            node = node[key]
        return node

    def problem(self, path: YPath, message: str) -> None:
        if path in self.reported:
            return
        line = self.src.line(path)
        where = f"{self.src.file}:{line}" if line else self.src.file
        dotted = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")
        self.problems.append(f"{where}: {dotted or '(document)'}: {message}")

    def mapping(self, value: Any, path: YPath, allowed: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(path, f"expected a mapping of {', '.join(allowed)}, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in allowed:
                near = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"did you mean '{near[0]}'?" if near else f"known fields: {', '.join(allowed)}"
                self.problem((*path, key), f"unknown field '{key}'; {hint}")
        return value

    def number(
        self,
        m: dict[str, Any],
        key: str,
        path: YPath,
        default: float,
        lo: float,
        hi: float = float("inf"),
        integer: bool = False,
        unit: str = "",
    ) -> Any:
        value = m.get(key, default)
        if unit == "s" and isinstance(value, str):
            seconds = parse_duration(value)
            if seconds is None:
                self.problem(
                    (*path, key), f"expected a duration like 30, '30s', '500ms' or '2h', got {value!r}"
                )
                return default
            value = seconds
        kind = "a number of seconds (or a duration like '30s')" if unit == "s" else "a number"
        kind = "an integer" if integer else kind
        ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type:
            hint = ""
            if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE]\d+", value):
                hint = "; YAML reads an exponent without a sign as text: write 2.0e+7, not 2.0e7"
            self.problem((*path, key), f"expected {kind}, got {value!r}{hint}")
            return default
        if not lo <= value <= hi:
            span = f"at least {lo:g}" if hi == float("inf") else f"between {lo:g} and {hi:g}"
            self.problem((*path, key), f"{value!r} is out of range; use a value {span}")
            return default
        return int(value) if integer else float(value)

    def choice(
        self, m: dict[str, Any], key: str, path: YPath, default: str, options: list[str], what: str
    ) -> str:
        value = m.get(key, default)
        if value not in options:
            near = difflib.get_close_matches(str(value), options, n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            self.problem((*path, key), f"unknown {what} '{value}'. Known: {', '.join(options)}.{hint}")
            return default
        return str(value)

    def boolean(self, m: dict[str, Any], key: str, path: YPath) -> bool | None:
        value = m.get(key)
        if value is not None and not isinstance(value, bool):
            self.problem((*path, key), f"expected true or false, got {value!r}")
            return None
        return value


def _rank_table(c: _Checker, m: dict[str, Any], path: YPath, base: Path) -> dict[str, Any]:
    """``cluster.rank_table``: the preset and sizes an HCCL rank table gives (a file under ``base``)."""
    where: YPath = (*path, "rank_table")
    name = m["rank_table"]
    if not isinstance(name, str) or not name:
        c.problem(where, "expected the path of an HCCL rank table JSON file, relative to the scenario")
        return {}
    target = (base / name).resolve()
    if Path(name).is_absolute() or not target.is_relative_to(base.resolve()):
        c.problem(where, f"'{name}' is outside the scenario's folder; put the rank table beside the scenario")
        return {}
    clash = sorted({"preset", "supernodes", "npus_per_supernode"} & set(m))
    if clash:
        c.problem((*path, clash[0]), f"'{clash[0]}' is set by the rank table; drop it or drop rank_table")
    table, problems = read_rank_table(target)
    for problem in problems:
        c.problem(where, f"rank table {name}: {problem}")
    if table is None:
        return {}
    return {
        "preset": table.preset,
        "supernodes": table.supernodes,
        "npus_per_supernode": table.npus_per_supernode,
    }


def _cluster(c: _Checker, raw: Any, base: Path) -> ClusterSpec:
    path: YPath = ("cluster",)
    fields = ("preset", "supernodes", "npus_per_supernode", "device_memory", "modelled_npus", "rank_table")
    m = c.mapping(raw, path, fields)
    if "rank_table" in m:
        m = {**m, **_rank_table(c, m, path, base)}
    preset = c.choice(m, "preset", path, "atlas-900-a3", sorted(PRESETS), "preset")
    cap = PRESETS[preset].max_npus_per_supernode
    memory = parse_size(m.get("device_memory", 0))
    if memory is None or (memory and memory < 2**20):
        c.problem(
            (*path, "device_memory"),
            f"'{m.get('device_memory')}' is not a device memory size of at least "
            "1 MiB; write bytes or '16MiB', '2GiB'",
        )
        memory = 0
    hbm = PRESETS[preset].hbm_bytes
    if memory > hbm:
        c.problem(
            (*path, "device_memory"),
            f"{format_bytes(memory)} is more than an NPU of {preset} has ({format_bytes(hbm)} of HBM); "
            "device memory is the preset's HBM scaled down: write at most that, or leave it out "
            "(HBM x 1e-4)",
        )
        memory = 0
    return ClusterSpec(
        preset=preset,
        supernodes=c.number(m, "supernodes", path, 2, 1, 64, integer=True),
        npus_per_supernode=c.number(m, "npus_per_supernode", path, 4, 1, cap, integer=True),
        device_memory=memory,
        modelled_npus=c.number(m, "modelled_npus", path, 0, 0, 1_000_000, integer=True),
    )


def _workload(c: _Checker, raw: Any, cluster: ClusterSpec) -> WorkloadSpec:
    from workloads import WORKLOADS

    path: YPath = ("workload",)
    name = c.choice(raw if isinstance(raw, dict) else {}, "name", path, "mlp", sorted(WORKLOADS), "workload")
    option_names = tuple(WORKLOADS[name].options)
    m = c.mapping(raw, path, ("name", "steps", "parallel", "compute_scale", "state_scale", *option_names))
    steps = c.number(m, "steps", path, 60, 1, 100_000, integer=True)
    compute_scale = c.number(m, "compute_scale", path, 1.0, 1e-3, 1e15)
    state_scale = c.number(m, "state_scale", path, 1.0, 1e-3, 1e15)
    ppath: YPath = (*path, "parallel")
    par = c.mapping(m.get("parallel"), ppath, ("dp", "tp", "pp", "ep"))
    world = cluster.supernodes * cluster.npus_per_supernode
    tp = c.number(par, "tp", ppath, 1, 1, integer=True)
    pp = c.number(par, "pp", ppath, 1, 1, integer=True)
    ep = c.number(par, "ep", ppath, 1, 1, integer=True)
    dp = c.number(par, "dp", ppath, max(1, world // (tp * pp * ep)), 1, integer=True)
    layout = Layout(dp=dp, tp=tp, pp=pp, ep=ep)
    if layout.world != world:
        c.problem(
            ppath,
            f"the parallel layout dp×tp×pp×ep = {dp}×{tp}×{pp}×{ep} = {layout.world} does not fit the "
            f"cluster's {world} NPUs ({cluster.supernodes} supernodes × {cluster.npus_per_supernode}); "
            f"make the product {world}",
        )
    options = {k: m[k] for k in option_names if k in m}
    bad = False
    for k, v in options.items():
        default = WORKLOADS[name].options[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            c.problem((*path, k), f"expected a non-negative number (default {default}), got {v!r}")
            bad = True
    validate = WORKLOADS[name].validate
    if not bad and validate is not None:
        for message in validate({**WORKLOADS[name].options, **options}, layout):
            c.problem(path, f"workload '{name}': {message}")
    if not bad:
        for message in rank_problems(name, options, layout, HostMemory.now()):
            c.problem(path, f"workload '{name}': {message}")
    return WorkloadSpec(
        name=name,
        steps=steps,
        dp=dp,
        tp=tp,
        pp=pp,
        ep=ep,
        options={**options, "steps": steps},
        compute_scale=float(compute_scale),
        state_scale=float(state_scale),
    )


def _components(c: _Checker, m: dict[str, Any], key: str, path: YPath, default: list[str]) -> list[str]:
    """A list of checkpoint components under ``key`` (unknown names are reported)."""
    value = m.get(key, default)
    if not isinstance(value, list):
        c.problem((*path, key), f"expected a list drawn from {', '.join(COMPONENTS)}")
        return list(default)
    for i, comp in enumerate(value):
        if comp not in COMPONENTS:
            near = difflib.get_close_matches(str(comp), COMPONENTS, n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            c.problem((*path, key, i), f"unknown component '{comp}'. Known: {', '.join(COMPONENTS)}.{hint}")
    return [x for x in value if x in COMPONENTS]


def _policy(c: _Checker, raw: Any) -> Policy:
    path: YPath = ("policy",)
    m = c.mapping(raw, path, ("checkpoint", "timeouts", "detection", "recovery", "collectives", "memory"))
    cp: YPath = (*path, "checkpoint")
    ck = c.mapping(m.get("checkpoint"), cp, ("every", "include", "keep", "restore", "async", "replica_every"))
    include = _components(c, ck, "include", cp, list(CheckpointPolicy.include))
    restore = _components(c, ck, "restore", cp, include)
    unsaved = [x for x in restore if x not in include]
    if unsaved:
        c.problem(
            (*cp, "restore"),
            f"restore names {', '.join(unsaved)}, which include does not save; add it to include or drop it "
            "from restore",
        )
    checkpoint = CheckpointPolicy(
        every=c.number(ck, "every", cp, 10, 0, integer=True),
        include=tuple(include),
        keep=c.number(ck, "keep", cp, 0, 0, integer=True),
        restore=tuple(restore),
        async_=bool(c.boolean(ck, "async", cp)),
        replica_every=(
            c.number(ck, "replica_every", cp, 0, 0, integer=True) if "replica_every" in ck else None
        ),
    )
    tpath: YPath = (*path, "timeouts")
    t = c.mapping(
        m.get("timeouts"),
        tpath,
        ("connect_s", "exec_s", "rdma_timeout", "rdma_retry_cnt", "pg_timeout_s", "learn"),
    )
    learn: LearnPolicy | None = None
    if "learn" in t:
        lpath: YPath = (*tpath, "learn")
        lm = c.mapping(t["learn"], lpath, ("safety_factor", "warmup_steps", "min_samples", "blend"))
        learn = LearnPolicy(
            safety_factor=c.number(lm, "safety_factor", lpath, 5.0, 1.0, 1000.0),
            warmup_steps=c.number(lm, "warmup_steps", lpath, 2, 0, integer=True),
            min_samples=c.number(lm, "min_samples", lpath, 5, 1, integer=True),
            blend=c.number(lm, "blend", lpath, 0.5, 0.0, 1.0),
        )
    timeouts = TimeoutPolicy(
        connect_s=c.number(t, "connect_s", tpath, 120.0, 120.0, 7200.0, unit="s"),  # HCCL accepts 120-7200
        exec_s=c.number(t, "exec_s", tpath, 1836.0, 1.0, unit="s"),
        rdma_timeout=c.number(t, "rdma_timeout", tpath, 20, 5, 24, integer=True),  # HCCL accepts 5-24
        rdma_retry_cnt=c.number(t, "rdma_retry_cnt", tpath, 7, 1, 7, integer=True),  # and 1-7
        pg_timeout_s=c.number(t, "pg_timeout_s", tpath, 0.0, 1.0, unit="s") if "pg_timeout_s" in t else None,
        learn=learn,
    )
    detection: DetectionPolicy | None = None
    if "detection" not in m or m["detection"] is not None:
        dpath: YPath = (*path, "detection")
        d = c.mapping(m.get("detection"), dpath, ("heartbeat_s", "missed"))
        detection = DetectionPolicy(
            heartbeat_s=c.number(d, "heartbeat_s", dpath, 5.0, 0.001, unit="s"),
            missed=c.number(d, "missed", dpath, 3, 1, integer=True),
        )
    rpath: YPath = (*path, "recovery")
    r = c.mapping(
        m.get("recovery"),
        rpath,
        ("strategy", "max_restarts", "restart_s", "op_retry", "spares_per_supernode", "spare_s", "replace_s"),
    )
    opath: YPath = (*rpath, "op_retry")
    o = c.mapping(r.get("op_retry"), opath, ("retries", "hold_s", "interval_s"))
    recovery = RecoveryPolicy(
        strategy=c.choice(r, "strategy", rpath, "restart", sorted(STRATEGIES), "recovery strategy"),
        max_restarts=c.number(r, "max_restarts", rpath, 3, 0, integer=True),
        restart_s=c.number(r, "restart_s", rpath, 30.0, 0.0, unit="s"),
        spares_per_supernode=c.number(r, "spares_per_supernode", rpath, 1, 0, 64, integer=True),
        spare_s=c.number(r, "spare_s", rpath, 5.0, 0.0, unit="s"),
        replace_s=c.number(r, "replace_s", rpath, 120.0, 0.0, unit="s"),
        op_retry=OpRetryPolicy(
            retries=c.number(o, "retries", opath, 1, 0, integer=True),
            hold_s=c.number(o, "hold_s", opath, 5.0, 0.0, unit="s"),
            interval_s=c.number(o, "interval_s", opath, 1.0, 0.0, unit="s"),
        ),
    )
    cpath: YPath = (*path, "collectives")
    cm = c.mapping(m.get("collectives"), cpath, ("algorithm", "warmup"))
    collectives = CollectivesPolicy(
        algorithm=c.choice(cm, "algorithm", cpath, "auto", list(ALGORITHMS), "allreduce algorithm"),
        warmup=bool(c.boolean(cm, "warmup", cpath) if "warmup" in cm else True),
    )
    mpath: YPath = (*path, "memory")
    mm = c.mapping(m.get("memory"), mpath, ("on_oom", "pool_share"))
    memory = MemoryPolicy(
        on_oom=c.choice(mm, "on_oom", mpath, "none", sorted(MEMORY_POLICIES), "memory policy"),
        pool_share=c.number(mm, "pool_share", mpath, 0.25, 0.0, 1.0),
    )
    return Policy(
        memory=memory,
        checkpoint=checkpoint,
        timeouts=timeouts,
        detection=detection,
        recovery=recovery,
        collectives=collectives,
    )


def _faults(c: _Checker, raw: Any, facts: ClusterFacts, blast_cap: float) -> tuple[FaultSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.problem(("faults",), "expected a list of faults, each a mapping with kind, target and at")
        return ()
    registry = kinds()
    out: list[FaultSpec] = []
    for i, entry in enumerate(raw):
        path: YPath = ("faults", i)
        kind = entry.get("kind") if isinstance(entry, dict) else None
        kind = kind if isinstance(kind, str) else repr(kind)
        extra = tuple(registry[kind].params) if kind in registry else ()
        m = c.mapping(entry, path, ("kind", "target", "at", *extra))
        if kind not in registry:
            near = difflib.get_close_matches(str(kind), registry, n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            c.problem(
                (*path, "kind"),
                f"unknown fault kind '{kind}'. Known kinds: {', '.join(sorted(registry))}.{hint}",
            )
            continue
        target: dict[str, Any] = m["target"] if isinstance(m.get("target"), dict) else {}
        at: dict[str, Any] = m["at"] if isinstance(m.get("at"), dict) else {}
        params = {k: m[k] for k in registry[str(kind)].params if k in m}
        spec = FaultSpec(index=i, kind=str(kind), target=dict(target), at=dict(at), params=params)
        spec = replace(spec, occurrence=sum(1 for s in out if s.content() == spec.content()))
        for sub, message in _fault_problems(registry[str(kind)], spec, facts, blast_cap):
            c.problem((*path, *sub), message)
        out.append(spec)
    return tuple(out)


def _fault_problems(kind: FaultKind, spec: FaultSpec, facts: ClusterFacts, blast_cap: float) -> Problems:
    """The shared trigger's problems, the kind's own, and the blast-radius cap's."""
    problems = trigger_problems(spec, facts)
    for name in sorted(({"every", "time"} & set(spec.at)) - set(kind.triggers)):
        problems.append((("at", name), f"{kind.name} fires only at 'step: N' (it acts on a checkpoint)"))
    view = as_step(spec, facts) if not problems else replace(spec, at={"step": 1})
    problems += kind.validate(view, facts)
    if not problems and kind.targets_ranks:
        problems += blast_problems(spec, facts, blast_cap)
    return problems


#: The verdicts a scenario can declare (``expect.verdict``), as a run reports them.
VERDICTS = ("pass", "fail", "unknown", "aborted")
#: The harness checks by name (``expect.fails``), in the order a report lists them.
CHECK_NAMES = (
    "recovered",
    "recovery_time",
    "checkpoint_complete",
    "matches_uninterrupted",
    "failures",
    "goodput",
    "detection",
    "learned_timeouts",
)
_TAG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")

#: The detectors a failure can be found by (``expect.detected_by``).
DETECTORS = (
    "heartbeat",
    "exec_timeout",
    "learned_step_timeout",
    "connect_timeout",
    "device_oom",
    "operator_error",
)


def _range(c: _Checker, m: dict[str, Any], key: str, path: YPath, scalar: str, top: float) -> Range | None:
    """A tolerance: a number (``scalar``: ``exact``, ``max`` or ``min``) or an inclusive ``[low, high]``."""
    value = m.get(key)
    if value is None:
        return None
    number = (int, float)
    if isinstance(value, number) and not isinstance(value, bool) and 0 <= value <= top:
        v = float(value)
        return {"exact": Range(v, v), "max": Range(0.0, v), "min": Range(v, top)}[scalar]
    pair = isinstance(value, list) and len(value) == 2
    if pair and all(isinstance(v, number) and not isinstance(v, bool) for v in value):
        lo, hi = float(value[0]), float(value[1])
        if 0 <= lo <= hi <= top:
            return Range(lo, hi)
    c.problem(
        (*path, key),
        f"expected a number between 0 and {top:g} or an inclusive range [low, high] within it, got {value!r}",
    )
    return None


def _detectors(c: _Checker, m: dict[str, Any], path: YPath) -> tuple[str, ...] | None:
    value = m.get("detected_by")
    if value is None:
        return None
    if value == []:
        c.problem((*path, "detected_by"), f"expected a detector or a list of them: {', '.join(DETECTORS)}")
        return None
    return _names(c, value, (*path, "detected_by"), DETECTORS, "detectors")


def _expect(c: _Checker, raw: Any) -> Expect:
    path: YPath = ("expect",)
    m = c.mapping(
        raw,
        path,
        (
            "recovered",
            "max_recovery_s",
            "checkpoint_complete",
            "matches_uninterrupted",
            "max_failures",
            "min_goodput",
            "failures",
            "recovery_s",
            "goodput",
            "detected_by",
            "verdict",
            "fails",
        ),
    )
    bound = (
        None if m.get("max_recovery_s") is None else c.number(m, "max_recovery_s", path, 0.0, 0.0, unit="s")
    )
    return Expect(
        recovered=c.boolean(m, "recovered", path),
        max_recovery_s=bound,
        checkpoint_complete=c.boolean(m, "checkpoint_complete", path),
        matches_uninterrupted=c.boolean(m, "matches_uninterrupted", path),
        max_failures=None
        if m.get("max_failures") is None
        else c.number(m, "max_failures", path, 0, 0, integer=True),
        min_goodput=None if m.get("min_goodput") is None else c.number(m, "min_goodput", path, 0.0, 0.0, 1.0),
        failures=_range(c, m, "failures", path, "exact", 1e9),
        recovery_s=_range(c, m, "recovery_s", path, "max", 1e12),
        goodput=_range(c, m, "goodput", path, "min", 1.0),
        detected_by=_detectors(c, m, path),
        **_declared(c, m, path),
    )


def _names(c: _Checker, value: Any, path: YPath, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A name or a list of names, each one of ``known`` (unknown ones reported with the closest)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        c.problem(path, f"expected a {what[:-1]} or a list of them: {', '.join(known)}")
        return ()
    for n in names:
        if n not in known:
            near = difflib.get_close_matches(n, known, n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            c.problem(path, f"unknown {what[:-1]} '{n}'. Known: {', '.join(known)}.{hint}")
    return tuple(n for n in names if n in known)


def _declared(c: _Checker, m: dict[str, Any], path: YPath) -> dict[str, Any]:
    """``expect.verdict`` and ``expect.fails``: what the run means to come to (a scenario that shows a
    wrong policy fails, and says which checks)."""
    fails = _names(c, m["fails"], (*path, "fails"), CHECK_NAMES, "checks") if "fails" in m else ()
    verdict = c.choice(m, "verdict", path, "fail" if fails else "pass", list(VERDICTS), "verdict")
    if verdict == "fail" and not fails and not m.get("fails"):
        c.problem(
            (*path, "verdict"),
            "a scenario meant to fail names the checks that must fail: add 'fails: [CHECK, ...]' "
            f"(checks: {', '.join(CHECK_NAMES)})",
        )
    if fails and verdict not in ("fail", "aborted"):
        c.problem(
            (*path, "fails"), f"checks fail only in a failed or aborted run, not with verdict: {verdict}"
        )
    return {"verdict": verdict, "fails": fails}


def _tags(c: _Checker, raw: Any) -> tuple[str, ...]:
    """``tags``: short lower-case labels (``smoke``, ``fast``, ``checkpoint``)."""
    if raw is None:
        return ()
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(t, str) and _TAG.match(t) for t in names):
        c.problem(
            ("tags",),
            f"tags are a list of short lower-case labels (letters, digits, '-', '_'), like [smoke, fast]; "
            f"got {raw!r}",
        )
        return ()
    return tuple(dict.fromkeys(names))


def _safeguards(c: _Checker, raw: Any) -> Safeguards:
    path: YPath = ("safeguards",)
    m = c.mapping(raw, path, ("nan_loss", "max_failures", "wall_s", "blast_radius_percent"))
    wall = m.get("wall_s")
    seconds = parse_duration(wall) if wall is not None else None
    if wall is not None and (seconds is None or seconds <= 0):
        c.problem((*path, "wall_s"), f"wall_s must be a positive duration like 600 or '10m', got {wall!r}")
    nan = c.boolean(m, "nan_loss", path)
    return Safeguards(
        nan_loss=True if nan is None else nan,
        max_failures=None
        if m.get("max_failures") is None
        else c.number(m, "max_failures", path, 0, 0, integer=True),
        wall_s=seconds if seconds and seconds > 0 else None,
        blast_radius_percent=c.number(m, "blast_radius_percent", path, 50.0, 0.0, 100.0),
    )


def parse_scenario(text: str, file: str = "<scenario>") -> Scenario:
    """Validate a scenario document; raises :class:`ScenarioError` with every problem found."""
    src = load(text, file)
    c = _Checker(src)
    c.nonfinite()
    for path, _ in src.duplicates:
        c.problem(path, "this key appears twice in its mapping; keep one")
    top = c.mapping(src.data, (), _TOP)
    if src.data is None or not isinstance(src.data, dict):
        c.problem((), "the file holds no scenario; start from scenarios/quickstart.yaml")
    if top.get("version") != VERSION:
        c.problem(
            ("version",), f"version must be {VERSION} (got {top.get('version')!r}); add 'version: {VERSION}'"
        )
    name = top.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        c.problem(("name",), f"name must be 1-64 letters, digits, '.', '_' or '-' (got {name!r})")
        name = "unnamed"
    seed = c.number(top, "seed", (), 0, 0, 2**63 - 1, integer=True)
    cluster = _cluster(c, top.get("cluster"), Path(file).parent)
    workload = _workload(c, top.get("workload"), cluster)
    policy = _policy(c, top.get("policy"))
    safeguards = _safeguards(c, top.get("safeguards"))
    faults = _faults(
        c,
        top.get("faults"),
        ClusterFacts(
            world=cluster.supernodes * cluster.npus_per_supernode,
            steps=workload.steps,
            topology=cluster.topology(),
            checkpoint_every=policy.checkpoint.every,
        ),
        safeguards.blast_radius_percent,
    )
    expect = _expect(c, top.get("expect"))
    tags = _tags(c, top.get("tags"))
    if c.problems:
        count = len(c.problems)
        head = f"{file}: {count} problem{'s' if count > 1 else ''} in the scenario; nothing was started."
        raise ScenarioError(head + "\n  " + "\n  ".join(c.problems), problems=c.problems)
    return Scenario(
        version=VERSION,
        name=name,
        seed=seed,
        cluster=cluster,
        workload=workload,
        policy=policy,
        faults=faults,
        expect=expect,
        safeguards=safeguards,
        description=str(top.get("description", "")),
        tags=tags,
        lines={str(k[0]): v for k, v in src.lines.items() if len(k) == 1},
        file=file,
        warnings=(
            *placement_warnings(workload.layout(), cluster.topology()),
            *ladder_warnings(policy.timeouts, policy.detection),
        ),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario file at ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{p}: cannot read the scenario file ({exc}); check the path"
        raise ScenarioError(msg) from None
    return parse_scenario(text, str(p))
