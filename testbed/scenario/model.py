"""The scenario: one typed, versioned model, each field declared once.

Every field of a section carries its declaration (:mod:`testbed.scenario.fields`:
kind, unit, bounds, default, doc); the parser (:mod:`testbed.scenario.parse`)
and the JSON Schema (:mod:`testbed.scenario.schema`) both read it. The model
holds no parsing: a :class:`Scenario` is what a valid file means.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from faults.kind import FaultSpec, kinds
from testbed.core.errors import ScenarioError
from testbed.core.registry import STRATEGIES
from testbed.fabric.device_memory import POLICIES as MEMORY_POLICIES
from testbed.scenario.expect import INTEGRITY_KEYS, LATER_EXPECT_KEYS, SERVING_KEYS, Expect
from testbed.scenario.fields import (
    SIZE_PATTERN,
    Spec,
    choice,
    custom,
    flag,
    integer,
    number,
    seconds,
    seconds_schema,
    section,
)
from testbed.scenario.hostfit import LocalEstimate, workload_bytes
from testbed.scenario.integrity_section import IntegrityPolicy
from testbed.scenario.job_section import JobSection
from testbed.scenario.preemption_section import PreemptionPolicy
from testbed.scenario.serve_section import ServeSection
from testbed.topology.layout import Layout
from testbed.topology.presets import PRESETS, Topology
from testbed.train.checkpoint import COMPONENTS

VERSION = 1
ALGORITHMS = ("auto", "ring", "mesh", "halving_doubling", "hierarchical", "recursive_doubling")
#: Device memory is the preset's HBM scaled down by this factor, unless a scenario sets it.
HBM_SCALE = 1e-4
#: serve fields added after scenarios were written, with their defaults: left there, a scenario
#: hashes as it did before they existed
LATER_SERVE_FIELDS: dict[str, object] = {"ranks_per_instance": 1, "autoscale": None, "disaggregation": None}
#: ``policy.checkpoint`` fields added later, at their defaults: left out of the digest, as before them
LATER_CHECKPOINT_FIELDS: dict[str, object] = {"fencing": "epoch"}
#: ``job`` fields added later, at their defaults: left out of the digest, as before them
LATER_JOB_FIELDS: dict[str, object] = {"cluster": ()}
#: the most NPUs any preset's supernode holds (a preset's own cap is checked against it)
MAX_NPUS = max(p.max_npus_per_supernode for p in PRESETS.values())


def _size_schema() -> dict[str, Any]:
    return {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": SIZE_PATTERN}]}


def _components_schema() -> dict[str, Any]:
    return {"type": "array", "items": {"enum": sorted(COMPONENTS)}}


def _workloads() -> list[str]:
    from workloads import WORKLOADS

    return sorted(WORKLOADS)


def _duration_schema() -> dict[str, Any]:
    return seconds_schema(0)


@dataclass(frozen=True)
class ClusterSpec:
    """``cluster``: a preset, its size, and each NPU's device memory in bytes (0: HBM x 1e-4)."""

    preset: str = choice("atlas-900-a3", lambda: PRESETS, "preset", "the hardware preset")
    supernodes: int = integer(2, 1, 64, "supernodes in the cluster")
    npus_per_supernode: int = integer(4, 1, MAX_NPUS, "NPUs in each supernode (at most the preset's)")
    device_memory: int = custom(
        0, "device_memory", _size_schema, "each NPU's device memory: bytes or '16MiB' (0: the HBM x 1e-4)"
    )
    #: NPUs of the modelled job for the link-setup load (0: the cluster's): each group sets up as
    #: many links at once as it would at that scale
    modelled_npus: int = integer(0, 0, 1_000_000, "link setup at the scale of this many NPUs")

    #: keys a file may write that the parser consumes (a rank table gives preset and sizes)
    inputs: ClassVar[dict[str, Spec]] = {
        "rank_table": Spec(
            "text",
            "an HCCL rank table (JSON 1.0 or 1.2) beside the scenario, instead of preset, supernodes and "
            "npus_per_supernode",
        )
    }

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
    """``workload``: which model, how long, how parallel (``parallel: {dp, tp, pp, ep}``), and the
    model's own options (written beside the other fields)."""

    name: str = choice("mlp", _workloads, "workload", "the model")
    steps: int = integer(60, 1, 100_000, "training steps")
    dp: int = 8
    tp: int = 1
    pp: int = 1
    ep: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    #: FLOPs of the modelled job per FLOP the numpy model computes (virtual compute time only)
    compute_scale: float = number(
        1.0, 1e-3, 1e15, "FLOPs of the modelled job per numpy FLOP (a job section derives it)"
    )
    #: bytes of the modelled job's state per byte the numpy model holds (virtual checkpoint, load,
    #: snapshot and replica-transfer time only; the files on disk are the numpy model's)
    state_scale: float = number(
        1.0, 1e-3, 1e15, "bytes of the modelled job's state per numpy byte (a job section derives it)"
    )

    inputs: ClassVar[dict[str, Spec]] = {
        "parallel": Spec("custom", "dp x tp x pp x ep = the NPUs", parser="parallel"),
    }

    def layout(self) -> Layout:
        """The parallel layout."""
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, ep=self.ep)


