"""Issue 26, class 6: every file of a run dir, damaged every way, gives a clear error or a safe
recovery in every command that reads it -- never a traceback, never a misleading message.

Files: everything `taperlm train` writes into a run dir (found by listing a real run, so a new
file is enumerated too); checkpoint files covered by the manifest's sha256 are damaged with the
manifest left alone (the checksum catches them, the reader falls back to an earlier checkpoint).
Damage kinds: truncated, binary (invalid UTF-8), empty, wrong JSON/YAML types, emptied lists and
mappings. Readers: train (resume), eval, generate, export. A reader racing the trainer's pruning
of checkpoints gets a complete checkpoint (`test_reader_racing_pruning_gets_a_checkpoint`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import fault_harness as H
from conftest import assert_own_options
from taperlm.cli import main as cli_main

DAMAGES = ("truncated", "binary", "empty", "wrong_types", "empty_lists")


def _emptied(value):
    if isinstance(value, dict):
        return {
            k: ([] if isinstance(v, list) else {} if isinstance(v, dict) else v)
            for k, v in value.items()
        }
    return [] if isinstance(value, list) else value


def _retyped(value):
    """Every top-level value of a mapping replaced by one of another type."""
    if not isinstance(value, dict):
        return {"not": "what was here"}
    swap = {
        str: 7,
        int: "seven",
        float: "x",
        bool: "yes",
        list: {"a": 1},
        dict: [1, 2],
        type(None): [0],
    }
    return {k: swap.get(type(v)) for k, v in value.items()}


def damage(path: Path, kind: str) -> None:
    raw = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(raw[: max(1, len(raw) // 2)])
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00\x80garbage\xc3(" + raw[:16])
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        fix = _emptied if kind == "empty_lists" else _retyped
        text = raw.decode("utf-8")
        if path.suffix == ".jsonl":
            lines = [json.dumps(fix(json.loads(x))) for x in text.splitlines() if x.strip()]
            path.write_text("\n".join(lines) + "\n")
        elif path.suffix == ".yaml":
            path.write_text(yaml.safe_dump(fix(yaml.safe_load(text))))
        elif path.suffix == ".json":
            path.write_text(json.dumps(fix(json.loads(text))))
        else:  # plain text (checkpoints/latest): another kind of content
            path.write_text("[1, 2]\n" if kind == "wrong_types" else "\n")


# run-dir files that only the lock or hashes protect, or that are not read back
NOT_READ = {".lock", ".taperlm-run"}  # the marker counts by its presence alone


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("damaged"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "2"]) == 0
    return run


def run_files(run: Path) -> list[str]:
    """Every file of a run dir, relative, with the newest checkpoint's as `NEWEST/...`."""
    newest = sorted((run / "checkpoints").glob("step_*"))[-1]
    out = []
    for p in sorted(run.rglob("*")):
        if not p.is_file() or p.name in NOT_READ:
            continue
        rel = p.relative_to(run).as_posix()
        if p.parent.name.startswith("step_"):
            if p.parent != newest:
                continue
            rel = "NEWEST/" + p.name
        out.append(rel)
    return out


# Which files can be "wrong types" / "empty lists" (structured text).
def _structured(rel: str) -> bool:
    return rel.endswith((".json", ".jsonl", ".yaml")) or rel.endswith("latest")


READERS = {
    "train": lambda run, tmp, data: [*H.train_argv(data, run), "--stop-after-steps", "3"],
    "eval": lambda run, tmp, data: ["eval", str(run), "--tasks", "val"],
    "generate": lambda run, tmp, data: ["generate", str(run), "--max-new-tokens", "2"],
    "export": lambda run, tmp, data: ["export", str(run), "--out", str(tmp / "exp")],
}


def _resolve(run: Path, rel: str) -> Path:
    if rel.startswith("NEWEST/"):
        return sorted((run / "checkpoints").glob("step_*"))[-1] / rel[len("NEWEST/") :]
    return run / rel


def _cases(slow: bool):
    # Filled lazily from a template list: the real listing is checked by test_cases_cover_the_run.
    files = [
        "config.yaml",
        "metrics.jsonl",
        "data.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_meta.json",
        "checkpoints/latest",
        "NEWEST/manifest.json",
        "NEWEST/.metadata",
        "NEWEST/__0_0.distcp",
        "NEWEST/state.pt",
    ]
    for rel in files:
        for kind in DAMAGES:
            if kind in ("wrong_types", "empty_lists") and not _structured(rel):
                continue
            readers = (
                sorted(READERS) if slow else ["train" if rel != "checkpoints/latest" else "eval"]
            )
            for reader in readers:
                yield pytest.param(rel, kind, reader, id=f"{rel}-{kind}-{reader}")


FILES = sorted({c.values[0] for c in _cases(False)})


def test_cases_cover_the_run(trained):
    assert sorted(run_files(trained)) == FILES


