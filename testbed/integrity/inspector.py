"""After each step of the main phase: run the detectors the policy names, charge their time, and
say whether training must go back.

Each check is journalled (``integrity_check``: the step, the detectors that
ran, their virtual time) and each alarm too (``sdc_detected``: the detector,
the ranks it attributes, why). A hash that agrees at a step vouches for that
step's state: a checkpoint of the step is *verified*. Attributions count as
strikes against a rank; ``strikes.count`` of them within ``strikes.window``
steps exclude its NPU.

Costs, on each rank's clock, from the job model: the validators read the
rank's local gradients once from device memory to take their norm, the hash
reads its parameters once (``bytes x state_scale / hbm_Bps`` each); the
loss and the 32-byte digests the ranks exchange cost nothing beside that.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from testbed.actors.outcome import Outcome
from testbed.core.journal import Journal
from testbed.integrity.data_skips import DataSkips
from testbed.integrity.detectors import Alarm, validate, vote
from testbed.scenario.integrity_section import IntegrityPolicy
from testbed.scenario.model import Scenario
from testbed.topology.layout import Layout


class Clocks(Protocol):
    """The run's clocks at a step boundary, as the controller's run state holds them."""

    clock_of: dict[int, float]
    held_until: dict[int, float]
    verified_steps: set[int]

    @property
    def state_scale(self) -> float:
        """Modelled bytes of state per byte the proxy holds."""


@dataclass
class Verdict:
    """What the check after one step found: its alarm (None: healthy), the ranks to exclude, and
    whether the step is to be replayed (the validators alone suspect it, and the policy replays)."""

    alarm: Alarm | None
    exclude: tuple[int, ...] = ()
    replay: bool = False


@dataclass
class Inspector:
    """The detectors' memory over a run: healthy values, verified steps, strikes, rollbacks."""

    policy: IntegrityPolicy
    layout: Layout
    hbm_Bps: float
    journal: Journal
    norms: dict[int, dict[int, float]] = field(default_factory=dict)  # rank -> step -> healthy norm
    losses: dict[int, float] = field(default_factory=dict)  # step -> healthy loss
    verified: set[int] = field(default_factory=set)  # steps whose state a hash vouched for
    strikes: dict[int, list[int]] = field(default_factory=dict)  # rank -> steps it was attributed at
    rollbacks: int = 0
    skips: DataSkips = field(default_factory=DataSkips)  # batches skipped after detections, by step

    def after_step(self, state: Clocks, phase: str, step: int, out: dict[int, Outcome]) -> Verdict:
        """Check ``step`` of ``phase`` (the main phase only), charge the time on every rank's clock,
        journal it."""
        if phase != "main":
            return Verdict(None)
        vals = {r: o.value for r, o in out.items()}
        ran, alarms = [], []
        reads = dict.fromkeys(vals, 0.0)  # bytes each rank reads from device memory
        validators, hashing = self.policy.validators, self.policy.hash
        norms = {r: float(v["grad_norm"]) for r, v in vals.items()}
        losses = [float(v["loss"]) for v in vals.values() if v.get("loss") is not None]
        loss = sum(losses) / len(losses) if losses else 0.0
        if validators is not None:
            ran.append("validator")
            for r, v in vals.items():
                reads[r] += float(v["grad_bytes"])
            history = {r: [n for _, n in sorted(self.norms.get(r, {}).items())] for r in vals}
            found = validate(
                loss, norms, [x for _, x in sorted(self.losses.items())], history, validators, self.layout
            )
            alarms += [found] if found else []
        agreed = None
        if hashing is not None and step % hashing.every == 0:
            ran.append("parameter_hash")
            for r, v in vals.items():
                reads[r] += float(v["grad_bytes"])  # the parameters: the gradients' size
            found = vote({r: str(v["digest"]) for r, v in vals.items()}, self.layout)
            agreed = found is None
            alarms += [found] if found else []
        if self.policy.checksums:
            ran.append("payload_checksum")  # checked as each payload arrived (its time is the step's)
        t_start, t = self._charge(state, reads)
        self.journal.emit(
            "integrity_check",
            phase=phase,
            step=step,
            detectors=ran,
            t_start=t_start,
            t=t,
            **({"hash_agrees": agreed} if agreed is not None else {}),
        )
        self._caught(phase, step, vals, t)
        if not alarms:
            self.record_healthy(step, out, agreed)
            return Verdict(None)
        alarm = _merge(alarms)
        # a step only the validators suspect is replayed first (if the policy says so), which strikes
        replay = self.policy.replay is not None and [a.detector for a in alarms] == ["validator"]
        exclude = () if replay else self.strike(step, alarm)
        self.journal.emit(
            "sdc_detected",
            phase=phase,
            step=step,
            detector=alarm.detector,
            detectors=[a.detector for a in alarms],
            ranks=list(alarm.ranks),
            reason=alarm.reason,
            t=t,
            **({"grad_norms": {str(r): _finite(n) for r, n in sorted(norms.items())}} if validators else {}),
        )
        return Verdict(alarm, exclude, replay)

    def _caught(self, phase: str, step: int, vals: dict[int, Any], t: float) -> None:
        """Payloads whose checksum failed were sent again within the step: journalled as detected,
        blaming the link (no rank), with nothing to roll back."""
        links = [m for r in sorted(vals) for m in vals[r].get("checksum_mismatch", [])]
        if links:
            self.journal.emit(
                "sdc_detected",
                phase=phase,
                step=step,
                detector="payload_checksum",
                detectors=["payload_checksum"],
                ranks=[],
                links=[[m["src"], m["dst"]] for m in links],
                cured=True,
                reason="; ".join(
                    f"link {m['src']}->{m['dst']}: a payload failed its checksum in the {m['half']} half "
                    "and was sent again"
                    for m in links
                ),
                t=t,
            )

    def _charge(self, state: Clocks, reads: dict[int, float]) -> tuple[float, float]:
        """Each rank's clock moves on by its reads over the device memory's bandwidth."""
        t_start = max(state.clock_of[r] for r in reads)
        scale = state.state_scale
        for r, nbytes in reads.items():
            state.clock_of[r] += nbytes * scale / self.hbm_Bps
            state.held_until[r] = max(state.held_until.get(r, 0.0), state.clock_of[r])
        return t_start, max(state.clock_of[r] for r in reads)

    def record_healthy(self, step: int, out: dict[int, Outcome], agreed: bool | None = None) -> None:
        """``step``'s result is kept as healthy: its norms and loss join the history the validators
        compare with; a hash that agreed verifies it."""
        for r, o in out.items():
            self.norms.setdefault(r, {})[step] = float(o.value["grad_norm"])
        losses = [float(o.value["loss"]) for o in out.values() if o.value.get("loss") is not None]
        self.losses[step] = sum(losses) / len(losses) if losses else 0.0
        if agreed:
            self.verified.add(step)

    def strike(self, step: int, alarm: Alarm) -> tuple[int, ...]:
        """Count the alarm's attributions; the ranks that reach the strike count are excluded."""
        rule = self.policy.strikes
        if rule is None:
            return ()
        out = []
        for r in alarm.ranks:
            seen = [s for s in self.strikes.get(r, []) if step - s < rule.window] + [step]
            self.strikes[r] = seen
            if len(seen) >= rule.count:
                out.append(r)
                self.strikes[r] = []
        return tuple(out)

    def went_back(self, step: int) -> None:
        """Training resumed after ``step``: what the detectors learned of later steps is forgotten."""
        for by_step in self.norms.values():
            for s in [s for s in by_step if s > step]:
                del by_step[s]
        for s in [s for s in self.losses if s > step]:
            del self.losses[s]
        self.verified -= {s for s in self.verified if s > step}  # in place: the run's state shares it


