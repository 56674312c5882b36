"""A scenario file with some of its fields set otherwise: ``testbed run FILE --set FIELD=VALUE``.

Sweeps, comparisons and tuning run a scenario with one field changed; each
run remembers what it changed (:attr:`Scenario.overrides`), so the replay
line its summary prints (:func:`replay_command`) is a command that runs that
very scenario again, pasted as printed. ``FIELD`` is a dotted path into the
document (``policy.timeouts.exec_s``; missing mappings are made); ``VALUE`` is
YAML (``60``, ``none``, ``[params, optimizer]``, ``{every: 10}``). The result is
validated as any file is; a message's line numbers are then those of the
file with the changes written in, named ``FILE [--set ...]``.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import yaml

from testbed.core.errors import ScenarioError
from testbed.scenario.model import Scenario
from testbed.scenario.parse import parse_scenario


def split(override: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` as the dotted field and the YAML value."""
    field, sep, text = override.partition("=")
    if not sep or not field.strip() or any(not part for part in field.strip().split(".")):
        raise ScenarioError(
            f"--set {override!r}: write FIELD=VALUE with a dotted field, like policy.timeouts.exec_s=300"
        )
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as exc:
        raise ScenarioError(f"--set {override!r}: the value is not YAML ({exc.__class__.__name__})") from None
    return field.strip(), value


def _set(raw: dict[str, Any], field: str, value: Any, flag: str, file: str) -> None:
    node = raw
    *parents, leaf = field.split(".")
    for key in parents:
        child = node.setdefault(key, {})
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ScenarioError(f"{flag} {field}: '{key}' in {file} is not a mapping; set it whole")
        node = child
    node[leaf] = value


def apply(text: str, file: str, overrides: list[str] | tuple[str, ...], flag: str = "--set") -> Scenario:
    """The scenario of ``text`` (read from ``file``) with each ``FIELD=VALUE`` of ``overrides`` set
    (``flag``: the option that asked for them, for messages)."""
    if not overrides:
        return parse_scenario(text, file)
    raw = yaml.safe_load(text)
    if not isinstance(raw, dict):
        raise ScenarioError(f"{file}: expected a scenario mapping before --set can change it")
    for override in overrides:
        field, value = split(override)
        _set(raw, field, value, flag, file)
    label = f"{file} [{' '.join('--set ' + o for o in overrides)}]"
    scenario = parse_scenario(yaml.safe_dump(raw, sort_keys=False), label)
    return dataclasses.replace(scenario, file=file, overrides=tuple(overrides))


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """The scenario file at ``path`` with ``overrides`` set."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{p}: cannot read the scenario file ({exc}); check the path") from None
    return apply(text, str(p), overrides)


def with_overrides(scenario: Scenario, overrides: list[str]) -> Scenario:
    """``scenario`` (read again from its file, with the changes it already has) with ``overrides`` set
    too, under its seed."""
    if not scenario.file or not Path(scenario.file).is_file():
        raise ScenarioError(
            f"scenario {scenario.name!r} has no file to change ({scenario.file or 'none'}); load it from one"
        )
    return load(scenario.file, [*scenario.overrides, *overrides]).with_seed(scenario.seed)


def replay_command(scenario: Scenario) -> str:
    """The command that runs ``scenario`` again, as it ran: its file, its changes, its seed."""
    sets = "".join(f" --set {shlex.quote(o)}" for o in scenario.overrides)
    return f"testbed run {shlex.quote(scenario.file or scenario.name)}{sets} --seed {scenario.seed}"
