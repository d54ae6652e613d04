"""Errors about a missing input say what to do about it.

Every message raised in src/ that reports something missing ("does not exist", "is not a file",
"not found", "no such ...", "no non-empty ...") goes on to name a fix: a verb a user acts on
(give, pass, run, create, ...) after the phrase. The scan reads the literal text of each
`raise SomeError(...)` (f-string parts joined, formatted values as "{}"), so a new message
without a fix fails here, whichever command raises it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src" / "taperlm"
MISSING = re.compile(r"does not exist|is not a file|not found|no such|no non-empty")
FIX = re.compile(
    r"\b(give|pass|run|use|set|create|re-create|point|name|lower|delete|restore|fix|prepare|"
    r"install|leave|add|remove|choose|train|export)\b"
)


def _text(node: ast.expr) -> str | None:
    """The literal text of a message expression: a string, an f-string, or `+`/implicit
    concatenations of them; None for anything computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def _raised_messages() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                text = _text(node.exc.args[0])
                if text is not None:
                    found.append((str(path.relative_to(SRC)), node.lineno, text))
    return found


def test_the_scan_reads_the_messages():
    """The scan sees the messages it checks (a scan that read none would pass anything)."""
    messages = _raised_messages()
    assert len(messages) > 300
    missing = [m for m in messages if MISSING.search(m[2])]
    assert len(missing) >= 10
    assert any(f == "config/loading.py" and "config file" in t for f, _, t in missing)


def _names_a_fix(rest: str) -> bool:
    """A fix verb after the phrase, or a clause computed by a helper that words the fix
    (`data dir X does not exist; {prepare_hint(X)}`)."""
    return bool(FIX.search(rest)) or rest.startswith("; {}")


def test_every_missing_input_error_names_a_fix():
    bare = [
        f"{f}:{line}: {text!r}"
        for f, line, text in _raised_messages()
        if (m := MISSING.search(text)) and not _names_a_fix(text[m.end() :])
    ]
    assert not bare, "errors about a missing input that name no fix:\n" + "\n".join(bare)
