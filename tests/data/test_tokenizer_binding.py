"""Class 1 of issue 63: a run's weights are bound to their tokenizer.

Every path where weights meet a data dir (or, through the data, another model's logits) checks
that the tokens were made with the tokenizer the weights were trained with, and refuses with one
message (`taperlm.data.identity.other_tokenizer`) naming both tokenizers and the data to prepare
instead. The paths are enumerated below; each is tried with a data dir of another tokenizer of
the same vocabulary size (refused, nothing written) and with the very tokenizer, its
tokenizer.json re-serialised (accepted: the identity is the normalised definition's).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fault_harness as H
from conftest import assert_naming
from taperlm.checkpoint.loading import check_tokenizer, weights_tokenizer
from taperlm.cli import main as cli_main
from taperlm.data.identity import (
    RECORD_FILE,
    TOKENIZER_COPY,
    data_tokenizer,
    definition_identity,
    other_tokenizer,
    read_record,
    tokenizer_identity,
)
from taperlm.errors import DataError
from taperlm.files.io import atomic_write_json

TRAIN_SETS = [s for s in H.TINY_SETS if s.startswith("train.")]


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = cli_main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _reserialised(data: Path, out: Path) -> Path:
    """A copy of data dir `data` whose tokenizer.json holds the same definition written with
    other whitespace and key order (and merges spelled "a b" instead of ["a", "b"])."""
    shutil.copytree(data, out)
    path = out / "tokenizer" / "tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    tok["model"]["merges"] = [" ".join(m) for m in tok["model"]["merges"]]
    reordered = dict(reversed(list(tok.items())))
    path.write_text(json.dumps(reordered, indent=3, ensure_ascii=True), encoding="utf-8")
    assert path.read_bytes() != (data / "tokenizer" / "tokenizer.json").read_bytes()
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Run A trained on data dir P (tokenizer T1), a run pruned from it, a run imported from a
    Llama folder holding T1; data of another tokenizer T2 of the same vocabulary size; T1's
    data re-serialised. P is replaced by one or the other in each test."""
    root = tmp_path_factory.mktemp("binding")
    d1 = H.prepare_data(root / "d", seed=0)
    d2 = H.prepare_data(root / "e", seed=1)
    assert (
        json.loads((d1 / "meta.json").read_text())["vocab_size"]
        == json.loads((d2 / "meta.json").read_text())["vocab_size"]
    )
    assert tokenizer_identity(d1 / "tokenizer" / "tokenizer.json") != tokenizer_identity(
        d2 / "tokenizer" / "tokenizer.json"
    )
    p = root / "p"
    shutil.copytree(d1, p)
    run = root / "a"
    assert cli_main([*H.train_argv(p, run), "--stop-after-steps", "2"]) == 0
    pruned = root / "pruned"
    prune = ["prune", run, "--out", pruned, "--params", "0.75", "--params-of", "non-embedding",
             "--calibration-tokens", "256"]  # fmt: skip
    assert cli_main([str(a) for a in prune]) == 0
    world = {"d1": d1, "d2": d2, "p": p, "run": run, "pruned": pruned, "root": root}
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.disable_progress_bar()
    from test_import import make_hf

    folder = make_hf(root / "hf", d1)
    imported = root / "imported"
    sets = [x for s in TRAIN_SETS for x in ("--set", s)]
    assert cli_main(["import", str(folder), "--out", str(imported), *sets]) == 0
    world["imported"] = imported
    world["same"] = _reserialised(d1, root / "same")
    return world


def _use(world: dict[str, Path], which: str) -> Path:
    """Make data dir P hold `which` ("d2": another tokenizer; "same": T1 re-serialised)."""
    p = world["p"]
    shutil.rmtree(p)
    shutil.copytree(world[which], p)
    return p