def _check(
    rel: str, kind: str, reader: str, trained: Path, data: Path, tmp_path: Path, capsys
) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    target = _resolve(run, rel)
    damage(target, kind)
    argv = READERS[reader](run, tmp_path, data)
    try:
        rc = cli_main(argv)
    except SystemExit as exc:
        rc = exc.code
    except Exception as exc:  # would be a traceback on the command line
        pytest.fail(f"traceback: {type(exc).__name__}: {exc}")
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err + cap.out
    if rc == 0:  # a safe recovery: an earlier checkpoint, a rebuilt hint, a re-logged line
        return
    assert rc == 2, cap.err[-2000:]
    assert_own_options(argv[0], cap.err)
    line = cap.err.strip().splitlines()[-1]
    assert line.startswith(f"taperlm {argv[0]}: error: "), cap.err
    name = Path(rel).name
    assert name in line or Path(rel).parent.name in line, f"message does not name {rel}: {line}"


@pytest.mark.parametrize(("rel", "kind", "reader"), list(_cases(False)))
def test_damaged_file(rel, kind, reader, trained, data, tmp_path, capsys):
    _check(rel, kind, reader, trained, data, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize(("rel", "kind", "reader"), list(_cases(True)))
def test_damaged_file_every_reader(rel, kind, reader, trained, data, tmp_path, capsys):
    _check(rel, kind, reader, trained, data, tmp_path, capsys)


# ----------------------------------------------------------------------------------------------
# readers racing the trainer's pruning


def _commit_newer_and_prune(run: Path) -> None:
    """What the trainer does between a reader's lookup and its read: commit step N+1 (a copy
    of step N under the next name) and prune step N (renamed away, then deleted)."""
    from taperlm.checkpoint import store as ckpt

    step, newest = ckpt.list_checkpoints(run)[-1]
    shutil.copytree(newest, newest.parent / ckpt.checkpoint_name(step + 1))
    ckpt.prune_checkpoints(run, keep=1)


@pytest.mark.parametrize("reader", ["eval", "generate"])
@pytest.mark.parametrize("moment", ["after_lookup", "during_verify"])
def test_reader_racing_pruning_gets_a_checkpoint(
    reader, moment, trained, data, tmp_path, capsys, monkeypatch
):
    """The checkpoint a reader picked is pruned before (or while) it is read: the reader takes
    the newer one, with no warning about a bad checkpoint and no advice to delete anything."""
    from taperlm.checkpoint import store as ckpt

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    name = "load_checkpoint" if moment == "after_lookup" else "_check_files"
    real = getattr(ckpt, name)
    calls = []

    def racing(path, *args, **kwargs):
        if not calls:
            calls.append(path)
            _commit_newer_and_prune(run)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ckpt, name, racing)
    argv = READERS[reader](run, tmp_path, data)
    assert cli_main(argv) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert calls, "the race was not staged"
    assert "skipping bad checkpoint" not in err and "delete" not in err, err


@pytest.mark.slow
def test_reader_of_a_training_run_always_loads(data, tmp_path):
    """A real race: `taperlm train` checkpointing every step with keep_checkpoints 1 in a child
    process while this process loads the run over and over."""
    import subprocess
    import sys

    from taperlm.checkpoint.loading import load_run_model
    from taperlm.checkpoint.store import list_checkpoints

    run = tmp_path / "run"
    argv = [*H.train_argv(data, run)]
    argv[argv.index("train.keep_checkpoints=2")] = "train.keep_checkpoints=1"
    child = subprocess.Popen(
        [sys.executable, "-m", "taperlm.cli", *argv], env=H.child_env(), stderr=subprocess.PIPE
    )
    loads = 0
    try:
        while child.poll() is None:
            if list_checkpoints(run):  # from the first checkpoint on, every read succeeds
                load_run_model(run)
                loads += 1
    finally:
        child.wait()
    assert child.returncode == 0, child.stderr.read().decode()[-2000:]
    assert loads > 0 and len(list_checkpoints(run)) == 1


# ----------------------------------------------------------------------------------------------
# a compare cell's own files (a cell is a run dir plus these two)


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("name", ["result.json", "sessions.jsonl"])
def test_damaged_compare_cell_file_is_recomputed_or_skipped(name, kind, tmp_path):
    """A damaged result.json reads as missing (the cell is evaluated again from its final
    checkpoint); damaged sessions.jsonl lines are left out of the report's session record."""
    from taperlm.compare.cell import read_result, read_sessions
    from taperlm.compare.results import RESULT_VERSION, SessionRecord

    cell = tmp_path / "cell"
    cell.mkdir()
    result = {"version": RESULT_VERSION, "config": {"model": {}}, "val_loss": 1.0}
    sessions = [{"phase": "train", "from_step": 0}, {"phase": "train", "from_step": 3}]
    (cell / "result.json").write_text(json.dumps(result))
    (cell / "sessions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in sessions))
    damage(cell / name, kind)
    got = read_result(cell)
    assert got is None  # a result of another shape reads as missing too
    for s in read_sessions(cell, total_steps=8):
        assert isinstance(s, SessionRecord)
