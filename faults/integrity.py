"""Silent data corruption: a rank whose arithmetic or memory is wrong, and says nothing.

``sdc_gradient`` corrupts one rank's local gradients after its backward pass
and before the reduction (a fault in its compute); ``sdc_params`` corrupts
its parameters at rest as a step begins (a fault in its memory);
``sdc_payload`` corrupts what one link delivers in an allreduce, after any
transport check (in its reduce-scatter half the wrong chunk is reduced and
then sent to every replica; in its allgather half only the receiver's copy
is wrong). Each flips
bits (``bits``: sign, exponent, mantissa, or ``random`` k of them; or one
``bit`` by position) in ``elements`` values, or, with ``bias``, scales every
value by ``1 + bias`` (the small relative bias faulty accelerators show).
``persistence``: ``transient`` (its step only), ``intermittent`` (each step
from it on with ``probability``) or ``persistent`` (every step from it on; a
"lemon" NPU). No error is raised and no process dies: the step's journal
event records what changed (tensor, index, bits, the value before and after),
which is the truth a detector is scored against. A restart gives the rank
a new process, which the corruption does not follow.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from hypothesis import strategies as st

from faults.evidence import Effect, Evidence
from faults.kind import (
    ClusterFacts,
    DrawFacts,
    FaultKind,
    FaultSpec,
    Injector,
    PlannedFault,
    Problems,
    on_rank,
    register,
)
from faults.targets import single_rank, target_problems
from testbed.train.corruption import BIT_CHOICES, PERSISTENCE, CorruptionSpec

#: the width of the workloads' floating-point tensors, in bits (float32)
WIDTH = 32


class _Corruption(FaultKind):
    """What the kinds share; ``where`` says which arrays they strike."""

    where: ClassVar[str] = ""
    #: a kind's own parameter that takes one of a few words, and those words
    choices: ClassVar[dict[str, tuple[str, ...]]] = {}
    targets_ranks = True
    silent = True
    triggers = ()
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        "bits": ("sign|exponent|mantissa|random", "which bits of a value are flipped (random: k of them)"),
        "k": ("integer", "bits flipped per value with bits: random (1..32)"),
        "bit": ("integer", "flip this bit position instead (0..31 in the workloads' float32)"),
        "bias": ("number", "scale every value by 1 + bias instead of flipping bits (0: flip bits)"),
        "elements": ("integer", "values corrupted each time it strikes"),
        "probability": ("number", "the chance it strikes at each step it may (0..1)"),
        "persistence": (
            "transient|intermittent|persistent",
            "its step only; each step from it on with probability; every step from it on",
        ),
        "escalate_every": (
            "integer",
            "every N steps from its first it doubles the values it corrupts (and its probability); 0: never",
        ),
    }
    params: ClassVar[dict[str, Any]] = {
        "bits": "mantissa",
        "k": 1,
        "bit": None,
        "bias": 0.0,
        "elements": 1,
        "probability": 1.0,
        "persistence": "transient",
        "escalate_every": 0,
    }

    def drawable(self, facts: DrawFacts) -> bool:
        """Drawn only for a scenario that runs integrity detectors: without any, a corruption is missed
        by design (``sdc_silent_mantissa.yaml`` shows it) and a drill would only say so again."""
        return facts.integrity and super().drawable(facts)

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """A step before the last; the top exponent bit, the sign or a mantissa bit, or a relative bias
        of 1e-3; transient, intermittent (one step in two) or persistent."""
        step = draw(st.integers(1, max(1, facts.steps - 1)))
        shape = draw(st.sampled_from([{"bit": 30}, {"bits": "sign"}, {"bits": "mantissa"}, {"bias": 1e-3}]))
        persistence = draw(st.sampled_from(["transient", "intermittent", "persistent"]))
        odds = {"probability": 0.5} if persistence == "intermittent" else {}
        return {**on_rank(self.name, rank, step), **shape, "persistence": persistence, **odds}

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """One rank, a step of the run, and parameters a float32 value can take."""
        problems: Problems = target_problems(spec, facts, self.name, single=True)
        step = spec.at.get("step")
        if set(spec.at) != {"step"} or not isinstance(step, int) or isinstance(step, bool):
            problems.append((("at",), f"{self.name} needs 'at: {{step: N}}' with an integer step"))
        elif not 0 <= step < facts.steps:
            problems.append((("at", "step"), f"step {step} is outside the run: use 0..{facts.steps - 1}"))
        p = {**self.params, **spec.params}
        return problems + _param_problems(p) + _choice_problems(p, self.choices)

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The rank (named or drawn), the first step, the parameters."""
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=single_rank(spec, seed, facts),
            step=int(spec.at["step"]),
            point="boundary",
            params={**self.params, **spec.params, "seed": seed},
        )

    def inject(self, injector: Injector, fault: PlannedFault) -> dict[str, Any]:
        """Set the rank's ``sdc`` knob: from this step on, its step applies the corruption."""
        p = fault.params
        corruption = CorruptionSpec(
            src=int(p.get("src", -1)),
            half=str(p.get("half", "")),
            during=str(p.get("during", "")),
            fault=fault.id,
            where=self.where_of(p),
            first_step=fault.step,
            seed=int(p["seed"]),
            bits=str(p["bits"]),
            k=int(p["k"]),
            bit=None if p["bit"] is None else int(p["bit"]),
            bias=float(p["bias"]),
            elements=int(p["elements"]),
            probability=float(p["probability"]),
            persistence=str(p["persistence"]),
            escalate_every=int(p.get("escalate_every", 0)),
        )
        injector.set_knob([fault.rank], "sdc", corruption.to_knob())
        return {"rank": fault.rank, "where": corruption.where, "persistence": corruption.persistence}

    def where_of(self, params: dict[str, Any]) -> str:
        """Which arrays it strikes, given its parameters."""
        return self.where

    def heal(self, injector: Injector, fault: PlannedFault) -> None:
        """A corruption does not heal by itself during the run (a new process is free of it)."""

    def effect(self, fired: dict[str, Any], evidence: Evidence) -> Effect:
        """Values of the rank were changed in the steps the journal holds, or never were."""
        rank = int(fired.get("rank", -1))
        hits = [h for h in hits_of(evidence, fired, rank) if h.get("fault") == fired.get("id")]
        if not hits:
            return Effect(False, f"no value of rank {rank} was corrupted{evidence.ended_early()}")
        first = hits[0]
        what = (
            f"scaled by 1{first['bias']:+g}"
            if "bias" in first
            else f"{first['tensor']}[{first['index']}] {_value(first['before'])} -> {_value(first['after'])}"
        )
        return Effect(
            True, f"rank {rank}: {len(hits)} silent corruption(s) of its {first['where']}, first {what}"
        )