# path -> (the weights it reads, its command line); `out` is a fresh folder, `own` a copy of
# the weights when the path continues them in place
def _paths(w: dict[str, Path], out: Path, own: Path) -> dict[str, tuple[Path, list]]:
    p, run = w["p"], w["run"]
    measure = ["--tokens", "64", "--seq-len", "32", "--device", "cpu"]
    prune = ["--out", out, "--params", "0.75", "--params-of", "non-embedding",
             "--calibration-tokens", "256"]  # fmt: skip
    step = ["--stop-after-steps", "1"]
    ckpt = run / "checkpoints" / "step_00000002"  # a checkpoint dir names its run's tokenizer
    return {
        "resume": (own, ["train", "--out", own, "--no-progress", "--stop-after-steps", "3"]),
        "continue an import": (own, ["train", "--out", own, "--data", p, "--no-progress", *step]),
        "init-from a run": (run, ["train", "--init-from", run, "--data", p, "--out", out,
                                  "--no-progress", *step]),
        "init-from a checkpoint": (ckpt, ["train", "--init-from", ckpt, "--data", p, "--out", out,
                                          "--no-progress", *step]),
        "init-from a pruned run": (w["pruned"], ["train", "--init-from", w["pruned"], "--data", p,
                                                 "--out", out, "--no-progress", *step]),
        "init-from an import": (w["imported"], ["train", "--init-from", w["imported"], "--data",
                                                p, "--out", out, "--no-progress", *step]),
        "distill-from": (run, [*H.train_argv(p, out), "--distill-from", run, *step]),
        "prune --data": (run, ["prune", run, "--data", p, *prune]),
        "prune (its data.dir)": (run, ["prune", run, *prune]),
        "novelty": (run, ["novelty", run, *measure]),
        "allocate": (run, ["allocate", "--from", run, *measure]),
        "eval": (run, ["eval", run, "--tasks", "val", "--device", "cpu"]),
    }  # fmt: skip


PATHS = list(_paths({k: Path(k) for k in ("p", "run", "pruned", "imported")}, Path(), Path()))


def _own(world: dict[str, Path], path: str, tmp_path: Path) -> Path:
    """The weights a path continues in place: a copy of run A, or of the import."""
    own = tmp_path / "own"
    shutil.copytree(world["imported" if path == "continue an import" else "run"], own)
    return own


@pytest.mark.parametrize("path", PATHS)
def test_weights_meeting_another_tokenizer_are_refused_alike(world, path, tmp_path, capsys):
    """Another tokenizer of the same vocabulary size: the one refusal, naming both tokenizers
    and the data to prepare, on every path; nothing is written."""
    p = _use(world, "d2")
    own, out = _own(world, path, tmp_path), tmp_path / "out"
    weights, argv = _paths(world, out, own)[path]
    before = H.snapshot(own)
    rc, _, err = _cli(argv, capsys)
    model, data = weights_tokenizer(weights), data_tokenizer(p)
    want = str(other_tokenizer(weights, model, p, data))
    # the error is the last line (novelty first notes which text it measures on)
    assert rc == 2 and err.splitlines()[-1] == f"taperlm {argv[0]}: error: {want}", err
    assert_naming(want, model.identity[:16], data.identity[:16], model.origin, data.origin,
                  f"taperlm prepare --tokenizer {model.prepare_with} ")  # fmt: skip
    assert not out.exists() and H.snapshot(own) == before


@pytest.mark.parametrize("path", PATHS)
def test_weights_meeting_their_own_tokenizer_are_accepted(world, path, tmp_path, capsys):
    """The same tokenizer, its tokenizer.json written with other whitespace, key order and
    merge spelling: one identity, so every path runs."""
    _use(world, "same")
    own, out = _own(world, path, tmp_path), tmp_path / "out"
    _, argv = _paths(world, out, own)[path]
    rc, _, err = _cli(argv, capsys)
    assert rc == 0, err