def inspector_for(scenario: Scenario, journal: Journal, state: Clocks) -> Inspector | None:
    """The scenario's inspector (None: no ``policy.integrity``); it shares the run's verified steps."""
    policy = scenario.policy.integrity
    if policy is None:
        return None
    hbm = float(scenario.cluster.topology().preset.hbm_Bps)
    return Inspector(policy, scenario.workload.layout(), hbm, journal, verified=state.verified_steps)


def policy_event(policy: IntegrityPolicy | None) -> dict[str, Any] | None:
    """The policy as the ``integrity`` event journals it (None: no detector)."""
    return asdict(policy) if policy is not None else None


#: what a link under netem counts when it changed a message's path: its data needs the yardstick too
_REPAIRED = tuple(f".{what}" for what in ("lost", "corrupted", "duplicated", "caught", "discarded"))


def corrupted(events: list[dict[str, Any]]) -> bool:
    """Whether data may have gone wrong in the main phase: a silent corruption struck (the journal's
    truth), or a link under netem lost, corrupted or duplicated messages (its counts in ``fault_hits``),
    which the transport repaired or, without a checksum, delivered as they were."""
    main = [e for e in events if e.get("phase") == "main"]
    if any(e.get("sdc") for e in main if e.get("event") == "step_end"):
        return True
    return any(str(k).endswith(_REPAIRED) for e in main if e.get("event") == "fault_hits" for k in e["hits"])


def _merge(alarms: list[Alarm]) -> Alarm:
    """One alarm of several detectors: the first detector's name, every attribution, every reason."""
    ranks = sorted({r for a in alarms for r in a.ranks})
    return Alarm(alarms[0].detector, tuple(ranks), "; ".join(a.reason for a in alarms))


def _finite(x: float) -> float | str:
    """A number the journal's JSON can hold (``inf``/``nan`` as text)."""
    return x if math.isfinite(x) else str(x)
