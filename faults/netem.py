"""``link_netem``: a link as Linux netem and Chaos Mesh's NetworkChaos shape it.

Loss (with correlation), delay with jitter, duplicates, reordering (with a
gap), corruption and a rate cap on the targeted links, with ``link_degrade``'s
targets, ``direction``, ``at`` and ``duration``. The sending rank applies them
per message from a seeded stream of its own per link
(:mod:`testbed.fabric.netem` has the formulas); a lost or corrupted message
goes through the transport's retransmission, which costs virtual time, and
never arrives wrong unless the entry says the transport has no checksum
(``checksum: false``). docs/netem.md maps a NetworkChaos manifest to an entry.
"""

from __future__ import annotations

from typing import Any, ClassVar

from faults.evidence import Effect, Evidence, links_text
from faults.kind import ClusterFacts, FaultSpec, PlannedFault, Problems, register
from faults.link import LINK_POINTS, _LinkKind, _until
from testbed.core.units import AMBIGUOUS_RATE, parse_duration, parse_rate
from testbed.fabric.linkfaults import LinkFault
from testbed.fabric.netem import RDMA_RTO_S, Netem

#: the fields that are fractions of the messages, in [0, 1]
FRACTIONS = ("loss", "duplicate", "reorder", "corrupt")
#: the fields of which one at least must act
ACTING = (*FRACTIONS, "delay", "jitter", "rate")


def _fraction(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 <= value <= 1.0


@register
class LinkNetem(_LinkKind):
    """netem on a link: loss, delay and jitter, duplicates, reordering, corruption, a rate cap."""

    name = "link_netem"
    acted = "message(s) through netem"
    description = (
        "netem on a link (Chaos Mesh NetworkChaos): loss, delay with jitter, duplicates, reordering, "
        "corruption and a rate cap, through the transport's retransmissions and checksum"
    )
    points = tuple(LINK_POINTS)
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "loss": ("number", "the share of transmissions lost, in [0, 1): each is sent again after a timeout"),
        "correlation": (
            "number",
            "in [0, 1): each random draw is correlation * the previous + (1 - correlation) * a fresh one",
        ),
        "delay": ("seconds", "latency added to each message"),
        "jitter": ("seconds", "the added latency varies uniformly by up to this much either way"),
        "duplicate": ("number", "the share of messages sent twice, in [0, 1] (the copy is discarded)"),
        "reorder": ("number", "the share of candidate messages that overtake the 'gap' before them"),
        "gap": ("integer", "every gap-th message is a candidate for reordering (netem's gap)"),
        "corrupt": ("number", "the share of transmissions with one bit flipped, in [0, 1]"),
        "rate": ("rate", "the link's bandwidth is capped at this: min(rated, rate)"),
        "checksum": ("boolean", "the transport checks each message's CRC (false: corruption is silent)"),
        "retransmit_timeout": (
            "seconds",
            "how long a sender waits before it sends a lost message again (HCCL_RDMA_TIMEOUT's default)",
        ),
    }
    params: ClassVar[dict[str, Any]] = {
        "loss": 0.0,
        "correlation": 0.0,
        "delay": 0.0,
        "jitter": 0.0,
        "duplicate": 0.0,
        "reorder": 0.0,
        "gap": 1,
        "corrupt": 0.0,
        "rate": None,
        "checksum": True,
        "retransmit_timeout": RDMA_RTO_S,
        "duration": None,
        "direction": "both",
    }
    durations = ("delay", "jitter", "retransmit_timeout", "duration")

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """Also: fractions in [0, 1] (loss and corrupt below 1), correlation below 1, a whole gap, a
        rate above zero, a boolean checksum, a timeout above zero, and something to do."""
        problems = super().validate(spec, facts)
        p = spec.params
        for name in FRACTIONS:
            value = p.get(name, 0.0)
            if not _fraction(value):
                problems.append(
                    ((name,), f"{name} is a fraction of the messages in [0, 1] (0.05: 5%), got {value!r}")
                )
            elif name == "loss" and value == 1:
                problems.append(
                    (
                        ("loss",),
                        "loss: 1 loses every transmission, so nothing ever arrives; use link_drop for a "
                        "dead link, or a loss below 1",
                    )
                )
        corr = p.get("correlation", 0.0)
        if not _fraction(corr) or corr == 1:
            problems.append(
                (("correlation",), f"correlation must be in [0, 1) (netem's percent / 100), got {corr!r}")
            )
        gap = p.get("gap", 1)
        if isinstance(gap, bool) or not isinstance(gap, int) or gap < 1:
            problems.append((("gap",), f"gap must be a whole number of at least 1, got {gap!r}"))
        if "rate" in p and p["rate"] is not None and parse_rate(p["rate"]) is None:
            problems.append(
                (
                    ("rate",),
                    f"rate must be a bandwidth above zero, like 10gbit or 10Gbit/s (bits) or 1.25GB/s "
                    f"(bytes per second), got {p['rate']!r}"
                    + (f"; {AMBIGUOUS_RATE}" if "bps" in str(p["rate"]).lower() else ""),
                )
            )
        if not isinstance(p.get("checksum", True), bool):
            problems.append((("checksum",), f"checksum must be true or false, got {p['checksum']!r}"))
        if parse_duration(p.get("retransmit_timeout", RDMA_RTO_S)) == 0.0:
            problems.append((("retransmit_timeout",), "retransmit_timeout must be above zero, like 4s"))
        if not any(p.get(name) for name in ACTING):
            problems.append(
                (
                    (),
                    "this link_netem does nothing: set at least one of loss, delay, jitter, duplicate, "
                    "reorder, corrupt or rate",
                )
            )
        return problems

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """Also the rate in bytes per second."""
        planned = super().plan(spec, seed, facts)
        rate = planned.params.get("rate")
        planned.params["rate_Bps"] = None if rate is None else parse_rate(rate)
        return planned

    def records(self, fault: PlannedFault, t0: float) -> list[LinkFault]:
        """One netem window per directed link."""
        p = fault.params
        netem = Netem(
            loss=float(p["loss"]),
            correlation=float(p["correlation"]),
            delay_s=p["delay"] or 0.0,
            jitter_s=p["jitter"] or 0.0,
            duplicate=float(p["duplicate"]),
            reorder=float(p["reorder"]),
            gap=int(p["gap"]),
            corrupt=float(p["corrupt"]),
            rate_Bps=p["rate_Bps"],
            checksum=bool(p["checksum"]),
            rto_s=p["retransmit_timeout"] or RDMA_RTO_S,
        )
        t1 = _until(t0, p["duration"])
        return [LinkFault(fault.id, "netem", a, b, t0, t1, netem=netem) for a, b in p["links"]]

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """The messages it acted on, and what it did to them (the ranks' own counts)."""
        fid = str(fired.get("id", ""))
        links = [tuple(link) for link in fired.get("params", {}).get("links", [])]
        hits = evidence.hits(fid)
        if not hits:
            return Effect(False, self.idle(links, evidence))
        what = ("lost", "corrupted", "duplicated", "reordered")
        done = ", ".join(f"{n} {w}" for w in what if (n := evidence.hits(f"{fid}.{w}")))
        retx = evidence.hits(f"{fid}.retransmits")
        seconds = evidence.hits(f"{fid}.retransmit_us") / 1e6
        cost = f"; {retx} retransmit(s) cost {seconds:.4g} s" if retx else ""
        said = f"{hits} {self.acted} on {links_text(links)}" + (f": {done}" if done else "")
        return Effect(True, said + cost)
