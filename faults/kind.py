"""What a fault kind is, and the registry that finds fault kinds by name.

A fault kind is a small object with ``validate`` (problems with a scenario's
fault entry), ``plan``, ``inject`` and ``heal``, and traits that say what it
is (it ends processes, it only slows, it acts on a checkpoint or on links, how
a drill draws it). The testbed's kinds live in this package, one module per
family, and register when it is imported (:func:`kinds` imports it on first
use); another installed package adds its own under the entry-point group
``testbed.fault_kinds`` (docs/extending.md).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np

from testbed.core.errors import TestbedError
from testbed.core.registry import Registry
from testbed.core.seeding import stream

if TYPE_CHECKING:
    from faults.evidence import Effect, Evidence
    from testbed.serve.colocation import Window

#: what a check of a fault entry returns: (path below the entry, message with its fix) per problem
Problems = list[tuple[tuple[str | int, ...], str]]


@dataclass(frozen=True)
class FaultSpec:
    """One fault entry of a scenario, as written (after type checks)."""

    index: int
    kind: str
    target: dict[str, Any]
    at: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    #: how many entries before this one are identical to it (they draw from separate streams)
    occurrence: int = 0
    #: for one firing of a repeated or timed entry, the entry as written (:mod:`faults.triggers`)
    origin: str = ""

    def content(self) -> str:
        """The entry as written (kind, target, trigger, fields), in a canonical form; a firing of a
        repeated or timed entry adds its step to the entry's."""
        body = {"kind": self.kind, "target": self.target, "at": self.at, "params": self.params}
        if self.origin:
            body["origin"] = self.origin
        return json.dumps(body, sort_keys=True, default=str)

    def stream_key(self) -> str:
        """A short digest naming this entry's streams (for processes that draw as the run goes)."""
        return hashlib.sha256(f"{self.content()}#{self.occurrence}".encode()).hexdigest()[:16]

    def stream(self, seed: int, label: str) -> np.random.Generator:
        """This fault's own random stream: keyed by what the entry says (and its occurrence), not by
        its place in the list, so adding or moving another fault never changes what this one draws."""
        return stream(seed, "fault", self.content(), self.occurrence, label)


