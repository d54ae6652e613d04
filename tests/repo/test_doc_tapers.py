"""Every concrete allocation a page writes as inline code (`cosine:1.5:0.5`, `bell:0.5`,
`cosine:1.5:0.5+heads:cosine:1.25:0.75`, ...) is one `--tapers` accepts: a reader pastes them.
Templates with placeholders (`linear:S:E`, `groups:R1,R2,...`, `novelty:SOURCE[:S]`) are not
commands and are left out. (README once wrote OpenELM's widening as `linear:2/9:16/9`, which
the parser refuses: numbers are decimals.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from taperlm.compare.grid import parse_allocation
from taperlm.spec.taper import SCHEDULES

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
# a schedule name (or a head/KV component) with arguments, as inline code
SPEC = re.compile(rf"`((?:{'|'.join(SCHEDULES)}|heads|kv):[^`\s]+)`")
# what marks a template: a capital placeholder, an ellipsis, an optional part, an empty tail
TEMPLATE = re.compile(r"[A-Z]|\.\.|\[|:$|<")


def _written() -> list[tuple[str, str]]:
    found: dict[str, str] = {}
    for page in PAGES:
        for spec in SPEC.findall(page.read_text(encoding="utf-8")):
            if not TEMPLATE.search(spec):
                found.setdefault(spec, page.relative_to(ROOT).as_posix())
    return sorted((page, spec) for spec, page in found.items())


def test_the_pages_write_allocations():
    specs = [s for _, s in _written()]
    assert len(specs) >= 20 and "cosine:1.5:0.5" in specs
    assert any(s.startswith(("bell:", "hourglass:")) for s in specs)


@pytest.mark.parametrize("page, spec", _written())
def test_an_allocation_a_page_writes_parses(page: str, spec: str) -> None:
    parse_allocation(spec)


def test_a_fraction_is_caught():
    """The check sees the class it is for: a fraction is no number to the parser."""
    assert not TEMPLATE.search("linear:2/9:16/9") and SPEC.search("`linear:2/9:16/9`")
    with pytest.raises(Exception, match="not a number"):
        parse_allocation("linear:2/9:16/9")
