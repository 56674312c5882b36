"""Link faults: links that drop, flap, slow down, set up slowly, or disagree on versions.

Each fault becomes records of :class:`testbed.fabric.linkfaults.LinkFault` with a
window of virtual time starting at the step boundary where it is injected
(``at: {step: 0}`` is before the job's first link setup), or, for the kinds
that act on messages (drop, flap, degrade), at a point of the step
(``during``): ``forward``, ``backward``, ``allreduce`` (the gradient sync),
or the step's first ``tp``, ``pp`` or ``ep`` collective, where each rank
starts the window at its own virtual time there. A job whose step computes
for 18 s would otherwise see a 13 s flap end before its first allreduce.
The sending rank applies the records, so their effect depends on virtual
time only.

Targets: ``{link: [a, b]}`` (the directed link a->b, and b->a when
``direction: both``), ``{link_class: intra | inter}`` (every link of that
class), or ``{mode: one}`` (one link the job uses, drawn from the seed;
``random`` is the older name of ``one``, as for rank targets).
``version_mismatch`` targets a rank: ``{rank: r}`` or ``{mode: one}``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from faults.evidence import Effect, Evidence, links_text
from faults.kind import ClusterFacts, FaultKind, FaultSpec, Injector, PlannedFault, Problems, register
from testbed.core.units import parse_duration
from testbed.fabric.linkfaults import LinkFault
from testbed.serve.colocation import Window
from testbed.topology.presets import INTER, INTRA

#: the mode that draws one link (or rank): Chaos Mesh's ``one``, and its older name here
_ONE = ("one", "random")

#: ``at.during`` of the link kinds that act on messages, and the point of the step each one names
LINK_POINTS = {
    "boundary": "boundary",
    "forward": "forward",
    "backward": "backward",
    "allreduce": "grad_sync",
    "tp": "tp.start",
    "pp": "pp.start",
    "ep": "ep.start",
}


def _check_step(spec: FaultSpec, facts: ClusterFacts, problems: Problems, points: tuple[str, ...]) -> None:
    step = spec.at.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= facts.steps:
        problems.append(
            (
                ("at", "step"),
                f"'at: {{step: N}}' needs N in 0..{facts.steps} (0: before the job "
                f"sets its links up), got {step!r}",
            )
        )
    allowed = {"step", "during"} if len(points) > 1 else {"step"}
    extra = sorted(set(spec.at) - allowed)
    if extra:
        takes = "'at: {step: N, during: P}'" if len(points) > 1 else "'at: {step: N}'"
        problems.append((("at", extra[0]), f"unknown trigger field '{extra[0]}'; this kind takes {takes}"))
    during = spec.at.get("during", "boundary")
    if "during" in spec.at and during not in points:
        problems.append(
            (("at", "during"), f"'during: {during}' is not a point of a step; use one of {', '.join(points)}")
        )
    elif during != "boundary" and step == 0:
        problems.append(
            (("at", "step"), "step 0 is before the first step: 'during' needs a step of 1 or more")
        )


def _check_durations(spec: FaultSpec, names: tuple[str, ...], problems: Problems) -> None:
    for name in names:
        if name in spec.params and parse_duration(spec.params[name]) is None:
            problems.append(
                ((name,), f"'{spec.params[name]}' is not a duration; write seconds or '30s', '150ms', '2h'")
            )


class _LinkKind(FaultKind):
    """Shared target handling of the link fault kinds."""

    durations: ClassVar[tuple[str, ...]] = ("duration",)
    acts_on_links = True
    #: the ``during`` values this kind takes (those that act on messages take every point of a step)
    points: ClassVar[tuple[str, ...]] = ("boundary",)

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """Target, trigger and durations."""
        problems: Problems = []
        _check_step(spec, facts, problems, self.points)
        _check_durations(spec, self.durations, problems)
        t = spec.target
        if "link" in t:
            link = t["link"]
            ok = isinstance(link, list) and len(link) == 2 and all(isinstance(x, int) for x in link)
            if not ok or not all(0 <= x < facts.world for x in link) or link[0] == link[1]:
                problems.append(
                    (
                        ("target", "link"),
                        f"'link: {link!r}' must be two different ranks in 0..{facts.world - 1}, like [0, 1]",
                    )
                )
        elif "link_class" in t:
            if t["link_class"] not in (INTRA, INTER):
                problems.append(
                    (
                        ("target", "link_class"),
                        f"link_class must be {INTRA} or {INTER}, got {t['link_class']!r}",
                    )
                )
        elif t.get("mode") not in _ONE:
            problems.append(
                (
                    ("target",),
                    "a link fault targets {link: [a, b]}, {link_class: intra|inter} or {mode: one}",
                )
            )
        if spec.params.get("direction", "both") not in ("both", "one"):
            problems.append((("direction",), "direction must be both or one"))
        return problems

    def links(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> list[tuple[int, int]]:
        """The directed links the fault hits, resolved from the seed."""
        t = spec.target
        if "link" in t:
            pairs = [(int(t["link"][0]), int(t["link"][1]))]
        elif "link_class" in t:
            topo = facts.topology
            return [
                (a, b)
                for a in range(facts.world)
                for b in range(facts.world)
                if a != b and topo.link(a, b).name == t["link_class"]
            ]
        else:
            pool = list(facts.job_links)
            pairs = [pool[int(spec.stream(seed, "link").integers(len(pool)))]] if pool else []
        if spec.params.get("direction", "both") == "both":
            pairs += [(b, a) for a, b in pairs]
        return sorted(set(pairs))

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """Resolve the links; durations to seconds."""
        params: dict[str, Any] = {**self.params, **spec.params}
        for name in self.durations:
            value = params.get(name)
            params[name] = None if value is None else parse_duration(value)
        params["links"] = [list(p) for p in self.links(spec, seed, facts)]
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=-1,
            step=int(spec.at["step"]),
            point=LINK_POINTS[spec.at.get("during", "boundary")],
            params=params,
        )

    def records(self, fault: PlannedFault, t0: float) -> list[LinkFault]:
        """The link-fault records of this fault, starting at ``t0``."""
        raise NotImplementedError

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Put the records in force from now on, or (``during``) from the point of the step where
        each rank starts them: then the record gives the window's ``length_s`` instead of its end."""
        if fault.point != "boundary":
            anchor = (fault.step, fault.point)
            recs = [dataclasses.replace(r, anchor=anchor) for r in self.records(fault, 0.0)]
            injector.add_link_faults(recs)
            length = max((r.t1 for r in recs), default=0.0)
            lasts = None if math.isinf(length) else length
            return {"links": fault.params["links"], "anchor": fault.point, "t0": None, "length_s": lasts}
        t0 = injector.now()
        recs = self.records(fault, t0)
        injector.add_link_faults(recs)
        end = max((r.t1 for r in recs), default=t0)
        return {"links": fault.params["links"], "t0": t0, "t_end": None if math.isinf(end) else end}

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """Lift every record of this fault."""
        injector.remove_link_faults(fault.id)

    #: what one hit of this kind is, for the effect's words
    acted: ClassVar[str] = "message(s) acted on"

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """What the ranks counted this fault acting on; if nothing, which links the job did use."""
        links = [tuple(link) for link in fired.get("params", {}).get("links", [])]
        hits = evidence.hits(fired.get("id", ""))
        if hits:
            return Effect(True, f"{hits} {self.acted} on {links_text(links)}")
        return Effect(False, self.idle(links, evidence))

    def idle(self, links: list[tuple[int, ...]], evidence: Evidence) -> str:
        """Why no message met the fault: no collective sent on its links while it was in force."""
        ends = {r for link in links for r in link if r >= 0}
        near = sorted(link for link in evidence.links_used() if ends & set(link))
        used = f"; the job sends on {links_text(near, 6)}" if near else ""
        return f"no collective sent on {links_text(links)} while it was in force{used}"