@dataclass(frozen=True)
class PlannedFault:
    """A fault resolved from the seed before the run: who, when, and at which point."""

    id: str
    kind: str
    rank: int
    step: int
    point: str
    params: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for the journal and the plan."""
        return {
            "id": self.id,
            "kind": self.kind,
            "rank": self.rank,
            "step": self.step,
            "point": self.point,
            "params": dict(self.params),
        }


@dataclass(frozen=True)
class ClusterFacts:
    """What validation and planning need to know about the scenario around a fault."""

    world: int
    steps: int
    topology: Any = None
    #: directed links the job's data-parallel allreduce uses (the pool for random link targets)
    job_links: tuple[tuple[int, int], ...] = ()
    #: ``policy.checkpoint.every`` (0: no checkpoints)
    checkpoint_every: int = 0


class Injector(Protocol):
    """What the controller offers a fault kind to act on the cluster."""

    def kill_now(self, rank: int, step: int) -> dict[str, Any]:
        """SIGKILL ``rank``'s process now, between steps."""

    def arm_kill(self, rank: int, step: int, point: str) -> None:
        """Make ``rank`` get SIGKILLed when it reaches ``point`` of ``step``."""

    def arm_hang(self, rank: int, step: int, point: str) -> None:
        """Arm ``rank`` to freeze (SIGSTOP) at ``point`` of ``step``."""

    def arm_preempt(
        self, fault_id: str, ranks: list[int], step: int, point: str, windows: dict[str, Any]
    ) -> dict[str, Any]:
        """Arm ``ranks`` to get a SIGTERM at ``point`` of ``step`` (``windows``: the fault's
        ``notice_s``/``grace_s``); returns what the journal records."""

    def cut_control(self, fault_id: str, ranks: list[int], t0: float) -> None:
        """From ``t0`` the controller cannot reach ``ranks``: a failure declares them lost, though their
        processes run on."""

    def zombies_return(self, fault_id: str) -> None:
        """``fault_id`` healed: the ranks it cut off are reachable again; the processes given up act."""

    def pause_checkpoint(self, rank: int, seconds: float) -> None:
        """Make ``rank``'s write of the next checkpoint take ``seconds`` longer."""

    def lose_ray_node(self, supernode: int, step: int) -> dict[str, Any]:
        """Take down the Ray node ``supernode`` runs on, now, between steps."""

    def now(self) -> float:
        """The virtual time at this step boundary (the earliest rank's clock)."""

    def add_link_faults(self, records: list[Any]) -> None:
        """Put link-fault records (:class:`testbed.fabric.linkfaults.LinkFault`) in force on every rank."""

    def remove_link_faults(self, fault_id: str) -> None:
        """Lift every link-fault record of ``fault_id``."""

    def fragment_memory(
        self, ranks: list[int], fault_id: str, block: int, count: int, spacing: int
    ) -> dict[str, Any]:
        """Pin ``count`` blocks of ``block`` bytes, ``spacing`` bytes apart, on ``ranks``."""

    def set_knob(self, ranks: list[int] | None, name: str, value: Any) -> None:
        """Set a fault knob of the NPUs (:mod:`testbed.train.knobs`) on ``ranks`` (None: every rank)."""

    def fill_storage(self, point: str | None, code: int = 28) -> None:
        """Make the checkpoint storage full at ``point`` of every save, failing with ``code`` (an
        errno; None: it has room again)."""

    def arm_controller_kill(self, fault_id: str, point: str, torn: bool) -> None:
        """SIGKILL the run's controller process when it reaches ``point`` (``torn``: leave half a
        journal line)."""

    def set_storage_bandwidth(self, factor: float) -> None:
        """Scale the shared storage's bandwidth by ``factor`` (1 restores it)."""

    def corrupt_checkpoint(self, step: int, rank: int, component: str) -> dict[str, Any]:
        """Flip bytes in the committed checkpoint of ``step``; returns where."""

    def release_memory(self, ranks: list[int], fault_id: str) -> None:
        """Free the blocks ``fault_id`` pinned."""


def span_problems(spec: FaultSpec) -> Problems:
    """A ``for_steps`` field, if given, must be a whole number of at least 1."""
    span = spec.params.get("for_steps")
    if span is not None and (not isinstance(span, int) or isinstance(span, bool) or span < 1):
        return [(("for_steps",), f"for_steps must be a whole number of at least 1, got {span!r}")]
    return []


def one_of(value: object, names: Collection[str]) -> bool:
    """Whether ``value`` is one of ``names`` (a parameter's choices, ``at.during``'s points): a list or
    a mapping written where a name goes names none, and is never hashed to look it up."""
    return isinstance(value, str) and value in names


#: The point of a fault that acts on a checkpoint once it is committed (right after the commit of the
#: checkpoint of its step, not at a step boundary).
AFTER_COMMIT = "checkpoint.committed"


