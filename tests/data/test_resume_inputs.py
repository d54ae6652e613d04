"""Class 3 of issue 26: whatever is resumed or cached sees that its inputs changed.

The resumable things and the inputs each one is keyed by (RESUMABLE below, checked against the
code where it can be): a changed input makes it start over (prepare, the default corpus cache),
re-evaluate (compare cells whose evaluation inputs changed) or refuse with a message (train and
compare cells on other data or another config: tests/data/test_run_data.py, tests/cli/test_bad_input.py
rows 45-46). The edits tried are the hard ones: same size, and the modification time put back
(`touch -r`, `cp -p`, `rsync -t` all do that), so size + mtime alone would resume.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from taperlm.data import corpus, shards
from taperlm.data import prepare as prep
from taperlm.data.prepare import prepare
from taperlm.files.io import FULL_HASH_BYTES, SAMPLE_BLOCK, file_identity
from test_data_prepare import _fail_nth, digest, write_folder

# thing -> (its inputs, where they are checked, the test that changes each)
RESUMABLE = {
    "prepare (local files)": ("every file read: path, size, mtime, ctime, content digest",
                              "test_prepare_does_not_resume_over_an_edited_source"),
    "prepare (default corpus)": ("every installed file: name, size, mtime",
                                 "test_default_corpus_fingerprint_follows_its_files"),
    "prepare (settings, tokenizer)": ("every argument, a fixed tokenizer's sha256",
                                      "tests/data/test_data_prepare.py::test_resume_after_an_interrupt_is_byte_identical"),
    "train": ("config (tests/cli/test_bad_input.py row 45), data identity and tokenizer (row 46)",
              "tests/data/test_run_data.py"),
    "compare cells": ("config, data identity, evaluation settings and the content (not the path) "
                      "of the novelty text and the task files",
                      "test_compare_cells_know_their_inputs_by_content_not_by_path"),
    "compare default-corpus cache": ("the installed files and the pipeline version (its name)",
                                     "test_default_corpus_cache_is_keyed_by_its_inputs"),
}  # fmt: skip


def same_size_edit(path: Path, offset: int = 0) -> None:
    """Change one byte, keep the size, put the modification time back."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] = ord("Z") if data[offset] != ord("Z") else ord("Y")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_every_resumable_thing_names_a_test():
    here = {n for n in globals() if n.startswith("test_")}
    for _inputs, test in RESUMABLE.values():
        assert test in here or (Path(__file__).resolve().parents[2] / test.split("::")[0]).is_file()