@dataclass(frozen=True)
class CheckpointPolicy:
    """``policy.checkpoint``: interval (0: never), components saved and restored, how many kept (0: all)."""

    every: int = integer(10, 0, doc="steps between checkpoints (0: none)")
    include: tuple[str, ...] = custom(
        ("params", "optimizer", "lr_scheduler", "rng", "data_cursor"),
        "components",
        _components_schema,
        "the components each rank's shard saves",
    )
    keep: int = integer(0, 0, doc="committed checkpoints kept (0: all)")
    #: snapshot to host memory, then persist in the background while training goes on
    async_: bool = flag(False, "snapshot to host memory, persist in the background", key="async")
    #: what a resume loads (default: everything saved); leaving one out rehearses "saved but never restored"
    restore: tuple[str, ...] = custom(
        ("params", "optimizer", "lr_scheduler", "rng", "data_cursor"),
        "components",
        _components_schema,
        "the components a resume loads (default: what include saves)",
    )
    #: how the storage keeps a replaced process's late commit out: a fence at the newest group epoch
    fencing: str = choice(
        "epoch",
        lambda: ("epoch", "none"),
        "fencing",
        "epoch: a commit carrying an older group epoch than the storage's fence is refused; none: any lands",
    )
    #: in-memory replicas every this many steps (None: every step under the replica strategy, else never)
    replica_every: int | None = integer(None, 0, doc="in-memory replicas every N steps", optional=True)

    def replicas_every(self, by_default: bool) -> int:
        """How often in-memory replicas are taken (0: never); unset, every step when the strategy
        takes them ``by_default``."""
        if self.replica_every is not None:
            return self.replica_every
        return 1 if by_default else 0


@dataclass(frozen=True)
class LearnPolicy:
    """``policy.timeouts.learn``: the recipe's settings (present in a scenario: learning is on)."""

    safety_factor: float = number(5.0, 1.0, 1000.0, "timeout = the longest interval seen x this")
    warmup_steps: int = integer(2, 0, doc="steps after a start or restart not learned from")
    min_samples: int = integer(5, 1, doc="step samples before the step timeout counts")
    blend: float = number(0.5, 0.0, 1.0, "weight of the value saved before")


@dataclass(frozen=True)
class TimeoutPolicy:
    """``policy.timeouts``: HCCL_CONNECT_TIMEOUT and HCCL_EXEC_TIMEOUT (seconds), HCCL_RDMA_TIMEOUT (an
    exponent) and HCCL_RDMA_RETRY_CNT, and the framework's process-group timeout (seconds; unset: not
    checked)."""

    connect_s: float = seconds(120.0, 120.0, 7200.0, "HCCL_CONNECT_TIMEOUT (HCCL accepts 120-7200)")
    exec_s: float = seconds(1836.0, 1.0, doc="HCCL_EXEC_TIMEOUT")
    rdma_timeout: int = integer(20, 5, 24, "HCCL_RDMA_TIMEOUT (an exponent; HCCL accepts 5-24)")
    rdma_retry_cnt: int = integer(7, 1, 7, "HCCL_RDMA_RETRY_CNT (HCCL accepts 1-7)")
    pg_timeout_s: float | None = seconds(None, 1.0, doc="the process-group timeout", optional=True)
    #: learned timeouts (:mod:`testbed.recovery.learned`); None: not learned
    learn: LearnPolicy | None = section(LearnPolicy, "learned timeouts (present: on)", present_is_on=True)