def checkpoint_step(step: int, every: int) -> int:
    """The first checkpoint step at or after ``step``."""
    return -(-step // every) * every


def step_problems(spec: FaultSpec, facts: ClusterFacts, kind: str, points: Mapping[str, str]) -> Problems:
    """``at: {step: N, during: P}``: N inside the run, P one of ``points`` (``checkpoint`` only where
    checkpoints are written, the first at or after N inside the run)."""
    step = spec.at.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 1 <= step <= facts.steps:
        return [(("at", "step"), f"{kind} needs 'at: {{step: N}}' with N in 1..{facts.steps}, got {step!r}")]
    extra = sorted(set(spec.at) - {"step", "during"})
    if extra:
        return [
            (("at", extra[0]), f"unknown trigger field '{extra[0]}'; use step and during, every, or time")
        ]
    during = spec.at.get("during", "boundary")
    if not one_of(during, points):
        return [
            (
                ("at", "during"),
                f"'during: {during}' is not a point {kind} knows; use one of {', '.join(points)}",
            )
        ]
    if during == "checkpoint":
        every = facts.checkpoint_every
        if every <= 0:
            return [(("at", "during"), "during: checkpoint needs checkpoints; set policy.checkpoint.every")]
        if checkpoint_step(step, every) > facts.steps:
            return [
                (("at", "step"), f"no checkpoint is written at or after step {step}; pick an earlier step")
            ]
    return []


def point_of(spec: FaultSpec, facts: ClusterFacts, points: Mapping[str, str]) -> tuple[int, str]:
    """The step and the point a valid ``at: {step, during}`` names (a checkpoint: the first one at or
    after the step)."""
    during = spec.at.get("during", "boundary")
    step = int(spec.at["step"])
    if during == "checkpoint":
        step = checkpoint_step(step, facts.checkpoint_every)
    return step, points[during]


def on_rank(kind: str, rank: int, step: int) -> dict[str, Any]:
    """A drawn entry's kind, ``{rank}`` target and ``{step}`` trigger."""
    return {"kind": kind, "target": {"rank": rank}, "at": {"step": step}}


def heal_step(fault: PlannedFault) -> int | None:
    """The step at whose boundary a fault planned with ``for_steps`` ends (None: it never does)."""
    span = fault.params.get("for_steps")
    return None if span is None else fault.step + int(span)


@dataclass(frozen=True)
class DrawFacts:
    """What drawing a fault entry for a scenario needs to know of it (Hypothesis schedules)."""

    world: int
    steps: int
    #: the checkpoint steps before the last step (where a checkpoint kind may act)
    checkpoints: tuple[int, ...]
    #: the saved components a corruption may hit
    corruptible: tuple[str, ...]
    #: whether one rank is within the scenario's blast-radius cap
    one_rank_fits: bool
    #: whether the scenario runs integrity detectors (``policy.integrity``)
    integrity: bool = False
    #: supernodes in the cluster (a partition needs two)
    supernodes: int = 1


#: the type and meaning of the parameters several kinds share (a kind's own ``param_docs`` win)
COMMON_PARAMS: dict[str, tuple[str, str]] = {
    "duration": ("seconds", "how long it stays in force, from when it strikes (none: for good)"),
    "direction": ("both|one", "both: the link both ways; one: only a -> b of link [a, b]"),
    "for_steps": ("integer", "it heals this many steps after it fired (none: never)"),
}


class FaultKind:
    """Base of every fault kind; subclasses set ``name``, ``description``, their traits and the hooks.

    The traits are the one statement of what a kind is; every part of the
    testbed that needs one (drawn schedules, the faults table, timeout tuning)
    reads it here.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: extra fields a scenario entry of this kind may carry, with their defaults
    params: ClassVar[dict[str, Any]] = {}
    #: what each of ``params`` is: its type (``seconds``: a number of seconds or a duration like
    #: ``30s``; ``number``; ``integer``; ``boolean``; ``size``: bytes or ``256KiB``; ``text``; or choices
    #: ``a|b``)
    #: and its meaning, for the schema and the docs (the names in :data:`COMMON_PARAMS` are shared)
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {}
    #: the triggers this kind takes besides ``at: {step: N}`` (:mod:`faults.triggers`)
    triggers: ClassVar[tuple[str, ...]] = ("every", "time")
    #: whether the target names ranks (then it is held to the blast-radius cap)
    targets_ranks: ClassVar[bool] = False
    #: it ends processes (a kill, a freeze): a drawn schedule holds at most one such fault a step
    ends_process: ClassVar[bool] = False
    #: it acts on a checkpoint (the first one at or after its step)
    acts_on_checkpoint: ClassVar[bool] = False
    #: it only slows the job down; it cannot fail it by itself
    slows_only: ClassVar[bool] = False
    #: it corrupts data and says nothing: only an integrity detector (``sdc_detected``) finds it
    silent: ClassVar[bool] = False
    #: a real failure (a process or a message lost): a timeout that misses it is too long
    real_failure: ClassVar[bool] = False
    #: it acts on links a ``{link: [a, b]}`` target names: validation warns when the job never uses them
    acts_on_links: ClassVar[bool] = False
    #: it strikes a serving run too, at ``at: {time: T}``: kills the target rank's instance (with
    #: ``ends_process``), or acts on instances for a while (:meth:`serving_windows`)
    serves: ClassVar[bool] = False
    #: its place among the kinds drills draw, plainest first (None: drills do not draw it)
    drill_order: ClassVar[int | None] = None

    def param_doc(self, name: str) -> tuple[str, str] | None:
        """The type and meaning of parameter ``name`` (None: undeclared)."""
        return self.param_docs.get(name) or COMMON_PARAMS.get(name)

    def serving_windows(self, spec: FaultSpec, start_s: float) -> list[tuple[int, Window]]:
        """For a kind that ``serves`` without ending a process: each instance's rank it acts on,
        with the window in which it does, from ``start_s`` (none by default)."""
        return []

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """Problems with ``spec`` as (path below the fault entry, message with its fix)."""
        return []

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """Resolve ``spec`` into a planned fault."""
        raise NotImplementedError

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Start the fault; returns what the journal should record."""
        raise NotImplementedError

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """End the fault (a no-op for faults that cannot end by themselves)."""

    def drawable(self, facts: DrawFacts) -> bool:
        """Whether a drill can draw an entry of this kind for a scenario with ``facts``."""
        if self.drill_order is None:
            return False
        if self.acts_on_checkpoint and not facts.checkpoints:
            return False
        return not (self.targets_ranks and not facts.one_rank_fits)

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """One entry of this kind valid for ``facts``, drawn with Hypothesis' ``draw`` (``rank``: the
        rank it targets, when it targets one)."""
        raise NotImplementedError(f"fault kind {self.name} is not drawn by drills")

    def damaged_checkpoint(self, fired: dict[str, Any]) -> int | None:
        """The step of the committed checkpoint this firing (its ``fault_injected`` event) changed on
        purpose, which no resume may load; None for a kind that changes no checkpoint."""
        return None

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect | None:
        """What the fault did, read from the journal (``fired`` is its ``fault_injected`` event), or
        why it did nothing; None when this kind cannot tell (:mod:`faults.evidence`)."""
        return None


def _a_kind(obj: Any) -> FaultKind:
    """A registered fault kind: a :class:`FaultKind` subclass (made once) or an instance of one."""
    kind = obj() if isinstance(obj, type) and issubclass(obj, FaultKind) else obj
    if not isinstance(kind, FaultKind) or not kind.name:
        raise TestbedError(
            f"{obj!r} is not a fault kind: register a subclass of testbed.FaultKind that sets 'name'",
            value=repr(obj),
        )
    return kind


#: every fault kind by name: the testbed's (registered when :mod:`faults` is imported), those other
#: installed packages declare under the entry-point group ``testbed.fault_kinds``, and those a
#: program registers with :func:`register`
FAULT_KINDS: Registry[FaultKind] = Registry("testbed.fault_kinds", "fault kind", _a_kind)

K = TypeVar("K", bound=type[FaultKind])


def register(kind: K) -> K:
    """Class decorator: make the fault kind ``kind`` usable in scenarios under ``kind.name``."""
    FAULT_KINDS.register(getattr(kind, "name", ""), kind)
    return kind


def kinds() -> dict[str, FaultKind]:
    """Every fault kind by name (imports the ``faults`` package once, then any plugin's)."""
    importlib.import_module("faults")
    return dict(FAULT_KINDS.items())
