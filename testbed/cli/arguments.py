"""What several commands share: reading a scenario with --seed, --out folders, host fit, durations."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.core.errors import ScenarioError

if TYPE_CHECKING:
    from testbed.scenario.model import Scenario

#: Where, in a run's (or a suite's, a comparison's, ...) directory, what Ray printed is kept.
RAY_LOG = "ray.log"


def seed(given: int | None) -> int | None:
    """``--seed`` as given, refused before anything starts when negative (the scenario refuses the
    rest: :meth:`Scenario.with_seed`)."""
    if given is not None and given < 0:
        raise ScenarioError(f"--seed {given}: a seed is a non-negative integer")
    return given


def load(path: str, given_seed: int | None, sets: list[str] | None = None) -> Scenario:
    """The scenario at ``path``, with its fields changed by ``--set FIELD=VALUE`` and its seed by
    ``--seed``, when given."""
    from testbed.scenario.overrides import load as load_with

    scenario = load_with(path, sets or [])
    chosen = seed(given_seed)
    return scenario if chosen is None else scenario.with_seed(chosen)


SET_HELP = "set a field of the scenario, as YAML: policy.timeouts.exec_s=300 (repeat for several)"


def add_set(parser: argparse.ArgumentParser) -> None:
    """``--set FIELD=VALUE``, repeatable."""
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE", help=SET_HELP
    )


def out_dir(given: str | None, default_name: str) -> Path:
    """``--out``, or ``runs/DEFAULT_NAME-TIME`` (local time, to the second), made now: a path that is a
    file, or cannot be made or written, is refused (exit 254) before anything starts."""
    path = Path(given) if given else Path("runs") / f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return writable_folder(path, "--out")


def writable_folder(path: Path, flag: str) -> Path:
    """``path`` as a folder this process can write, made if need be; else a :class:`ScenarioError`."""
    if path.exists() and not path.is_dir():
        raise ScenarioError(f"{flag} {path}: that is a file, not a folder; give a folder (new or existing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(
            f"{flag} {path}: cannot make that folder ({exc.strerror}); give a folder you can write"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ScenarioError(f"{flag} {path}: this user cannot write there; give a folder you can write")
    return path


def fits_here(scenario: Scenario, address: str | None) -> None:
    """Refuse, before anything starts, a local run this machine cannot hold."""
    if address is None:
        from testbed.scenario.hostfit import refuse_unless_local_fits

        refuse_unless_local_fits(scenario.local_estimate(), scenario.where("cluster"))


def seconds(text: str | None, default: tuple[float, ...], flag: str) -> tuple[float, ...]:
    """A comma-separated list of durations given to ``flag``, sorted; ``default`` when not given."""
    from testbed.core.units import parse_duration

    if text is None:
        return default
    values = [parse_duration(v.strip()) for v in text.split(",") if v.strip()]
    if not values or any(v is None or v <= 0 for v in values):
        raise ScenarioError(f"{flag} {text!r}: give positive durations separated by commas, like 60,300,10m")
    return tuple(sorted(float(v) for v in values if v is not None))