@pytest.mark.parametrize("size", [1000, FULL_HASH_BYTES + 5 * SAMPLE_BLOCK])
@pytest.mark.parametrize("where", ["start", "middle"])
def test_file_identity_sees_a_same_size_edit(tmp_path, size, where):
    path = tmp_path / "f.txt"
    path.write_bytes(b"a" * size)
    before = file_identity(path)
    assert file_identity(path) == before  # reading changes nothing
    same_size_edit(path, {"start": 0, "middle": size // 2 + 7, "end": size - 1}[where])
    after = file_identity(path)
    assert after != before and after[:2] == before[:2]  # size and mtime could not tell


def test_file_identity_sees_an_edit_between_sampled_blocks_by_ctime(tmp_path):
    """A large file is hashed in samples; an edit between them still changes ctime, which no
    tool can set back."""
    path = tmp_path / "big.bin"
    path.write_bytes(b"a" * (FULL_HASH_BYTES + 10 * SAMPLE_BLOCK))
    before = file_identity(path)
    os.utime(path, ns=(0, 0))  # a metadata change, like the edit below, moves ctime
    os.utime(path, ns=(before[1], before[1]))
    after = file_identity(path)
    assert after[:2] == before[:2] and after[3] == before[3] and after[2] != before[2]


def _interrupted_prepare(src: Path, out: Path, monkeypatch) -> None:
    monkeypatch.setattr(prep, "_BATCH_CHARS", 1500)
    _fail_nth(monkeypatch, shards.ShardSeries, "_publish", 6, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        prepare(str(src), out, "bpe:300", workers=1, progress=False, shard_tokens=700)
    monkeypatch.undo()
    monkeypatch.setattr(prep, "_BATCH_CHARS", 1500)
    assert (out / prep.WORK_DIR / prep.STATE_FILE).is_file()


@pytest.mark.parametrize(
    "edited",
    ["doc00.txt", pytest.param("doc11.txt", marks=pytest.mark.slow), "sub/rows.jsonl"],
)
def test_prepare_does_not_resume_over_an_edited_source(tmp_path, monkeypatch, capsys, edited):
    """Killed, a source file edited (same size, mtime put back), run again: it starts over,
    names the file, and the output equals a fresh prepare of the edited source."""
    src = write_folder(tmp_path / "src")
    out = tmp_path / "out"
    _interrupted_prepare(src, out, monkeypatch)
    same_size_edit(src / edited, 40)
    meta = prepare(str(src), out, "bpe:300", workers=1, progress=True, shard_tokens=700)
    assert meta["_resumed"] is None
    err = capsys.readouterr().err
    assert (
        f"holds an unfinished prepare with input file(s) changed since it was interrupted: {edited}"
        in err
    )
    ref = tmp_path / "ref"
    prepare(str(src), ref, "bpe:300", workers=1, progress=False, shard_tokens=700)
    assert digest(out) == digest(ref)


def test_prepare_resumes_over_an_untouched_source(tmp_path, monkeypatch):
    """The control: nothing changed, so the kept work is used (the key is stable)."""
    src = write_folder(tmp_path / "src")
    out = tmp_path / "out"
    _interrupted_prepare(src, out, monkeypatch)
    (src / "doc00.txt").read_bytes()  # reading is not a change
    meta = prepare(str(src), out, "bpe:300", workers=1, progress=False, shard_tokens=700)
    assert meta["_resumed"] is not None


def test_prepare_of_a_single_file_sees_the_edit(tmp_path, monkeypatch):
    src = write_folder(tmp_path / "src") / "doc03.txt"
    first = corpus.open_source(str(src)).fingerprint()
    same_size_edit(src, 5)
    assert corpus.open_source(str(src)).fingerprint() != first


def test_default_corpus_fingerprint_follows_its_files(tmp_path, monkeypatch):
    files = []
    for i in range(3):
        p = tmp_path / f"f{i}.txt"
        p.write_text(f"document {i}\n" * 50)
        files.append((f"pkg:f{i}.txt", p, "text"))
    monkeypatch.setattr(corpus, "default_corpus_files", lambda root="/": files)
    src = corpus.open_source("default")
    first = src.fingerprint()
    assert src.fingerprint() == first
    files[1][1].write_text("document X\n" * 60)  # an upgraded package's file
    assert src.fingerprint() != first


def test_compare_cells_see_an_edited_novelty_text(tmp_path):
    from taperlm.compare.cell import EvalSettings

    text = tmp_path / "wiki.txt"
    text.write_text("some text to measure novelty on\n" * 100)
    settings = EvalSettings(novelty_text=str(text))
    before = settings.to_dict()
    assert settings.to_dict() == before
    same_size_edit(text, 3)
    assert settings.to_dict() != before  # cell_state then re-evaluates instead of "cached"
    assert "input_identity" not in EvalSettings().to_dict()  # the val split: no file


def _settings_with_inputs(root: Path):
    """EvalSettings whose every input file (novelty text, a zero-shot task's local files) lies
    under `root`."""
    from taperlm.compare.cell import EvalSettings
    from taperlm.evaluation.registry import get_task

    (root / "wiki.txt").parent.mkdir(parents=True, exist_ok=True)
    (root / "wiki.txt").write_text("some text to measure novelty on\n" * 100)
    for rel in get_task("piqa").files:
        (root / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "data" / rel).write_text(f"{rel} line\n" * 50)
    return EvalSettings(
        novelty_text=str(root / "wiki.txt"), eval_data=str(root / "data"), eval_tasks=["piqa"]
    )


def test_compare_cells_know_their_inputs_by_content_not_by_path(tmp_path):
    """Every input path of the eval settings: the same files reached through another path (a
    re-install, a moved ../shared) keep finished cells cached; an edit to any one of them
    re-evaluates. A new EvalSettings field must say whether it names an input file."""
    import dataclasses

    from taperlm.compare.cell import _INPUT_PATHS, EvalSettings, evaluation_key

    not_paths = {"val_tokens", "eval_tasks", "eval_limit", "eval_batch_size", "novelty_tokens",
                 "niah_lengths", "niah_haystack"}  # fmt: skip
    assert {f.name for f in dataclasses.fields(EvalSettings)} == {*_INPUT_PATHS, *not_paths}
    here = _settings_with_inputs(tmp_path / "here").to_dict()
    moved = _settings_with_inputs(tmp_path / "moved").to_dict()
    assert here != moved and evaluation_key(here) == evaluation_key(moved)
    for rel in ["wiki.txt", *(f"data/{f}" for f in ("piqa/valid.jsonl", "piqa/valid-labels.lst"))]:
        same_size_edit(tmp_path / "moved" / rel, 1)
        edited = _settings_with_inputs_read(tmp_path / "moved")
        assert evaluation_key(edited) != evaluation_key(here), rel
        _settings_with_inputs(tmp_path / "moved")  # back to the original content
        assert evaluation_key(_settings_with_inputs_read(tmp_path / "moved")) == evaluation_key(
            here
        )
    other = dict(here, novelty_tokens=here["novelty_tokens"] + 1)  # a setting still counts
    assert evaluation_key(other) != evaluation_key(here)


def _settings_with_inputs_read(root: Path) -> dict:
    from taperlm.compare.cell import EvalSettings

    return EvalSettings(
        novelty_text=str(root / "wiki.txt"), eval_data=str(root / "data"), eval_tasks=["piqa"]
    ).to_dict()


def test_cells_recorded_with_path_bound_identities_stay_cached(tmp_path):
    """A result written before identities were by content ([size, mtime, ctime, digest] of the
    novelty text, at its old path) is still recognised as the same evaluation."""
    from taperlm.compare.cell import EvalSettings, evaluation_key
    from taperlm.files.io import file_identity

    text = tmp_path / "new" / "wiki.txt"
    text.parent.mkdir()
    text.write_text("novelty prose\n" * 40)
    old = EvalSettings(novelty_tokens=64).to_dict()
    old.update(novelty_text="/old/place/wiki.txt", novelty_text_identity=file_identity(text))
    current = EvalSettings(novelty_text=str(text), novelty_tokens=64).to_dict()
    assert evaluation_key(old) == evaluation_key(current)
    same_size_edit(text, 2)
    assert evaluation_key(old) != evaluation_key(
        EvalSettings(novelty_text=str(text), novelty_tokens=64).to_dict()
    )


def test_default_corpus_cache_is_keyed_by_its_inputs(tmp_path, monkeypatch):
    """compare's prepared default corpus lives under a name derived from its inputs: a changed
    input (an upgraded package, another pipeline version) gets a fresh one, never the stale."""
    from taperlm.compare import comparison

    monkeypatch.setenv("TAPERLM_CACHE", str(tmp_path / "cache"))
    ident = [["pkg:a.txt", 10, 1]]
    monkeypatch.setattr(corpus, "default_corpus_identity", lambda root="/": ident)
    built = []

    def fake_prepare(spec, out, *a, **k):
        Path(out).mkdir(parents=True)
        (Path(out) / prep.META_FILE).write_text("{}")
        built.append(spec)

    monkeypatch.setattr(prep, "prepare", fake_prepare)
    first = comparison.default_corpus_dir(progress=False)
    assert comparison.default_corpus_dir(progress=False) == first and len(built) == 1  # reused
    ident[0][2] = 2
    second = comparison.default_corpus_dir(progress=False)
    assert second != first and len(built) == 2
    monkeypatch.setattr(prep, "PIPELINE_VERSION", prep.PIPELINE_VERSION + 1)
    assert comparison.default_corpus_dir(progress=False) not in (first, second)
    digest12 = hashlib.sha256(json.dumps([prep.PIPELINE_VERSION, ident]).encode()).hexdigest()
    assert comparison.default_corpus_dir(progress=False).name.endswith(digest12[:12])


def test_eval_settings_round_trip_through_workers(tmp_path):
    """Workers rebuild the settings from to_dict(): the identity it adds is not a setting."""
    from taperlm.compare.cell import EvalSettings

    text = tmp_path / "wiki.txt"
    text.write_text("text\n" * 10)
    settings = EvalSettings(novelty_text=str(text), eval_tasks=["val"])
    assert EvalSettings.from_dict(settings.to_dict()) == settings
