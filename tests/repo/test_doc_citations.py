"""Every `file.py:name` a page cites (docs/*.md, README.md, benchmarks/README.md) names a
function, class, method or module-level value that exists: design.md's walks of `--taper` and
`train.lr` are read hop by hop, so a renamed or merged module must not leave a hop pointing
nowhere. Paths are relative to src/taperlm; read with `ast`, so no module is imported."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "taperlm"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "benchmarks/README.md"]
CITATION = re.compile(r"`([a-z_][a-z0-9_/]*\.py):([A-Za-z_][A-Za-z0-9_.]*)`")


def _citations() -> list[tuple[str, str, str]]:
    found = set()
    for page in PAGES:
        for path, name in CITATION.findall(page.read_text(encoding="utf-8")):
            found.add((page.relative_to(ROOT).as_posix(), path, name))
    return sorted(found)


def _names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines: functions, classes, assigned names."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        out[t.id] = node
    return out


@cache
def _module(path: str) -> ast.Module:
    return ast.parse((PACKAGE / path).read_text(encoding="utf-8"))


CITATIONS = _citations()


@pytest.mark.unit
def test_the_pages_cite_code():
    assert len(CITATIONS) >= 20  # the walks alone cite more; an empty list means a broken regex


@pytest.mark.unit
@pytest.mark.parametrize(
    ("page", "path", "name"), CITATIONS, ids=[f"{p}:{f}:{n}" for p, f, n in CITATIONS]
)
def test_cited_name_exists(page, path, name):
    assert (PACKAGE / path).is_file(), f"{page} cites {path}, which is not a module of src/taperlm"
    scope: ast.AST = _module(path)
    for part in name.split("."):
        body = getattr(scope, "body", None)
        names = _names(body) if isinstance(body, list) else {}
        assert part in names, f"{page} cites {path}:{name}; {path} defines no {part!r} there"
        scope = names[part]
