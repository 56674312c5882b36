"""Your own training code as the testbed's workload: the program protocol, and its host.

A program is any object a factory builds from ``(rank, world, seed, options)``
that has:

- ``statefuls``: its named state, a mapping of name to an object with
  ``state_dict()`` and ``load_state_dict(d)`` (the shape DCP, torchtitan,
  accelerate and torchft ask for): a model, an optimizer, a scheduler, a
  sampler, an EMA, a grad scaler, its own RNG;
- the phases of a step, which the testbed drives: ``forward_backward()``
  (returns the loss, or None), ``gradients()`` (a mapping of name to the
  array or tensor to average over the data-parallel ranks now: empty while
  gradients accumulate), ``optimizer_step()``;
- ``save(folder)`` and ``load(folder)``: its own checkpointing, the code
  under test.

The testbed owns the step boundaries: it averages the gradients a program
exposes over its own fabric (a ring allreduce in rank order: link faults,
timeouts and the virtual clock apply, and the result is the same bits on
every rank, run after run) and writes them back in place, then calls
``optimizer_step``. numpy and PyTorch programs both work (a tensor is read
through ``.numpy()`` and written back with ``.copy_()``).

An entry names it: ``path/to/train.py:make``, a file or a dotted module, then
the factory (default ``make``). :mod:`testbed.audit` runs it, one fresh
interpreter per rank, and sweeps kills over the phases of its steps.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from testbed.core.errors import ScenarioError

if TYPE_CHECKING:
    from testbed.collectives import Communicator

#: the methods a program must have, beside ``statefuls``
METHODS = ("forward_backward", "gradients", "optimizer_step", "save", "load")


class Stateful(Protocol):
    """Named state a program saves and loads."""

    def state_dict(self) -> Mapping[str, Any]:
        """The state, as nested mappings and sequences of tensors, arrays and numbers."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the state back."""


class Program(Protocol):
    """A training program: its Statefuls, the phases of a step, its own save and load."""

    statefuls: Mapping[str, Stateful]

    def forward_backward(self) -> Any:
        """This rank's forward and backward passes of the step; the loss (a number), or None."""

    def gradients(self) -> Mapping[str, Any]:
        """The gradients to average over the data-parallel ranks now (empty: none this step)."""

    def optimizer_step(self) -> None:
        """Apply the averaged gradients (or accumulate, as the program decides)."""

    def save(self, folder: str) -> None:
        """Write this rank's checkpoint into ``folder`` (the code under test)."""

    def load(self, folder: str) -> None:
        """Restore this rank from what :meth:`save` wrote (the code under test)."""


class ProgramError(ScenarioError):
    """The program under test broke the protocol or raised: names the method, the program's own
    error and where in its code (exit 254 for a run)."""


def split_entry(entry: str) -> tuple[str, str]:
    """``path/or.module[:factory]`` as (where, factory name)."""
    where, _, factory = entry.rpartition(":") if ":" in entry.split("/")[-1] else (entry, "", "")
    return where, factory or "make"


def resolve(entry: str, base: Path) -> str:
    """``entry`` with a file path made absolute against ``base`` (a dotted module as it is)."""
    where, factory = split_entry(entry)
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        return f"{(path if path.is_absolute() else base / path).resolve()}:{factory}"
    return f"{where}:{factory}"


def load_factory(entry: str) -> Callable[..., Any]:
    """The factory ``entry`` names (a file is loaded as a module of its own, once per process)."""
    where, factory = split_entry(entry)
    try:
        if where.endswith(".py"):
            name = "testbed_program_" + hashlib.sha256(where.encode()).hexdigest()[:12]
            module = sys.modules.get(name)
            if module is None:
                if not Path(where).is_file():
                    raise ProgramError(
                        f"entry {entry!r}: no such file; give the path of your training script"
                    )
                spec = importlib.util.spec_from_file_location(name, where)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ProgramError:
        raise
    except Exception as exc:
        raise ProgramError(f"entry {entry!r}: importing it failed: {_told(exc)}", entry=entry) from None
    found = getattr(module, factory, None)
    if not callable(found):
        raise ProgramError(
            f"entry {entry!r}: {where} has no callable {factory!r}; define "
            f"{factory}(rank, world, seed, options) or name yours after a ':'",
            entry=entry,
        )
    return found


def _told(exc: BaseException) -> str:
    """An exception of the program's code, with the deepest frame of that code."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/testbed/" not in f.filename]
    where = f" ({frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def missing(program: Any) -> list[str]:
    """What ``program`` lacks of the protocol, each with its fix."""
    out = [f"it has no method {m}()" for m in METHODS if not callable(getattr(program, m, None))]
    statefuls = getattr(program, "statefuls", None)
    if not isinstance(statefuls, Mapping) or not statefuls:
        out.append(
            "it has no statefuls: a mapping of name to objects with state_dict() and load_state_dict()"
        )
    else:
        for name, s in statefuls.items():
            if not callable(getattr(s, "state_dict", None)) or not callable(
                getattr(s, "load_state_dict", None)
            ):
                out.append(f"statefuls[{name!r}] lacks state_dict() or load_state_dict()")
    return out


def build(entry: str, rank: int, world: int, seed: int, options: Mapping[str, Any]) -> Any:
    """The program of ``rank``, checked against the protocol."""
    factory = load_factory(entry)
    program = call(entry, "the factory", factory, rank, world, seed, dict(options))
    lacking = missing(program)
    if lacking:
        raise ProgramError(
            f"entry {entry!r}: the program it builds is not one: {'; '.join(lacking)}", entry=entry
        )
    return program


def call(entry: str, what: str, method: Callable[..., Any], *args: Any) -> Any:
    """Call a method of the program; its own error becomes a :class:`ProgramError` naming it."""
    try:
        return method(*args)
    except ProgramError:
        raise
    except Exception as exc:
        raise ProgramError(f"entry {entry!r}: {what} raised {_told(exc)}", entry=entry) from None


def _as_numpy(entry: str, name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        out = value
    elif hasattr(value, "detach"):
        out = np.asarray(value.detach().cpu().numpy())
    else:
        raise ProgramError(
            f"entry {entry!r}: gradient {name!r} is a {type(value).__name__}, not an array or a tensor"
        )
    if out.dtype.kind != "f":
        raise ProgramError(f"entry {entry!r}: gradient {name!r} is {out.dtype}, not floating point")
    return out


def _write_back(target: Any, values: np.ndarray) -> None:
    if isinstance(target, np.ndarray):
        target[...] = values.reshape(target.shape)
    else:
        torch = sys.modules["torch"]
        with torch.no_grad():
            target.copy_(torch.from_numpy(np.ascontiguousarray(values.reshape(tuple(target.shape)))))


def average_gradients(entry: str, group: Communicator, grads: Mapping[str, Any]) -> None:
    """Average the gradients a program exposes over ``group`` and write them back in place: in name
    order, one allreduce per dtype (the same bits on every rank, run after run)."""
    names = sorted(grads)
    views = {k: _as_numpy(entry, k, grads[k]) for k in names}
    by_dtype: dict[str, list[str]] = {}
    for k in names:
        by_dtype.setdefault(views[k].dtype.str, []).append(k)
    for group_names in by_dtype.values():
        flat = np.concatenate([views[k].ravel() for k in group_names])
        avg = group.allreduce(flat, op="avg", algo="ring")
        offset = 0
        for k in group_names:
            _write_back(grads[k], avg[offset : offset + views[k].size])
            offset += views[k].size
