"""Things found by name: fault kinds, recovery strategies, checks, workloads.

A :class:`Registry` is a read-only mapping from name to thing, filled three
ways: the testbed's own (registered when the module that defines them is
imported; this package declares those modules as entry points), the entry
points another installed package declares under the registry's group (as
pytest finds its plugins: an entry point names one thing, under its name, or
a module that registers its things when imported), and what a program
registers itself (:func:`testbed.register_strategy` and its siblings). Entry
points are read the first time a registry is read, so a layer can find the
strategies or the checks by name without importing the layers that define
them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, Generic, TypeVar

from testbed.core.errors import TestbedError

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Named things of one sort; entry points of ``group`` are loaded on first read."""

    def __init__(self, group: str, what: str, adapt: Callable[[Any], T] | None = None) -> None:
        self.group = group
        self.what = what
        self._adapt = adapt or (lambda obj: obj)
        self._items: dict[str, T] = {}
        self._sources: dict[str, Any] = {}  # what was registered (before adapting), to tell it again
        self._discovered = False

    def register(self, name: str, item: Any) -> T:
        """Register ``item`` under ``name`` (the same item again is a no-op; another one is an error)."""
        if name in self._items:
            if self._sources[name] is item:
                return self._items[name]
            raise TestbedError(
                f"a {self.what} named '{name}' is registered already ({self._sources[name]!r}); give the "
                "new one another name",
                name=name,
            )
        adapted = self._adapt(item)  # refuses what is not of this registry's sort
        self._sources[name], self._items[name] = item, adapted
        return adapted

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for ep in entry_points(group=self.group):
            try:
                loaded = ep.load()  # loading may register it (and its siblings) itself
            except Exception as exc:
                raise TestbedError(
                    f"the {self.what} '{ep.name}' ({ep.value}, entry point group {self.group}) cannot be "
                    f"loaded: {type(exc).__name__}: {exc}; fix or uninstall the package that declares it",
                    name=ep.name,
                ) from exc
            if isinstance(loaded, ModuleType):
                continue  # a module: importing it registered what it holds
            if ep.name not in self._items:
                self.register(ep.name, loaded)
            elif self._sources[ep.name] is not loaded:
                raise TestbedError(
                    f"two {self.what}s are named '{ep.name}': {self._sources[ep.name]!r} and {ep.value} "
                    f"(entry point group {self.group}); rename one, or uninstall the package that "
                    "declares the other",
                    name=ep.name,
                )

    def __getitem__(self, name: str) -> T:
        self._discover()
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        self._discover()
        return iter(list(self._items))

    def __len__(self) -> int:
        self._discover()
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._items

    def __repr__(self) -> str:
        return f"Registry({self.group!r}: {', '.join(self._items) or 'nothing loaded yet'})"


def _a_strategy(obj: Any) -> Any:
    if not (callable(getattr(obj, "cure", None)) and callable(getattr(obj, "go_back", None))):
        raise TestbedError(
            f"{obj!r} is not a recovery strategy: register a testbed.Strategy (name, description, "
            "go_back, cures)",
            value=repr(obj),
        )
    return obj


def _a_check(obj: Any) -> Any:
    if not callable(obj):
        raise TestbedError(
            f"{obj!r} is not a check: register a function (events, expect) -> testbed.CheckResult",
            value=repr(obj),
        )
    return obj


#: recovery strategies (:mod:`testbed.recovery.registry`), by the name ``policy.recovery.strategy`` gives
STRATEGIES: Registry[Any] = Registry("testbed.recovery_strategies", "recovery strategy", _a_strategy)
#: harness checks (:mod:`testbed.report.checks`), by the name a report and ``expect.fails`` give
CHECKS: Registry[Any] = Registry("testbed.checks", "check", _a_check)
