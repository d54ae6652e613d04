"""SIGKILL `taperlm prepare` at chosen moments (used by tests/data/test_data_prepare_kill.py).

Child mode runs the real CLI in a fresh interpreter with one function wrapped, so that at the
named moment the child writes FLAG and sleeps; the parent then kills it with SIGKILL:

    python tests/data/prepare_faults.py MOMENT FLAG -- prepare --source ... --out ...

Moments:
    tokenizer-saved     tokenizer/ written in the work dir, no state.json yet
    published:K         right after the K-th shard (train or val) was published, before the
                        state that records it
    state:K             right after the K-th state.json was saved
    tail-moved          finishing: the tail was copied into val, train not yet cut
    committed           right after the commit point (.prepare renamed to .prepare-commit)
    moved:K             after K files were moved from .prepare-commit into place
    never               no pause (the reference run)

The child also shrinks the tokenization batches (TAPERLM_TEST_BATCH_CHARS) so a small corpus makes
many batches and checkpoints; batch size does not change the output.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def _pause(flag: Path) -> None:
    flag.write_text(str(os.getpid()))
    time.sleep(120)
    os._exit(3)  # never reached when the parent kills us


def _after(owner, name: str, k: int, flag: Path, when=lambda *a, **kw: True) -> None:
    real = getattr(owner, name)
    calls = {"n": 0}

    def wrapper(*a, **kw):
        out = real(*a, **kw)
        if when(*a, **kw):
            calls["n"] += 1
            if calls["n"] == k:
                _pause(flag)
        return out

    setattr(owner, name, wrapper)


def install(moment: str, flag: Path) -> None:
    from taperlm.data import datadir, shards, val_split
    from taperlm.data import prepare as prep
    from taperlm.data.tokenizer import Tokenizer

    kind, _, arg = moment.partition(":")
    k = int(arg or 1)
    if kind == "tokenizer-saved":
        _after(Tokenizer, "save", 1, flag, lambda self, d: Path(d).parent.name == ".prepare")
    elif kind == "published":
        _after(shards.ShardSeries, "_publish", k, flag)
    elif kind == "state":
        _after(prep._Preparation, "_save_state", k, flag)
    elif kind == "tail-moved":
        _after(val_split, "_move_tail", 1, flag)
    elif kind in ("committed", "moved"):
        real_replace = datadir.os.replace
        count = {"n": 0}

        def replace(a, b):
            real_replace(a, b)
            a = Path(a)
            if a.name == datadir.WORK_DIR or a.parent.name == datadir.COMMIT_DIR:
                count["n"] += 1
                if count["n"] == (1 if kind == "committed" else 1 + k):
                    _pause(flag)

        datadir.os.replace = replace
    elif kind != "never":
        raise SystemExit(f"unknown moment {moment!r}")


def main() -> int:
    moment, flag = sys.argv[1], Path(sys.argv[2])
    assert sys.argv[3] == "--"
    from taperlm.cli import main as cli_main
    from taperlm.data import prepare as prep

    if os.environ.get("TAPERLM_TEST_BATCH_CHARS"):
        prep._BATCH_CHARS = int(os.environ["TAPERLM_TEST_BATCH_CHARS"])
    install(moment, flag)
    return cli_main(sys.argv[4:])


if __name__ == "__main__":
    sys.exit(main())