def _value(v: float | int) -> str:
    """A value as the effect names it: an integer exactly, a float to six figures."""
    return str(v) if isinstance(v, int) else f"{v:.6g}"


def hits_of(evidence: Evidence, fired: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    """What corruptions changed on ``rank`` while ``fired`` was in force: in the steps it ran, and in
    the failures a corrupted value caused (a device fault, which ended its step)."""
    found = [h for e in evidence.steps_in(fired, [rank]) for h in e.get("sdc", {}).get(str(rank), [])]
    found += [h for f in evidence.failures for h in f.get("errors", {}).get(str(rank), {}).get("sdc", [])]
    found += [h for j in evidence.job_failed if j.get("rank") == rank for h in j.get("sdc", [])]
    return found


def _choice_problems(p: dict[str, Any], choices: dict[str, tuple[str, ...]]) -> Problems:
    """Each parameter of ``choices`` whose value is not one of its words."""
    problems: Problems = []
    for name, words in choices.items():
        if p[name] not in words:
            said = " or ".join(words) if len(words) == 2 else "from " + ", ".join(words)
            problems.append(((name,), f"{name} {p[name]!r}: choose {said}"))
    return problems


def _param_problems(p: dict[str, Any], width: int = WIDTH) -> Problems:
    problems: Problems = []

    def whole(name: str, low: int, high: int) -> None:
        v = p[name]
        if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
            problems.append(((name,), f"{name} {v!r}: give a whole number in {low}..{high}"))

    if p["bits"] not in BIT_CHOICES:
        problems.append((("bits",), f"bits {p['bits']!r}: choose from {', '.join(BIT_CHOICES)}"))
    whole("k", 1, width)
    whole("elements", 1, 1_000_000)
    whole("escalate_every", 0, 1_000_000)
    if p["bit"] is not None:
        whole("bit", 0, width - 1)
        if problems and problems[-1][0] == ("bit",):
            what = "float32" if width == WIDTH else "int64 indices"
            problems[-1] = (("bit",), f"bit {p['bit']!r} is past the workloads' {what}: give 0..{width - 1}")
    prob = p["probability"]
    if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0.0 <= prob <= 1.0:
        problems.append((("probability",), f"probability {prob!r}: give a number in [0, 1]"))
    bias = p["bias"]
    if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias) or bias <= -1:
        problems.append((("bias",), f"bias {bias!r}: give a finite number above -1 (0: flip bits)"))
    if p["persistence"] not in PERSISTENCE:
        problems.append(
            (("persistence",), f"persistence {p['persistence']!r}: choose from {', '.join(PERSISTENCE)}")
        )
    elif p["persistence"] == "transient" and p["escalate_every"]:
        problems.append(
            (
                ("escalate_every",),
                "a transient corruption strikes once and cannot escalate; write persistence: persistent "
                "(or intermittent), or drop escalate_every",
            )
        )
    return problems


