"""The house: layers that import one way, no import cycle, modules of a readable size, and no
fault-kind or recovery-strategy name compared outside the kind's or strategy's own home.

The import contracts are import-linter's, declared in pyproject.toml (``lint-imports`` runs them in
CI); here they are run on the tree as it is, and on copies of it with an upward import or a cycle
added, which they must refuse.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("testbed", "faults", "workloads")
#: "about 400 lines" (the issue that set up the layers); a module past this is split by concern
MAX_LINES = 420
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """Run import-linter with the repository's contracts on the packages under ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy_of_the_tree(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_its_import_contracts() -> None:
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    tree = _copy_of_the_tree(tmp_path)
    (tree / "testbed" / "core" / "upward.py").write_text("from testbed.control.runner import run  # upward\n")
    out = _lint_imports(tree)
    assert out.returncode != 0
    assert "testbed.core is not allowed to import testbed.control" in out.stdout
    assert "testbed.core.upward -> testbed.control.runner" in out.stdout


def test_a_sideways_import_between_independent_packages_breaks_it(tmp_path: Path) -> None:
    tree = _copy_of_the_tree(tmp_path)
    (tree / "faults" / "sideways.py").write_text("import workloads.mlp\n")
    out = _lint_imports(tree)
    assert out.returncode != 0
    assert "faults is not allowed to import workloads" in out.stdout


def test_a_module_cycle_inside_a_package_breaks_the_acyclic_contract(tmp_path: Path) -> None:
    tree = _copy_of_the_tree(tmp_path)
    core = tree / "testbed" / "core"
    (core / "ring_a.py").write_text("from testbed.core import ring_b\n")
    (core / "ring_b.py").write_text("from testbed.core import ring_a\n")
    out = _lint_imports(tree)
    assert out.returncode != 0
    assert "each layer imports only the layers below it KEPT" in out.stdout
    assert "No cycles are allowed in testbed.core" in out.stdout


def test_no_module_imports_the_public_api() -> None:
    """``testbed/__init__`` re-exports from every layer: a module importing it would import upward."""
    graph = grimp.build_graph(*PACKAGES)
    importers = sorted(graph.find_modules_that_directly_import("testbed"))
    assert importers == []


def _modules() -> list[Path]:
    return sorted(p for name in PACKAGES for p in (ROOT / name).rglob("*.py"))


def test_no_module_is_over_about_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by concern (docs/architecture.md): {long}"


def _compared_names(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``x == "name"``, ``x != "name"``, ``x in ("name", ...)``: (line, name) of each comparison."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            found += [
                (node.lineno, i.value) for i in items if isinstance(i, ast.Constant) and i.value in names
            ]
    return found


def test_no_kind_or_strategy_name_is_compared_outside_its_home() -> None:
    """A fault kind's traits live on the kind and a strategy's on the strategy: nothing else asks
    "is this node_kill?" or "is this hot_spare?", so adding one touches one file."""
    from faults.kind import kinds
    from testbed.core.registry import STRATEGIES

    strategies = set(STRATEGIES)
    fault_kinds = set(kinds())
    names = strategies | fault_kinds
    homes = {ROOT / "testbed" / "recovery" / "registry.py", *(ROOT / "faults").glob("*.py")}
    # names that are also words of another vocabulary (an NPU's action "hang" is a SIGSTOP; the
    # hotspot verdict "straggler" names a diagnosis; "replica" is also a parallel group) are
    # compared there as those words, not as kinds or strategies
    words = {
        ROOT / "testbed" / "train" / "rank_faults.py": {"hang"},
        ROOT / "testbed" / "actors" / "supernode.py": {"hang"},
        ROOT / "testbed" / "report" / "summary.py": {"straggler"},
        ROOT / "workloads" / "transformer.py": {"replica"},
        ROOT / "testbed" / "job" / "figures.py": {"replica"},
    }
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name!r}"
        for path in _modules()
        if path not in homes
        for line, name in _compared_names(path.read_text(), names - words.get(path, set()))
    ]
    assert found == []
    assert strategies >= {"restart", "hot_spare", "elastic"} and "node_kill" in fault_kinds


def test_the_name_check_finds_a_comparison() -> None:
    source = 'def f(kind, s):\n    return kind == "node_kill" or s in ("hang", "x") or "ok" != kind\n'
    assert _compared_names(source, {"node_kill", "hang"}) == [(2, "node_kill"), (2, "hang")]


@pytest.mark.parametrize("name", ["utils", "helpers", "manager", "misc", "common"])
def test_no_grab_bag_module_names(name: str) -> None:
    hits = [str(p.relative_to(ROOT)) for p in _modules() if p.stem == name]
    assert hits == []


def test_every_package_is_a_layer_of_the_contract() -> None:
    """A new package must be placed in the layers (pyproject.toml), or the contract would not see it."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layered = {
        name.strip()
        for contract in config["contracts"]
        if contract["type"] == "layers"
        for line in contract["layers"]
        for name in re.split(r"[|:]", line)
    }
    packages = {f"testbed.{p.name}" for p in (ROOT / "testbed").iterdir() if (p / "__init__.py").is_file()}
    assert packages | {"faults", "workloads"} == layered


def test_a_supernode_actor_starts_without_numpy() -> None:
    """The supernode actor relays its NPUs' markers but reads no payload: importing it must not
    import numpy (about 0.14 s of CPU for each supernode of each run)."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'numpy':\n"
        "            raise ImportError('numpy (the traceback names the importer)')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import testbed.actors.supernode\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
