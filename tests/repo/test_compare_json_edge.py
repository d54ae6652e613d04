"""`taperlm.compare.results` is the one place the compare modes' JSON files are read and written
(`read_record`, `write_record`, `read_lines`, `append_line`, the records' `to_json`/`from_json`):
no other module of taperlm.compare parses JSON or writes a JSON file itself, and the records the
modules pass around are typed, with `dict[str, Any]` left only where a free-form mapping is the
data. Both checked on the source (AST), so a new module is covered without a line here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

COMPARE = Path(__file__).resolve().parents[2] / "src" / "taperlm" / "compare"
EDGE = "results.py"
# what reads or writes JSON files (json.dumps of a value to hash is not one: comparison.py's
# corpus identity)
JSON_CALLS = {"json.load", "json.loads", "json.dump"}
JSON_HELPERS = {"read_json", "parse_json", "atomic_write_json"}  # taperlm.files.io's

# dataclass fields still `dict[str, Any]`, each a mapping that is free-form by nature
FREE_FORM_FIELDS = {
    # the run config in taperlm.config's own format (`to_dict`): its reader, `from_dict`,
    # refuses keys a later version dropped, which reading an old result or report must not
    ("results.py", "CellResult", "config"),
    ("results.py", "ComparisonReport", "base_config"),
    # `EvalSettings.to_dict` with its input files' identities: a cache key, compared as a whole
    # (`taperlm.compare.cell.evaluation_key`), never read field by field
    ("results.py", "CellResult", "eval_settings"),
    ("workers.py", "CellTask", "settings"),
    # the prepared data's meta.json (taperlm.data's record, read by `load_meta`)
    ("comparison.py", "Inputs", "meta"),
    # --slurm-extra: passed through to submitit as given
    ("slurm.py", "SlurmSettings", "extra"),
}


def _modules() -> list[Path]:
    return sorted(p for p in COMPARE.glob("*.py") if p.name != "__init__.py")


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_only_results_reads_and_writes_json():
    found = []
    for path in _modules():
        if path.name == EDGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _dotted(node.func) in JSON_CALLS:
                found.append(f"{path.name}:{node.lineno} {_dotted(node.func)}")
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in JSON_HELPERS:
                        found.append(f"{path.name}:{node.lineno} imports {alias.name}")
    assert not found, f"JSON read or written outside compare/{EDGE}: {found}"


def _is_free_dict(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation).replace(" ", "")
    return "dict[str,Any]" in text


def test_records_are_typed_but_for_free_form_mappings():
    found = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and _is_free_dict(item.annotation)
                ):
                    found.add((path.name, node.name, item.target.id))
    assert found - FREE_FORM_FIELDS == set(), "a record field holds an untyped dict"
    assert FREE_FORM_FIELDS - found == set(), "an exception here no longer exists: drop it"