def test_the_identity_is_the_normalised_definition(world):
    """Whitespace, key order and the spelling of a merge keep the identity; a change of the
    vocabulary, the merges, the normaliser, the pre-tokeniser or a special token changes it."""
    text = (world["d1"] / "tokenizer" / "tokenizer.json").read_text(encoding="utf-8")
    base = json.loads(text)
    ident = definition_identity(text)
    assert ident == tokenizer_identity(world["d1"] / "tokenizer" / "tokenizer.json")
    assert definition_identity(json.dumps(base, indent=1, sort_keys=True)) == ident
    assert definition_identity(json.dumps(dict(reversed(list(base.items()))))) == ident

    def changed(edit) -> str:
        tok = json.loads(text)
        edit(tok)
        return definition_identity(json.dumps(tok))

    def swap_two_ids(tok):
        vocab = tok["model"]["vocab"]
        a, b = list(vocab)[5], list(vocab)[6]
        vocab[a], vocab[b] = vocab[b], vocab[a]

    edits = {
        "vocabulary": swap_two_ids,
        "merges": lambda t: t["model"]["merges"].reverse(),
        "normaliser": lambda t: t.update(normalizer={"type": "Lowercase"}),
        "pre-tokeniser": lambda t: t["pre_tokenizer"].update(add_prefix_space=True),
        "special tokens": lambda t: t["added_tokens"][0].update(content="<|end|>"),
    }
    got = {name: changed(edit) for name, edit in edits.items()}
    assert ident not in got.values() and len(set(got.values())) == len(edits), got


def test_runs_that_predate_the_identity(world, tmp_path):
    """A data.json without an identity: computed from the run's tokenizer copy (and said so);
    a run with neither record nor copy: its data dir's tokenizer, or, when that is gone, a
    refusal saying so -- never a silent pass."""
    p = _use(world, "d2")
    old = tmp_path / "old"
    shutil.copytree(world["run"], old)
    record = read_record(old)
    del record["tokenizer"]["identity"]
    atomic_write_json(old / RECORD_FILE, record, indent=2)
    ref = weights_tokenizer(old)
    assert ref.identity == tokenizer_identity(world["d1"] / "tokenizer" / "tokenizer.json")
    assert "computed" in ref.origin and "predates" in ref.origin
    with pytest.raises(DataError, match="was trained with another tokenizer"):
        check_tokenizer(old, p)
    # neither record nor copy: the tokenizer of the data dir its config names
    (old / RECORD_FILE).unlink()
    shutil.rmtree(old / TOKENIZER_COPY)
    ref = weights_tokenizer(old)
    assert ref.identity == data_tokenizer(p).identity and f"{old} predates" in ref.origin
    check_tokenizer(old, p)  # that is the tokenizer it is known by
    moved = tmp_path / "moved"
    p.rename(moved)
    try:
        with pytest.raises(DataError, match=f"cannot tell which tokenizer {old} was trained"):
            check_tokenizer(old, moved)
    finally:
        moved.rename(p)


def test_a_tokenizer_replaced_after_prepare_is_caught(world, tmp_path):
    """meta.json records the identity of what the tokens were made with: a tokenizer.json
    swapped in afterwards does not pass as the data's tokenizer."""
    data = tmp_path / "data"
    shutil.copytree(world["d1"], data)
    shutil.copy(world["d2"] / "tokenizer" / "tokenizer.json", data / "tokenizer" / "tokenizer.json")
    with pytest.raises(DataError, match="is not the tokenizer the tokens of"):
        data_tokenizer(data)


@pytest.mark.parametrize("weights", ["run", "imported"])
def test_the_data_the_refusal_advises_is_accepted(world, weights, tmp_path, capsys):
    """The refusal's `taperlm prepare --tokenizer ...` line, run on some text, gives data the
    weights start from."""
    p = _use(world, "d2")
    out = tmp_path / "out"
    argv = ["train", "--init-from", world[weights], "--data", p, "--out", out, "--no-progress",
            "--stop-after-steps", "1"]  # fmt: skip
    rc, _, err = _cli(argv, capsys)
    assert rc == 2 and not out.exists()
    advised = err.split("`taperlm prepare --tokenizer ", 1)[1].split(" ", 1)[0]
    text = tmp_path / "text.txt"
    text.write_text(H.corpus_text(6000, seed=7), encoding="utf-8")
    new = tmp_path / "new"
    prep = ["prepare", "--tokenizer", advised, "--source", text, "--out", new, "--val-tokens",
            "400", "--workers", "1", "--no-progress"]  # fmt: skip
    assert _cli(prep, capsys)[0] == 0
    argv[argv.index(p)] = new
    rc, _, err = _cli(argv, capsys)
    assert rc == 0, err
