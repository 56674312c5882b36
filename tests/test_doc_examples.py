"""Every Python example of the README and docs/ runs as written, in a fresh project folder that has
only the testbed installed (no pytest configuration, no conftest, no scenario library): a page's
YAML blocks that start with ``# NAME.yaml`` are written there as files first; a block with a
``def test_`` function runs under pytest, the others as programs. A block that starts with
``# excerpt of PATH`` is a shortened excerpt of a real file of the repository: each class, function
and name it shows must be that file's (with the same methods), not run."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(python|yaml)\n(.*?)```", re.S)
EXCERPT = re.compile(r"^# excerpt of (\S+)\n")
FILE = re.compile(r"^# (\S+\.yaml)\n")


def blocks(page: Path) -> list[tuple[str, str]]:
    """The page's Python and YAML blocks, in order: (language, text)."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(page.read_text())]


def _runnable(text: str) -> bool:
    return EXCERPT.match(text) is None


def _names(tree: ast.Module) -> dict[str, set[str]]:
    """Top-level names a module (or excerpt) defines, each with the names defined in its body."""
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            inner = {
                n.name if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else t.id
                for n in node.body
                for t in (n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", n)])
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) or isinstance(t, ast.Name)
            }
            out[node.name] = inner if isinstance(node, ast.ClassDef) else set()
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    out[t.id] = set()
    return out


@pytest.mark.parametrize("page", [p for p in PAGES if any(not _runnable(t) for _, t in blocks(p))], ids=str)
def test_each_excerpt_shows_what_its_file_defines(page: Path) -> None:
    for lang, text in blocks(page):
        match = EXCERPT.match(text)
        if lang != "python" or match is None:
            continue
        source = ROOT / match.group(1)
        assert source.is_file(), f"{page.name}: the excerpt names {source}, which does not exist"
        shown, real = _names(ast.parse(text)), _names(ast.parse(source.read_text()))
        for name, members in shown.items():
            assert name in real, f"{page.name}: {name} is not in {match.group(1)}"
            assert members <= real[name], f"{page.name}: {name} has {members - real[name]} only in the doc"


def _folder(tmp_path: Path, page: Path) -> Path:
    """A fresh project folder with the page's scenario files."""
    folder = tmp_path / "project"
    folder.mkdir()
    for lang, text in blocks(page):
        named = FILE.match(text)
        if lang == "yaml" and named:
            (folder / named.group(1)).write_text(text)
    return folder


def _environment() -> dict[str, str]:
    """This environment less what the testbed's own test session set (a user's shell has neither)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "HYPOTHESIS", "RAY_"))}
    env.pop("CI", None)
    env.pop("PYTHONPATH", None)
    return env


EXAMPLE_PAGES = [p for p in PAGES if any(lang == "python" and _runnable(t) for lang, t in blocks(p))]


@pytest.mark.slow
@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=lambda p: p.name)
def test_the_python_examples_of_a_page_run_as_written_in_a_fresh_project(tmp_path: Path, page: Path) -> None:
    folder = _folder(tmp_path, page)
    tests, programs = [], []
    for i, (lang, text) in enumerate(blocks(page)):
        if lang != "python" or not _runnable(text):
            continue
        is_test = re.search(r"^def test_", text, re.M) is not None
        path = folder / (f"test_example_{i}.py" if is_test else f"example_{i}.py")
        path.write_text(text)
        (tests if is_test else programs).append(path)
    for program in programs:
        done = subprocess.run(
            [sys.executable, program.name],
            cwd=folder,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{page.name}, {program.name}:\n{done.stdout}\n{done.stderr}"
    if tests:
        names = [t.name for t in tests]
        done = subprocess.run(
            # a fixed seed: the examples draw fault schedules; CI must draw the same ones each time
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=1", *names],
            cwd=folder,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"{page.name}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        assert f"{len(names)} passed" in done.stdout
