"""One declaration per scenario field: its kind, unit, bounds, default and doc.

The model (:mod:`testbed.scenario.model`) declares each field once with one
of these helpers; the parser (:mod:`testbed.scenario.parse`) validates a
document against the declarations, and the JSON Schema
(:mod:`testbed.scenario.schema`) is derived from them, so adding a field is
one edit. A field whose rules are its own (a size with units, a layout that
must fit the cluster, the options of the chosen workload) is declared
``custom``: it names its parser and its schema, and still lives beside the
others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spec:
    """How one field is written in a scenario, checked and documented."""

    #: int, float, seconds, bool, choice, text, section or custom (one helper below makes each)
    kind: str
    doc: str = ""
    lo: float | None = None
    hi: float | None = None
    #: the names a ``choice`` field takes (a callable: read from a registry when asked)
    options: Callable[[], Iterable[str]] | None = None
    #: what a ``choice`` names, for its messages ("preset", "recovery strategy")
    what: str = ""
    #: the key in the file, when it is not the attribute's name (``async`` for ``async_``)
    key: str | None = None
    #: absent or null means unset (None), not the default
    optional: bool = False
    #: a ``section`` that is on when written, even empty (``learn: {}``), and off (None) when absent
    present_is_on: bool = False
    #: a ``section`` that ``null`` turns off (``detection: null``)
    nullable: bool = False
    #: a ``custom`` field's parser, by name in :data:`testbed.scenario.parse.CUSTOM`
    parser: str = ""
    #: a ``custom`` field's JSON Schema fragment
    schema: Callable[[], dict[str, Any]] | None = None
    #: the dataclass of a ``section``
    section: type | None = None
    #: a ``custom`` field's parser's own settings (a tolerance's sense and top)
    args: tuple[Any, ...] = ()

    def names(self) -> list[str]:
        """The options of a ``choice`` field: in their order when given as a sequence, else sorted."""
        if self.options is None:
            return []
        found = self.options()
        return list(found) if isinstance(found, (list, tuple)) else sorted(found)


def _field(default: Any, spec: Spec, factory: Callable[[], Any] | None = None) -> Any:
    meta = {"spec": spec}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def integer(
    default: int | None,
    lo: float | None = None,
    hi: float | None = None,
    doc: str = "",
    optional: bool = False,
) -> Any:
    """A whole number in ``[lo, hi]``."""
    return _field(default, Spec("int", doc, lo, hi, optional=optional))


def number(
    default: float | None,
    lo: float | None = None,
    hi: float | None = None,
    doc: str = "",
    optional: bool = False,
) -> Any:
    """A finite number in ``[lo, hi]``."""
    return _field(default, Spec("float", doc, lo, hi, optional=optional))


def seconds(
    default: float | None,
    lo: float | None = None,
    hi: float | None = None,
    doc: str = "",
    optional: bool = False,
    key: str | None = None,
) -> Any:
    """Seconds: a number, or a duration with a unit (``30s``, ``500ms``, ``2h``)."""
    return _field(default, Spec("seconds", doc, lo, hi, optional=optional, key=key))


def flag(default: bool | None, doc: str = "", key: str | None = None) -> Any:
    """``true`` or ``false`` (None as the default: unset)."""
    return _field(default, Spec("bool", doc, key=key, optional=default is None))


def choice(default: str, options: Callable[[], Iterable[str]], what: str, doc: str = "") -> Any:
    """One of the names ``options()`` gives."""
    return _field(default, Spec("choice", doc, options=options, what=what))


def text(default: str, doc: str = "") -> Any:
    """Free text."""
    return _field(default, Spec("text", doc))


def section(
    cls: type, doc: str = "", present_is_on: bool = False, nullable: bool = False, optional: bool = False
) -> Any:
    """A mapping of the fields of dataclass ``cls``."""
    spec = Spec("section", doc, section=cls, present_is_on=present_is_on, nullable=nullable)
    if present_is_on or optional:
        return _field(None, spec)
    return _field(None, spec, factory=cls)


def custom(
    default: Any,
    parser: str,
    schema: Callable[[], dict[str, Any]],
    doc: str = "",
    args: tuple[Any, ...] = (),
) -> Any:
    """A field with rules of its own: ``parser`` names its parser (with ``args``), ``schema`` gives its
    JSON Schema."""
    return _field(default, Spec("custom", doc, parser=parser, schema=schema, args=args))


#: a duration as the scenario files write it
DURATION_PATTERN = r"^\s*\d+(\.\d+)?\s*(us|ms|s|min|m|h)?\s*$"
#: a size as the scenario files write it
SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*([kmgtKMGT]i?[bB]|[bB])?\s*$"


def layout_schema(whose: str) -> dict[str, Any]:
    """A parallel layout ``{dp, tp, pp, ep}`` (``whose``: the layout's owner, for the descriptions)."""
    axes = (
        ("dp", "data-parallel replicas"),
        ("tp", "tensor-parallel ranks of a layer (keep them inside a supernode)"),
        ("pp", "pipeline stages"),
        ("ep", "expert-parallel ranks of the MoE layers"),
    )
    return {
        "type": "object",
        "properties": {
            a: {
                "type": "integer",
                "minimum": 1,
                **({} if a == "dp" else {"default": 1}),
                "description": f"{whose} {what}"
                + (" (default: the NPUs left by the others)" if a == "dp" else ""),
            }
            for a, what in axes
        },
        "additionalProperties": False,
        "description": f"{whose} layout: dp x tp x pp x ep NPUs",
    }


def seconds_schema(lo: float | None = None, hi: float | None = None) -> dict[str, Any]:
    """Seconds: a number in ``[lo, hi]``, or a string with a unit (``30s``, ``500ms``, ``2h``)."""
    bounded: dict[str, Any] = {"type": "number"}
    if lo is not None:
        bounded["minimum"] = lo
    if hi is not None:
        bounded["maximum"] = hi
    return {"oneOf": [bounded, {"type": "string", "pattern": DURATION_PATTERN}]}


def spec_of(f: dataclasses.Field[Any]) -> Spec | None:
    """The declaration of a dataclass field (None: not a scenario field)."""
    spec = f.metadata.get("spec")
    return spec if isinstance(spec, Spec) else None


def declared(cls: type) -> list[tuple[dataclasses.Field[Any], Spec]]:
    """The declared fields of a section's dataclass, in order."""
    out = []
    for f in dataclasses.fields(cls):
        spec = spec_of(f)
        if spec is not None:
            out.append((f, spec))
    return out


def key_of(f: dataclasses.Field[Any], spec: Spec) -> str:
    """The key a field is written under."""
    return spec.key or f.name
