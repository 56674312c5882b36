"""Safe, bounded YAML loading that remembers where every value came from.

Only YAML's core types are built (``yaml.SafeLoader``: no object tags, no
code); duplicate keys are problems, not silent overwrites. Each value's line
is kept by its path (``("faults", 0, "target", "rank")``) so that every
validation problem can name its line.

What a file may cost is bounded before anything is built from it, so a
hostile or mistaken file is refused in milliseconds instead of eating the
machine:

- its size (:data:`MAX_BYTES`);
- its nesting depth (:data:`MAX_DEPTH`) and the values it expands to
  (:data:`MAX_VALUES`), read from the parser's events before any node is
  composed (the composer recurses once per level): an alias counts its
  anchored value again each time it is used, so nine anchors each listing
  nine uses of the one before (a "billion laughs" alias bomb) stop at the
  line where the budget runs out;
- every number is finite (``.nan`` and ``.inf`` are YAML floats, and no
  scenario field means them), and no integer is longer than Python converts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from testbed.core.errors import ScenarioError

Path = tuple[str | int, ...]

#: The largest scenario file read (the library's largest is under 2 KiB).
MAX_BYTES = 256 * 2**10
#: The deepest nesting of mappings and lists (the library's deepest is 4).
MAX_DEPTH = 32
#: The most values (mappings, lists and scalars, each alias use counted again) a file may expand to.
MAX_VALUES = 50_000


@dataclass
class Source:
    """A parsed YAML document: its data, the line of each path, and parse problems."""

    file: str
    data: Any
    lines: dict[Path, int] = field(default_factory=dict)
    duplicates: list[tuple[Path, int]] = field(default_factory=list)
    #: paths whose value is a NaN or an infinity (reported once, as such, by the validator)
    nonfinite: list[Path] = field(default_factory=list)

    def line(self, path: Path) -> int | None:
        """The line of ``path``, or of its nearest ancestor that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())


_PLAIN_TAGS: dict[type[yaml.Node], str] = {
    yaml.MappingNode: "tag:yaml.org,2002:map",
    yaml.SequenceNode: "tag:yaml.org,2002:seq",
}


def measure(text: str, file: str) -> None:
    """Refuse a text that nests deeper than :data:`MAX_DEPTH` or expands to more than
    :data:`MAX_VALUES` values, naming the line where it does.

    Read from the parser's event stream, which is not recursive, and left as
    soon as a bound is passed: each anchored value's expanded size is kept, and
    an alias adds it again, so the expansion is known without building it.
    """
    sizes: dict[str, int] = {}
    open_: list[tuple[str | None, int]] = []  # (anchor, values so far) of each collection open
    total = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, yaml.AliasEvent):
            grown = sizes.get(event.anchor or "", 1)
        elif isinstance(event, yaml.ScalarEvent):
            grown = 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            open_.append((event.anchor, total))
            if len(open_) > MAX_DEPTH:
                raise ScenarioError(
                    f"{file}:{line}: the file nests more than {MAX_DEPTH} levels "
                    "deep; a scenario is a few levels deep at most: check the brackets and the "
                    "indentation there"
                )
            grown = 1
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, before = open_.pop()
            if anchor is not None:
                sizes[anchor] = total - before
            continue
        else:
            continue
        total += grown
        if total > MAX_VALUES:
            raise ScenarioError(
                f"{file}:{line}: the file expands to more than {MAX_VALUES:,} "
                "values here (each use of an alias counts its whole anchored value again, and nested "
                "aliases multiply: an alias bomb?); write the values out, or use fewer aliases"
            )


class _Walker:
    """Builds the data of a composed node graph (bounded by :func:`measure`), recording lines."""

    def __init__(self, loader: yaml.SafeLoader, src: Source) -> None:
        self.loader = loader
        self.src = src

    def scalar(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except ValueError as exc:  # an integer longer than Python converts (4300 digits)
            raise ScenarioError(
                f"{self.src.file}:{node.start_mark.line + 1}: a number too long to read ({exc}); "
                "write a number of a few digits"
            ) from None

    def walk(self, node: yaml.Node, path: Path) -> Any:
        self.src.lines.setdefault(path, node.start_mark.line + 1)
        plain = _PLAIN_TAGS.get(type(node))
        if plain is not None and node.tag != plain:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"tag {node.tag} is not allowed: scenario files hold plain data only",
                node.start_mark,
            )
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
                key = key if isinstance(key, (str, int)) and not isinstance(key, bool) else str(key)
                sub = (*path, key)
                if key in out:
                    self.src.duplicates.append((sub, key_node.start_mark.line + 1))
                self.src.lines[sub] = key_node.start_mark.line + 1
                out[key] = self.walk(value_node, sub)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.walk(item, (*path, i)) for i, item in enumerate(node.value)]
        value = self.scalar(node)
        if isinstance(value, float) and not math.isfinite(value):
            self.src.nonfinite.append(path)
        return value


def load(text: str, file: str) -> Source:
    """Parse ``text`` within the bounds; raises :class:`ScenarioError` naming the line of a syntax
    error or of the bound the file passes."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_BYTES:
        raise ScenarioError(
            f"{file}: the file is {size:,} bytes, more than a scenario may be ({MAX_BYTES:,}); "
            "a scenario describes one rehearsal in a page: split it, or move data out of it"
        )
    loader = yaml.SafeLoader(text)
    try:
        measure(text, file)
        node = loader.get_single_node()
        src = Source(file, None)
        if node is not None:
            src.data = _Walker(loader, src).walk(node, ())
        return src
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{file}:{mark.line + 1}" if mark is not None else file
        what = getattr(exc, "problem", None) or str(exc)
        msg = (
            f"{where}: the file is not valid YAML ({what}). Check the indentation and quoting "
            "on that line and the one before it."
        )
        raise ScenarioError(msg) from None
    finally:
        loader.dispose()