@register
class SdcGradient(_Corruption):
    """Corrupt one rank's local gradients before the reduction."""

    name = "sdc_gradient"
    where = "gradient"
    drill_order = 6
    description = "silently corrupt one rank's local gradients (bits or a bias) before the reduction"


@register
class SdcParams(_Corruption):
    """Corrupt one rank's parameters, or its optimizer state, at rest."""

    name = "sdc_params"
    where = "params"
    drill_order = 7
    description = (
        "silently corrupt one rank's parameters (or, with state: optimizer, its optimizer state) at rest "
        "(bits or a bias) as a step begins"
    )
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        **_Corruption.param_docs,
        "state": (
            "params|optimizer",
            "what rests in its memory corrupted: the parameters, or the optimizer's moments",
        ),
    }
    params: ClassVar[dict[str, Any]] = {**_Corruption.params, "state": "params"}
    choices: ClassVar[dict[str, tuple[str, ...]]] = {"state": ("params", "optimizer")}

    def where_of(self, params: dict[str, Any]) -> str:
        """``params`` or ``optimizer``, as its ``state`` says."""
        return str(params.get("state", "params"))


@register
class SdcPayload(_Corruption):
    """Corrupt what one link delivers in an allreduce."""

    name = "sdc_payload"
    where = "payload"
    targets_ranks = False
    description = (
        "silently corrupt what one link a->b delivers in an allreduce, after any transport check "
        "(bits or a bias)"
    )
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        **_Corruption.param_docs,
        "half": (
            "reduce_scatter|allgather|any",
            "the allreduce's half it strikes: a reduced chunk every replica then gets, or one copy",
        ),
    }
    params: ClassVar[dict[str, Any]] = {**_Corruption.params, "half": "reduce_scatter"}
    choices: ClassVar[dict[str, tuple[str, ...]]] = {"half": ("reduce_scatter", "allgather", "any")}

    def drawable(self, facts: DrawFacts) -> bool:
        """Not drawn by drills: a drawn link may carry nothing of the allreduce."""
        return False

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """A directed link ``[a, b]`` of two ranks, a step, a half, and the corruption's parameters."""
        problems: Problems = []
        link = spec.target.get("link") if set(spec.target) == {"link"} else None
        ends = (
            [r for r in link if isinstance(r, int) and 0 <= r < facts.world] if isinstance(link, list) else []
        )
        if len(ends) != 2 or len(link or []) != 2 or ends[0] == ends[1]:
            problems.append(
                (
                    ("target",),
                    f"sdc_payload takes 'target: {{link: [a, b]}}', two ranks of 0..{facts.world - 1}",
                )
            )
        step = spec.at.get("step")
        if set(spec.at) != {"step"} or not isinstance(step, int) or isinstance(step, bool):
            problems.append((("at",), "sdc_payload needs 'at: {step: N}' with an integer step"))
        elif not 0 <= step < facts.steps:
            problems.append((("at", "step"), f"step {step} is outside the run: use 0..{facts.steps - 1}"))
        p = {**self.params, **spec.params}
        return problems + _param_problems(p) + _choice_problems(p, self.choices)

    def plan(self, spec: FaultSpec, seed: int, facts: ClusterFacts) -> PlannedFault:
        """The receiving rank holds it; the sender and the half are its parameters."""
        src, dst = (int(r) for r in spec.target["link"])
        params = {**self.params, **spec.params, "seed": seed, "src": src}
        params["half"] = "" if params["half"] == "any" else params["half"]
        return PlannedFault(
            id=f"f{spec.index}-{self.name}",
            kind=self.name,
            rank=dst,
            step=int(spec.at["step"]),
            point="boundary",
            params=params,
        )


