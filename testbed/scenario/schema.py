"""The JSON Schema of a scenario file (``testbed schema``), for editors that check YAML as it is typed.

The schema describes the same fields, defaults, ranges and names as
:func:`testbed.scenario.parse_scenario`; what it cannot express (a layout
that must fit the cluster, a fault target inside it, a step inside the run)
is left to ``testbed validate``. Names (presets, workloads, fault kinds,
strategies, components) are taken from the registries, so the schema cannot
fall behind them; the tests check that every library scenario satisfies it.
"""

from __future__ import annotations

from typing import Any

from faults.kind import kinds
from testbed.scenario.model import ALGORITHMS, CHECK_NAMES, DETECTORS, STRATEGIES, VERDICTS, VERSION
from testbed.topology.presets import PRESETS
from testbed.train.checkpoint import COMPONENTS
from testbed.train.device_memory import POLICIES as MEMORY_POLICIES

SIZE = r"^\s*\d+(\.\d+)?\s*([kmgKMG]i?[bB]|[bB])?\s*$"
DURATION = r"^\s*\d+(\.\d+)?\s*(us|ms|s|min|m|h)?\s*$"


def _num(
    lo: float | None = None, hi: float | None = None, default: Any = None, doc: str = ""
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "number"}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    if default is not None:
        out["default"] = default
    if doc:
        out["description"] = doc
    return out


def _dur(lo: float, hi: float | None = None, default: Any = None, doc: str = "") -> dict[str, Any]:
    """Seconds: a number, or a string with a unit (``30s``, ``500ms``, ``2h``)."""
    out: dict[str, Any] = {"oneOf": [_num(lo, hi), {"type": "string", "pattern": DURATION}]}
    if default is not None:
        out["default"] = default
    out["description"] = f"{doc + ': ' if doc else ''}seconds, or a duration with a unit ('30s', '2h')"
    return out


def _int(lo: int | None = None, hi: int | None = None, default: Any = None, doc: str = "") -> dict[str, Any]:
    return {**_num(lo, hi, default, doc), "type": "integer"}


