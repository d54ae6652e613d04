"""Where the evaluation files are: one lookup for `eval`, `novelty` and `compare` (no torch).

The files are laid out as docs/evaluation.md's task table says: `wikitext-2/wiki.test.raw`,
`piqa/`, `hellaswag/`, ... The folder is `$TAPERLM_EVAL_DATA` when set, else the first
`shared/data` found beside the checkout or the working directory; `TAPERLM_EVAL_DATA=none` turns
the lookup off (as on a fresh clone with nothing beside it).
"""

from __future__ import annotations

import os
from pathlib import Path

from taperlm.errors import DataError

EVAL_DATA_ENV = "TAPERLM_EVAL_DATA"
NO_EVAL_DATA = "none"  # the value of $TAPERLM_EVAL_DATA that turns the lookup off
WIKITEXT_TEST = Path("wikitext-2") / "wiki.test.raw"
_CHECKOUT = Path(__file__).resolve().parents[3]  # src/taperlm/evaluation -> the checkout root


def _default_dirs() -> list[Path]:
    if os.environ.get(EVAL_DATA_ENV) == NO_EVAL_DATA:
        return []
    dirs = []
    for root in (_CHECKOUT, Path.cwd()):
        dirs += [root.parent / "shared" / "data", root / "shared" / "data"]
    return list(dict.fromkeys(dirs))


def eval_data_dir() -> Path | None:
    """The evaluation data folder: `$TAPERLM_EVAL_DATA` as given, else the first existing
    `shared/data` beside the checkout or the working directory; None when there is none or
    `$TAPERLM_EVAL_DATA` is `none`."""
    env = os.environ.get(EVAL_DATA_ENV)
    if env == NO_EVAL_DATA:
        return None
    if env:
        return Path(env)
    return next((d for d in _default_dirs() if d.is_dir()), None)


def wikitext_test() -> Path:
    """WikiText-2 raw test (the paper's novelty text): in `$TAPERLM_EVAL_DATA` (a folder laid out
    like ../shared/data, or the file itself), else in the default folders; DataError if absent."""
    tried: list[Path] = []
    env = os.environ.get(EVAL_DATA_ENV)
    if env and env != NO_EVAL_DATA:
        p = Path(env)
        tried += [p] if p.is_file() else [p / WIKITEXT_TEST, p / WIKITEXT_TEST.name]
    tried += [d / WIKITEXT_TEST for d in _default_dirs()]
    for p in tried:
        if p.is_file():
            return p
    raise DataError(
        "no default text for novelty: WikiText-2 test (wikitext-2/wiki.test.raw) not found "
        f"(tried {', '.join(map(str, tried))}); set {EVAL_DATA_ENV} to a folder laid out like "
        "../shared/data, or pass --data FILE"
    )