@register
class SdcActivation(_Corruption):
    """Corrupt what one rank's compute makes in a pass: a layer's output, or the gradient it hands back."""

    name = "sdc_activation"
    where = "activation"
    drill_order = 8
    description = (
        "silently corrupt one rank's compute output (bits or a bias): a layer's output in the forward "
        "pass, or the gradient it hands back in the backward pass"
    )
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        **_Corruption.param_docs,
        "during": (
            "forward|backward",
            "the pass it strikes: the first layer output the rank makes in it, each step it strikes",
        ),
    }
    params: ClassVar[dict[str, Any]] = {**_Corruption.params, "during": "forward"}
    choices: ClassVar[dict[str, tuple[str, ...]]] = {"during": ("forward", "backward")}

    def draw(self, draw: Any, facts: DrawFacts, rank: int) -> dict[str, Any]:
        """As the other kinds draw, in the forward or the backward pass."""
        return {**super().draw(draw, facts, rank), "during": draw(st.sampled_from(self.choices["during"]))}


#: the width of the sample indices, in bits (int64)
INDEX_WIDTH = 64


@register
class SdcIndex(_Corruption):
    """Corrupt an integer one rank computes: an index of the samples its batch gathers."""

    name = "sdc_index"
    where = "index"
    description = (
        "silently flip bits of one rank's sample indices: a low bit reads a wrong sample, a high one "
        "crashes the gather that uses it (a device fault the restart cures)"
    )
    param_docs: ClassVar[dict[str, tuple[str, str]]] = {
        **{k: v for k, v in _Corruption.param_docs.items() if k != "bias"},
        "bits": ("sign|random", "which bits of an index are flipped: its sign bit, or k of its 64 bits"),
        "k": ("integer", "bits flipped per index with bits: random (1..64)"),
        "bit": ("integer", "flip this bit position instead (0..63): 0 reads a neighbouring sample"),
    }
    params: ClassVar[dict[str, Any]] = {**_Corruption.params, "bits": "random"}

    def drawable(self, facts: DrawFacts) -> bool:
        """Not drawn by drills: on a pipeline stage that gathers no samples it would change nothing."""
        return False

    def validate(self, spec: FaultSpec, facts: ClusterFacts) -> Problems:
        """As the other kinds, with an integer's bits: sign, random or a position in 0..63; no bias."""
        p = {**self.params, **spec.params}
        problems: Problems = [
            pr for pr in super().validate(spec, facts) if pr[0] not in (("bit",), ("k",), ("bits",))
        ]
        problems += [pr for pr in _param_problems(p, INDEX_WIDTH) if pr[0] in (("bit",), ("k",))]
        if p["bits"] not in ("sign", "random"):
            problems.append(
                (
                    ("bits",),
                    f"bits {p['bits']!r}: an index has no exponent or mantissa; choose sign or random",
                )
            )
        if p["bias"]:
            problems.append((("bias",), "an index cannot be biased: drop bias and flip bits"))
        return problems
