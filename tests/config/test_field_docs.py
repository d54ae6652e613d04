"""Each field of a config dataclass is documented where it is declared: an attribute docstring
right below the field (what it is, its units and allowed values), not a block in the class
docstring far from the fields. Covers the run config's sections, the taper spec and schedule
records, the assembly record, and every family's `Family` record and options."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "taperlm"
MODULES = [
    "config/model.py",
    "config/train.py",
    "config/run.py",
    "config/assembly.py",
    "spec/taper.py",
    *sorted(p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "families").glob("*.py")),
]


def _is_dataclass(node: ast.ClassDef) -> bool:
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def _undocumented(path: str) -> list[str]:
    tree = ast.parse((PACKAGE / path).read_text(encoding="utf-8"))
    missing = []
    for cls in ast.walk(tree):
        if not (isinstance(cls, ast.ClassDef) and _is_dataclass(cls)):
            continue
        doc = ast.get_docstring(cls) or ""
        if "Fields:" in doc:
            missing.append(f"{cls.name}: a 'Fields:' block in the class docstring")
        body = cls.body
        for i, node in enumerate(body):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if "ClassVar" in ast.unparse(node.annotation):
                continue
            nxt = body[i + 1] if i + 1 < len(body) else None
            documented = (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
                and nxt.value.value.strip()
            )
            if not documented:
                missing.append(f"{cls.name}.{node.target.id}")
    return missing


@pytest.mark.unit
def test_modules_hold_dataclasses():
    counts = [
        sum(
            _is_dataclass(c)
            for c in ast.walk(ast.parse((PACKAGE / m).read_text()))
            if isinstance(c, ast.ClassDef)
        )
        for m in MODULES
    ]
    assert sum(counts) >= 8  # ModelConfig, DataConfig, TrainConfig, RunConfig, TaperSpec, ...


@pytest.mark.unit
@pytest.mark.parametrize("path", MODULES)
def test_every_field_is_documented_beside_it(path):
    assert _undocumented(path) == []