@dataclass(frozen=True)
class DetectionPolicy:
    """``policy.detection``: node heartbeat (MindCluster: every 5 s, dead after 3 missed)."""

    heartbeat_s: float = seconds(5.0, 0.001, doc="heartbeat interval")
    missed: int = integer(3, 1, doc="missed heartbeats before a node is dead")

    @property
    def timeout_s(self) -> float:
        """From a node's death to its detection: ``heartbeat_s x missed``."""
        return self.heartbeat_s * self.missed


@dataclass(frozen=True)
class OpRetryPolicy:
    """``policy.recovery.op_retry``: HCCL's op retry on A3 (1 retry, 5 s hold, 1 s interval)."""

    retries: int = integer(1, 0, doc="retries of a failed collective")
    hold_s: float = seconds(5.0, 0.0, doc="hold before a retry")
    interval_s: float = seconds(1.0, 0.0, doc="interval before a retry")


@dataclass(frozen=True)
class RecoveryPolicy:
    """``policy.recovery``: strategy, restart budget, modelled costs (process restart, spare activation),
    op retry, hot spares per supernode."""

    strategy: str = choice("restart", lambda: STRATEGIES, "recovery strategy", "how the job recovers")
    max_restarts: int = integer(3, 0, doc="restarts before the run is aborted")
    restart_s: float = seconds(30.0, 0.0, doc="a process restart's cost")
    op_retry: OpRetryPolicy = section(OpRetryPolicy, "HCCL op retry")
    spares_per_supernode: int = integer(1, 0, 64, "hot spares in each supernode")
    spare_s: float = seconds(5.0, 0.0, doc="a spare's activation cost")
    #: elastic: how long until the lost NPU's replacement is ready and its replica rejoins
    replace_s: float = seconds(120.0, 0.0, doc="elastic: until the replacement is ready")


@dataclass(frozen=True)
class MemoryPolicy:
    """``policy.memory``: what an allocation that does not fit does, and the supernode pool share."""

    on_oom: str = choice(
        "none", lambda: MEMORY_POLICIES, "memory policy", "what an allocation that fails does"
    )
    pool_share: float = number(0.25, 0.0, 1.0, "each NPU's share lent to its supernode's pool")


@dataclass(frozen=True)
class CollectivesPolicy:
    """``policy.collectives``: the gradient allreduce's algorithm, and the warm-up of its links."""

    algorithm: str = choice("auto", lambda: ALGORITHMS, "allreduce algorithm", "the gradient allreduce's")
    warmup: bool = flag(True, "set the links up before the first step")


@dataclass(frozen=True)
class Policy:
    """``policy``: what the job does about checkpoints, timeouts, detection and recovery."""

    checkpoint: CheckpointPolicy = section(CheckpointPolicy)
    timeouts: TimeoutPolicy = section(TimeoutPolicy)
    detection: DetectionPolicy | None = section(DetectionPolicy, "null: no heartbeat", nullable=True)
    recovery: RecoveryPolicy = section(RecoveryPolicy)
    collectives: CollectivesPolicy = section(CollectivesPolicy)
    memory: MemoryPolicy = section(MemoryPolicy)
    integrity: IntegrityPolicy | None = section(
        IntegrityPolicy, "silent data corruption: detectors, recovery (off when absent)", present_is_on=True
    )
    preemption: PreemptionPolicy | None = section(
        PreemptionPolicy,
        "the notice, grace and launcher timeout a preemption comes with (their ladder is checked)",
        present_is_on=True,
    )


@dataclass(frozen=True)
class Safeguards:
    """``safeguards``: conditions that abort the run (exit 3), whatever the checks would say."""

    #: a loss that is NaN or infinite ends the run (training has diverged)
    nan_loss: bool = flag(True, "a NaN or infinite loss ends the run")
    #: more failures than this in the main phase end the run (None: no limit beyond max_restarts)
    max_failures: int | None = integer(None, 0, doc="more failures end the run", optional=True)
    #: wall-clock seconds the run may take (None: no budget)
    wall_s: float | None = custom(None, "wall_budget", _duration_schema, "a wall-time budget")
    #: the most ranks one fault may reach, as a percentage of the cluster (:mod:`faults.targets`)
    blast_radius_percent: float = number(50.0, 0.0, 100.0, "the most ranks one fault may reach, in %")