def _until(t0: float, duration: float | None) -> float:
    return math.inf if duration is None else t0 + duration


@register
class LinkDrop(_LinkKind):
    """The link delivers nothing (both ways or one way), for a duration or for good."""

    name = "link_drop"
    real_failure = True
    acted = "message(s) dropped"
    description = "a link delivers nothing, both ways or one way, for a duration or for good"
    points = tuple(LINK_POINTS)
    params: ClassVar[dict[str, Any]] = {"duration": None, "direction": "both"}

    def records(self, fault: PlannedFault, t0: float) -> list[LinkFault]:
        """One drop window per directed link."""
        t1 = _until(t0, fault.params["duration"])
        return [LinkFault(fault.id, "drop", a, b, t0, t1) for a, b in fault.params["links"]]


@register
class LinkFlap(_LinkKind):
    """The link goes down and up again, ``cycles`` times."""

    name = "link_flap"
    real_failure = True
    acted = "message(s) dropped"
    description = "a link goes down for 'down' then up for 'up', 'cycles' times"
    points = tuple(LINK_POINTS)
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "down": ("seconds", "how long the link is down in each cycle"),
        "up": ("seconds", "how long it is up between two downs"),
        "cycles": ("integer", "how many times it goes down"),
    }
    params: ClassVar[dict[str, Any]] = {"down": "2s", "up": "3s", "cycles": 3, "direction": "both"}
    durations = ("down", "up")

    def records(self, fault: PlannedFault, t0: float) -> list[LinkFault]:
        """A drop window per cycle per directed link."""
        down, up, cycles = fault.params["down"], fault.params["up"], int(fault.params["cycles"])
        return [
            LinkFault(fault.id, "drop", a, b, t0 + k * (down + up), t0 + k * (down + up) + down)
            for k in range(cycles)
            for a, b in fault.params["links"]
        ]


