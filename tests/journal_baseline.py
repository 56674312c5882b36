"""The journals of every library scenario, less host-dependent fields: recorded once, compared after.

A change that is not meant to alter behaviour (a refactor, a new way to host
processes) keeps every library scenario's journal identical, less the fields
that depend on the host (wall times, process ids, Ray node ids, Ray's
messages). Record before the change, compare after it::

    python -m tests.journal_baseline record     # writes tests/baseline/journals.json (names: only those)
    python -m tests.journal_baseline compare    # exit 1, naming each scenario's first differing event
    python -m tests.journal_baseline compare --shared   # as a suite runs them: shared reference runs

Either exits 1 too, naming it, if a scenario's run did not come to the
verdict the scenario declares.

Every scenario runs with its own seed, one after the other in one Ray session,
into the same folder each time (paths inside messages then agree). The file
keeps, per scenario, a short hash of each event (its name beside it) and one
hash of the whole journal, so a difference is named by its first event.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from testbed import keep_ray_on_loopback

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tests" / "baseline" / "journals.json"
#: where the runs go, the same path every time (messages that name a checkpoint's path then agree)
RUNS = Path("/tmp/tb-journal-baseline")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A journal's host-independent content: a short hash per event, with its name, and one in all."""
    from testbed.core.journal import deterministic_view

    view = deterministic_view(events)
    return {
        "events": [f"{e.get('event')}:{_digest(e)[:12]}" for e in view],
        "sha256": _digest(view),
    }


def record_all(names: list[str] | None = None, shared: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Run every library scenario (or those named) and fingerprint its journal; also each scenario
    whose run did not come to the verdict it declares (a re-recording must not hide one). ``shared``:
    scenarios with one reference run share it, as in a suite (each journal must be as alone)."""
    keep_ray_on_loopback()
    from testbed.actors.session import RaySession
    from testbed.actors.terminal import ray_output_to
    from testbed.control.runner import run
    from testbed.control.shared_reference import repeated, shared_references
    from testbed.core.journal import read_journal
    from testbed.scenario.parse import load_scenario

    shutil.rmtree(RUNS, ignore_errors=True)
    found: dict[str, Any] = {}
    off: list[str] = []
    paths = [p for p in sorted((ROOT / "scenarios").glob("*.yaml")) if not names or p.stem in names]
    scenarios = [load_scenario(p) for p in paths]
    keys = repeated(scenarios) if shared else set()
    with ray_output_to(RUNS / "ray.log") as terminal, RaySession(), shared_references(keys):
        for path, scenario in zip(paths, scenarios, strict=True):
            result = run(scenario, RUNS / path.stem)
            if result.verdict != scenario.expect.verdict:
                off.append(f"{path.stem}: came to '{result.verdict}', declares '{scenario.expect.verdict}'")
            found[path.stem] = fingerprint(read_journal(RUNS / path.stem / "journal.jsonl"))
            shutil.rmtree(RUNS / path.stem, ignore_errors=True)
            terminal.out.write(f"  {path.stem}: {len(found[path.stem]['events'])} events\n")
    return found, off


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each scenario whose journal is not as recorded, with its first differing event."""
    out = []
    for name in sorted(set(recorded) | set(now)):
        a, b = recorded.get(name), now.get(name)
        if a is None or b is None:
            out.append(f"{name}: {'not recorded' if a is None else 'not run'}")
            continue
        if a["sha256"] == b["sha256"]:
            continue
        first = next(
            (i for i, (x, y) in enumerate(zip(a["events"], b["events"], strict=False)) if x != y),
            min(len(a["events"]), len(b["events"])),
        )
        was = a["events"][first] if first < len(a["events"]) else "(the end)"
        got = b["events"][first] if first < len(b["events"]) else "(the end)"
        out.append(f"{name}: event {first + 1} differs: recorded {was}, now {got}")
    return out


def main(argv: list[str] | None = None) -> int:
    """``record`` or ``compare`` (optionally only the scenarios named)."""
    parser = argparse.ArgumentParser(prog="python -m tests.journal_baseline")
    parser.add_argument("action", choices=("record", "compare"))
    parser.add_argument("scenarios", nargs="*", help="file stems (default: the whole library)")
    parser.add_argument("--shared", action="store_true", help="share reference runs, as a suite does")
    args = parser.parse_intermixed_args(argv)  # --shared before or after the names
    now, off = record_all(args.scenarios, args.shared)
    for line in off:
        print(f"VERDICT {line}")
    recorded = json.loads(BASELINE.read_text()) if BASELINE.is_file() else {}
    if args.action == "record":  # the scenarios named replace theirs; the others stay as recorded
        BASELINE.parent.mkdir(parents=True, exist_ok=True)
        BASELINE.write_text(json.dumps({**recorded, **now}, indent=0, sort_keys=True) + "\n")
        print(f"recorded {len(now)} journal(s) in {BASELINE}")
        return 1 if off else 0
    if args.scenarios:
        recorded = {k: v for k, v in recorded.items() if k in args.scenarios}
    found = differences(recorded, now)
    print("\n".join(found) if found else f"all {len(now)} journal(s) as recorded")
    return 1 if found or off else 0


if __name__ == "__main__":
    sys.exit(main())