#: the largest seed a scenario may give (numpy seeds take any non-negative integer; JSON and YAML
#: readers keep 64-bit integers exact)
SEED_MAX = 2**63 - 1


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
    #: the modelled job (None: the proxy's own sizes and times, scaled by ``compute_scale``)
    job: JobSection | None = None
    #: the modelled serving deployment (None: the scenario serves nothing)
    serve: ServeSection | None = None
    #: the line of each top-level section in the file, for messages about a section as a whole
    lines: dict[str, int] = field(default_factory=dict)
    #: ``FIELD=VALUE`` changes made to the file's content (``--set``; sweeps, comparisons, tuning)
    overrides: tuple[str, ...] = ()

    @property
    def serves(self) -> bool:
        """It serves a request stream (``serve.stream``): instead of training, or beside it."""
        return self.serve is not None and self.serve.stream is not None

    @property
    def trains(self) -> bool:
        """It trains its workload: alone, or with serving beside it (``serve.colocation``)."""
        return not self.serves or (self.serve is not None and self.serve.colocation is not None)

    @property
    def corrupts_silently(self) -> bool:
        """A fault of the scenario corrupts data without a word (a kind with the ``silent`` trait)."""
        return any(kinds()[f.kind].silent for f in self.faults)

    def where(self, section: str) -> str:
        """``file:line`` of a top-level section (``file`` alone when the section is not written)."""
        line = self.lines.get(section)
        return f"{self.file or self.name}:{line}" if line else self.file or self.name

    def local_estimate(self) -> LocalEstimate:
        """The system memory a local run of this scenario needs (every NPU, supervisor and spare)."""
        c, w, r = self.cluster, self.workload, self.policy.recovery
        hot = getattr(STRATEGIES.get(r.strategy), "hot_spares", False)
        spares = r.spares_per_supernode * c.supernodes if hot else 0
        npus = c.supernodes * c.npus_per_supernode + spares
        return LocalEstimate.of(c.supernodes, npus, workload_bytes(w.name, w.options, w.layout()))

    def with_seed(self, seed: int) -> Scenario:
        """The same scenario under another seed (a whole number in ``0..SEED_MAX``)."""
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
            raise ScenarioError(
                f"seed {seed!r}: a seed is a non-negative integer of at most 2**63 - 1; pass another",
                seed=repr(seed),
            )
        return replace(self, seed=seed)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the plan hash and the report use it)."""
        return asdict(self)

    def digest(self) -> str:
        """sha256 of the scenario's content (not its file name, nor the warnings derived from it)."""
        unhashed = ("file", "warnings", "lines", "overrides")  # the changes' effect is in the content
        body = {k: v for k, v in self.as_dict().items() if k not in unhashed}
        for optional in ("job", "serve"):  # absent, a section hashes as it did before it existed
            if body.get(optional) is None:
                body.pop(optional, None)
        for later in ("integrity", "preemption"):  # absent, a later policy section hashes as before
            if body["policy"].get(later) is None:
                body["policy"].pop(later, None)
        for key in (*SERVING_KEYS, *INTEGRITY_KEYS, *LATER_EXPECT_KEYS):  # so does an expect key left unset
            if body["expect"].get(key) is None:
                body["expect"].pop(key, None)
        for key, default in LATER_SERVE_FIELDS.items():  # and a later serve field at its default
            if body.get("serve") and body["serve"].get(key) == default:
                body["serve"].pop(key)
        for key, default in LATER_CHECKPOINT_FIELDS.items():  # and a later checkpoint field likewise
            if body["policy"]["checkpoint"].get(key) == default:
                body["policy"]["checkpoint"].pop(key)
        for key, default in LATER_JOB_FIELDS.items():  # and a later job field likewise
            if body.get("job") and body["job"].get(key) == default:
                body["job"].pop(key)
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