def _obj(props: dict[str, Any], doc: str = "", extra: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": extra}
    if doc:
        out["description"] = doc
    return out


def _enum(names: Any, default: str | None = None, doc: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"enum": sorted(names)}
    if default is not None:
        out["default"] = default
    if doc:
        out["description"] = doc
    return out


def _tolerance(doc: str) -> dict[str, Any]:
    pair = {"type": "array", "items": _num(0), "minItems": 2, "maxItems": 2}
    return {"oneOf": [_num(0), pair], "description": doc}


def _workload() -> dict[str, Any]:
    from workloads import WORKLOADS

    options: dict[str, Any] = {}
    for info in WORKLOADS.values():
        for key, default in info.options.items():
            options.setdefault(key, _num(0, default=default, doc="a model option of the workload"))
    return _obj(
        {
            "name": _enum(WORKLOADS, "mlp", "the model"),
            "steps": _int(1, 100_000, 60, "training steps"),
            "parallel": _obj({a: _int(1) for a in ("dp", "tp", "pp", "ep")}, "dp x tp x pp x ep = the NPUs"),
            "compute_scale": _num(1e-3, 1e15, 1.0, "FLOPs of the modelled job per numpy FLOP"),
            "state_scale": _num(1e-3, 1e15, 1.0, "bytes of the modelled job's state per numpy byte"),
            **options,
        }
    )


def _policy() -> dict[str, Any]:
    components = {"type": "array", "items": _enum(COMPONENTS)}
    learn = _obj(
        {
            "safety_factor": _num(1, 1000, 5.0),
            "warmup_steps": _int(0, default=2),
            "min_samples": _int(1, default=5),
            "blend": _num(0, 1, 0.5),
        },
        "learned timeouts (present: on)",
    )
    return _obj(
        {
            "checkpoint": _obj(
                {
                    "every": _int(0, default=10, doc="steps between checkpoints (0: none)"),
                    "include": components,
                    "restore": components,
                    "keep": _int(0, default=0, doc="committed checkpoints kept (0: all)"),
                    "async": {"type": "boolean", "default": False},
                    "replica_every": _int(0, doc="in-memory replicas every N steps"),
                }
            ),
            "timeouts": _obj(
                {
                    "connect_s": _dur(120, 7200, 120.0, "HCCL_CONNECT_TIMEOUT"),
                    "exec_s": _dur(1, None, 1836.0, "HCCL_EXEC_TIMEOUT"),
                    "rdma_timeout": _int(5, 24, 20, "HCCL_RDMA_TIMEOUT (an exponent)"),
                    "rdma_retry_cnt": _int(1, 7, 7, "HCCL_RDMA_RETRY_CNT"),
                    "pg_timeout_s": _dur(1, None, doc="the process-group timeout"),
                    "learn": learn,
                }
            ),
            "detection": {
                "oneOf": [
                    {"type": "null"},
                    _obj({"heartbeat_s": _dur(0.001, None, 5.0), "missed": _int(1, default=3)}),
                ]
            },
            "recovery": _obj(
                {
                    "strategy": _enum(STRATEGIES, "restart"),
                    "max_restarts": _int(0, default=3),
                    "restart_s": _dur(0, None, 30.0),
                    "spares_per_supernode": _int(0, 64, 1),
                    "spare_s": _dur(0, None, 5.0),
                    "replace_s": _dur(0, None, 120.0),
                    "op_retry": _obj(
                        {
                            "retries": _int(0, default=1),
                            "hold_s": _dur(0, None, 5.0),
                            "interval_s": _dur(0, None, 1.0),
                        }
                    ),
                }
            ),
            "collectives": _obj({"algorithm": _enum(ALGORITHMS, "auto"), "warmup": {"type": "boolean"}}),
            "memory": _obj({"on_oom": _enum(MEMORY_POLICIES, "none"), "pool_share": _num(0, 1, 0.25)}),
        }
    )


def _faults() -> dict[str, Any]:
    variants = []
    for name, kind in sorted(kinds().items()):
        props: dict[str, Any] = {
            "kind": {"const": name, "description": kind.description},
            "target": {"type": "object"},
            "at": {"type": "object"},
        }
        for param, default in kind.params.items():
            props[param] = {"default": default} if default is not None else {}
        variants.append({**_obj(props), "required": ["kind"]})
    return {"type": "array", "items": {"oneOf": variants}}


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a version-1 scenario file."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "testbed scenario",
        "type": "object",
        "required": ["version"],
        "additionalProperties": False,
        "properties": {
            "version": {"const": VERSION},
            "name": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"},
            "description": {"type": "string"},
            "tags": {
                "type": "array",
                "items": {"type": "string", "pattern": r"^[a-z0-9][a-z0-9_-]{0,31}$"},
                "description": "labels for choosing scenarios of a suite (smoke, fast, slow, a topic)",
            },
            "seed": _int(0, 2**63 - 1, 0),
            "cluster": _obj(
                {
                    "preset": _enum(PRESETS, "atlas-900-a3"),
                    "supernodes": _int(1, 64, 2),
                    "npus_per_supernode": _int(1, max(p.max_npus_per_supernode for p in PRESETS.values()), 4),
                    "device_memory": {"oneOf": [_int(0), {"type": "string", "pattern": SIZE}]},
                    "modelled_npus": _int(0, 1_000_000, 0, "link setup at the scale of this many NPUs"),
                    "rank_table": {
                        "type": "string",
                        "description": "an HCCL rank table (JSON 1.0 or 1.2) beside the scenario, instead of "
                        "preset, supernodes and npus_per_supernode",
                    },
                }
            ),
            "workload": _workload(),
            "policy": _policy(),
            "faults": _faults(),
            "safeguards": _obj(
                {
                    "nan_loss": {"type": "boolean", "default": True},
                    "max_failures": _int(0),
                    "wall_s": _dur(0, doc="a wall-time budget"),
                    "blast_radius_percent": _num(0, 100, 50.0, "the most ranks one fault may reach, in %"),
                },
                "conditions that abort the run (exit 3)",
            ),
            "expect": _obj(
                {
                    "recovered": {"type": "boolean"},
                    "max_recovery_s": _dur(0),
                    "checkpoint_complete": {"type": "boolean"},
                    "matches_uninterrupted": {"type": "boolean"},
                    "max_failures": _int(0),
                    "min_goodput": _num(0, 1),
                    "failures": _tolerance("exactly this many failures, or [low, high]"),
                    "recovery_s": _tolerance("each recovery at most this long, or within [low, high]"),
                    "goodput": _tolerance("at least this goodput, or within [low, high]"),
                    "detected_by": {
                        "oneOf": [
                            _enum(DETECTORS),
                            {"type": "array", "items": _enum(DETECTORS), "minItems": 1},
                        ]
                    },
                    "verdict": _enum(VERDICTS, "pass", "the verdict the run means to come to"),
                    "fails": {
                        "type": "array",
                        "items": _enum(CHECK_NAMES),
                        "description": "the checks that must fail (verdict fail or aborted), and no other",
                    },
                }
            ),
        },
    }
