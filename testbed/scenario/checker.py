"""Reading a scenario's values: every problem collected, each with its line, its field and a fix."""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, NoReturn

from testbed.core.errors import ScenarioError
from testbed.core.units import parse_duration
from testbed.scenario.source import Path as YPath
from testbed.scenario.source import Source


class Checker:
    """Collects problems while reading the document, each with its line and a fix."""

    def __init__(self, src: Source, base: Path) -> None:
        self.src = src
        self.base = base  # the scenario's folder (a rank table is read from it)
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

    def refuse(self) -> NoReturn:
        """Raise every problem found, each with its line: nothing is started."""
        n = len(self.problems)
        head = f"{self.src.file}: {n} problem{'s' if n > 1 else ''} in the scenario; nothing was started."
        raise ScenarioError(head + "\n  " + "\n  ".join(self.problems), problems=self.problems)

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


def names(c: Checker, value: Any, path: YPath, known: tuple[str, ...], what: str) -> tuple[str, ...]:
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