@register
class LinkDegrade(_LinkKind):
    """The link is slower: a bandwidth factor, added latency, seeded jitter."""

    name = "link_degrade"
    acted = "message(s) slowed"
    serves = True
    description = "a link's bandwidth is multiplied by a factor, with added latency and jitter"
    points = tuple(LINK_POINTS)
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "bandwidth_factor": ("number", "the share of the link's bandwidth left, in (0, 1]"),
        "add_latency": ("seconds", "latency added to each message"),
        "jitter": ("seconds", "up to this much more per message, drawn from the seed"),
    }
    params: ClassVar[dict[str, Any]] = {
        "bandwidth_factor": 0.1,
        "add_latency": 0.0,
        "jitter": 0.0,
        "duration": None,
        "direction": "both",
    }
    durations = ("add_latency", "jitter", "duration")

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """Also: the factor is in (0, 1]."""
        problems = super().validate(spec, facts)
        factor = spec.params.get("bandwidth_factor", 0.1)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            problems.append((("bandwidth_factor",), f"bandwidth_factor must be in (0, 1], got {factor!r}"))
        return problems

    def serving_windows(self, spec: FaultSpec, start_s: float) -> list[tuple[int, Window]]:
        """Each serving instance at an end of the link: its collectives' bandwidth times the factor,
        each hop ``add_latency`` longer, for ``duration``."""
        p = {**self.params, **spec.params}
        duration = parse_duration(p["duration"]) if p["duration"] is not None else None
        end = _until(start_s, duration)
        add = parse_duration(p["add_latency"]) or 0.0
        window = Window(start_s, end, "link", factor=float(p["bandwidth_factor"]), add_latency_s=add)
        return [(int(rank), window) for rank in spec.target["link"]]

    def records(self, fault: PlannedFault, t0: float) -> list[LinkFault]:
        """One degrade window per directed link."""
        p = fault.params
        t1 = _until(t0, p["duration"])
        return [
            LinkFault(
                fault.id,
                "degrade",
                a,
                b,
                t0,
                t1,
                bw_factor=float(p["bandwidth_factor"]),
                add_latency_s=p["add_latency"] or 0.0,
                jitter_s=p["jitter"] or 0.0,
            )
            for a, b in p["links"]
        ]


@register
class LinkSetupDelay(_LinkKind):
    """Setting the link up takes longer; past the connect timeout the setup fails."""

    name = "link_setup_delay"
    acted = "link set-up(s) delayed"
    description = "link setup takes 'delay' longer; past the connect timeout it fails (EI0006)"
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "delay": ("seconds", "how much longer each link setup in the window takes"),
    }
    params: ClassVar[dict[str, Any]] = {"delay": "150s", "duration": None, "direction": "both"}
    durations = ("delay", "duration")

    def idle(self, links: list[tuple[int, ...]], evidence: Evidence) -> str:
        """No link was set up on its links while it was in force (set up before, or never used)."""
        used = evidence.links_used()
        if any(link in used for link in links):
            return (
                f"no link was set up on {links_text(links)} while it was in force: the job set them up "
                "before it (a re-link after a restart would meet it)"
            )
        return super().idle(links, evidence)

    def records(self, fault: PlannedFault, t0: float) -> list[LinkFault]:
        """One setup-delay window per directed link."""
        t1 = _until(t0, fault.params["duration"])
        return [
            LinkFault(fault.id, "setup_delay", a, b, t0, t1, setup_delay_s=fault.params["delay"])
            for a, b in fault.params["links"]
        ]


@register
class VersionMismatch(_LinkKind):
    """A rank's stack reports another communication-library version: its link setups fail (EI0005)."""

    name = "version_mismatch"
    acts_on_links = False  # it targets a rank's stack, not a link
    acted = "link set-up(s) under the other version"
    description = "a rank reports another communication library version; link setup fails (EI0005)"
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "version": ("text", "the communication-stack version the rank reports"),
    }
    params: ClassVar[dict[str, Any]] = {"version": "HCCL 7.0.0", "duration": None}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """The target is a rank."""
        problems: Problems = []
        _check_step(spec, facts, problems, self.points)
        _check_durations(spec, self.durations, problems)
        rank = spec.target.get("rank")
        if spec.target.get("mode") not in _ONE and (not isinstance(rank, int) or not 0 <= rank < facts.world):
            problems.append(
                (
                    ("target",),
                    f"version_mismatch targets {{rank: N}} with N in 0..{facts.world - 1}, or {{mode: one}}",
                )
            )
        return problems

    def links(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> list[tuple[int, int]]:
        """Not links: the one rank whose stack differs, as ``[(rank, -1)]``."""
        rank = spec.target.get("rank")
        if rank is None:
            rank = int(spec.stream(seed, "rank").integers(facts.world))
        return [(int(rank), -1)]

    def idle(self, links: list[tuple[int, ...]], evidence: Evidence) -> str:
        """No link of the rank was set up while its version differed."""
        ((rank, _),) = links
        return f"no link of rank {rank} was set up while it reported the other version"

    def records(self, fault: PlannedFault, t0: float) -> list[LinkFault]:
        """The rank's reported version, from now on."""
        ((rank, _),) = fault.params["links"]
        return [
            LinkFault(
                fault.id,
                "version",
                rank,
                -1,
                t0,
                _until(t0, fault.params["duration"]),
                version=str(fault.params["version"]),
            )
        ]
