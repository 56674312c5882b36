"""Safe YAML loading that remembers where every value came from.

Only YAML's core types are built (``yaml.SafeLoader``: no object tags, no
code); duplicate keys are problems, not silent overwrites. Each value's line
is kept by its path (``("faults", 0, "target", "rank")``) so that every
validation problem can name its line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from testbed.errors import ScenarioError

Path = tuple[str | int, ...]


@dataclass
class Source:
    """A parsed YAML document: its data, the line of each path, and parse problems."""

    file: str
    data: Any
    lines: dict[Path, int] = field(default_factory=dict)
    duplicates: list[tuple[Path, int]] = field(default_factory=list)

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


def _walk(loader: yaml.SafeLoader, node: yaml.Node, path: Path, src: Source) -> Any:
    src.lines.setdefault(path, node.start_mark.line + 1)
    plain = _PLAIN_TAGS.get(type(node))
    if plain is not None and node.tag != plain:
        raise yaml.constructor.ConstructorError(
            None, None, f"tag {node.tag} is not allowed: scenario files hold plain data only", node.start_mark
        )
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            key = key if isinstance(key, (str, int)) else str(key)
            sub = (*path, key)
            if key in out:
                src.duplicates.append((sub, key_node.start_mark.line + 1))
            src.lines[sub] = key_node.start_mark.line + 1
            out[key] = _walk(loader, value_node, sub, src)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(loader, item, (*path, i), src) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load(text: str, file: str) -> Source:
    """Parse ``text``; raises :class:`ScenarioError` naming the line of a syntax error."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        src = Source(file, None)
        if node is not None:
            src.data = _walk(loader, node, (), src)
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
