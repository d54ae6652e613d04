"""The bad-input catalogue (issue 8, item 6): one test per entry of the table in
docs/reliability.md. Each runs the CLI (`taperlm.cli.main`) and checks: exit code 2, a specific
message naming the file/key and the fix, no traceback (an unexpected exception fails the test
with "traceback"), and nothing overwritten (sha256 of every file of the run / data dir before and
after).

Entries that were already tested elsewhere are listed in the docs table with those tests' names
instead of being repeated here.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import fault_harness as H
from conftest import assert_own_options
from taperlm.cli import main as cli_main
from taperlm.errors import TaperlmError

# ----------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("bad_input"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """A tiny run stopped after 2 steps (checkpoints 1 and 2)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "2"]) == 0
    return run


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


@pytest.fixture
def data_copy(data, tmp_path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    return copy


def expect_error(argv: list[str], capsys, *needles: str, unchanged: tuple[Path, ...] = ()) -> str:
    """Run the CLI; assert exit 2, every needle in stderr, no traceback, `unchanged` untouched."""
    before = {p: H.snapshot(p) for p in unchanged}
    try:
        rc = cli_main(argv)
    except TaperlmError:
        raise
    except Exception as exc:  # would be a traceback on the command line
        pytest.fail(f"traceback: {type(exc).__name__}: {exc}")
    cap = capsys.readouterr()
    err = cap.err
    assert rc == 2, (rc, cap.out[-500:], err[-2000:])
    assert "Traceback" not in err + cap.out
    assert err.startswith(f"taperlm {argv[0]}: error: "), err
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"
    assert_own_options(argv[0], err)
    for p in unchanged:
        assert H.snapshot(p) == before[p], f"{p} changed"
    return err


def train_args(data: Path | str, out: Path, *sets: str) -> list[str]:
    return H.train_argv(Path(data), out, *sets)


def config_args(config: Path, data: Path, out: Path) -> list[str]:
    return ["train", "--config", str(config), "--data", str(data), "--out", str(out)]


# ----------------------------------------------------------------------------------------------
# config files and overrides


@pytest.mark.parametrize(
    ("name", "content", "needles"),
    [
        ("malformed", b"model: [1, 2\n", ("YAML", "line 2")),
        ("not_mapping", b"- 1\n- 2\n", ("model:", "got list")),
        ("empty", b"", ("empty",)),
        ("not_utf8", "model: {family: caf\u00e9}\n".encode("latin-1"), ("UTF-8",)),
        ("unknown_key", b"model: {d_modle: 32}\n", ("'d_modle'", "'d_model'")),
        ("wrong_type", b"train: {tokens: lots}\n", ("train.tokens", "integer", "'lots'")),
        ("non_string_key", b"model: {1: 2, d_model: 32}\n", ("unknown key", "1")),
    ],
    ids=["malformed", "not_mapping", "empty", "not_utf8", "unknown_key", "wrong_type", "int_key"],
)
def test_config_file(data, tmp_path, capsys, name, content, needles):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_bytes(content)
    expect_error(config_args(cfg, data, tmp_path / "run"), capsys, str(cfg), *needles)
    assert not (tmp_path / "run").exists()


def test_config_file_missing(data, tmp_path, capsys):
    cfg = tmp_path / "nope.yaml"
    expect_error(config_args(cfg, data, tmp_path / "run"), capsys, str(cfg), "does not exist")


def test_run_config_yaml_corrupt_when_continuing(run_copy, capsys):
    (run_copy / "config.yaml").write_text("model: {d_model: [\n")
    expect_error(
        ["train", "--out", str(run_copy)],
        capsys,
        str(run_copy / "config.yaml"),
        "YAML",
        unchanged=(run_copy,),
    )


@pytest.mark.parametrize(
    ("taper", "needles"),
    [
        # the part of the taper that is wrong, and what would be accepted
        ("linear:2.5:-0.5", ("end", ">= 0", "-0.5")),
        ("wedge", ("'wedge'", "uniform, cosine, linear")),
        ("cosine:a:b", ("'cosine:a:b'", "'a'", "number")),
        ("cosine:1.5", ("'cosine:1.5'", "cosine:START:END")),
        ("custom:96,96,96", ("3 widths", "2 layers")),
        ("sigmoid:1.5:0.5:-3", ("steepness", "> 0", "-3")),
    ],
    ids=["negative_end", "unknown", "not_a_number", "wrong_arity", "wrong_count", "negative_k"],
)
def test_taper(data, tmp_path, capsys, taper, needles):
    args = [*train_args(data, tmp_path / "run"), "--taper", taper]
    expect_error(args, capsys, *needles)
    assert not (tmp_path / "run").exists()


def test_unknown_preset(data, tmp_path, capsys):
    args = train_args(data, tmp_path / "run")
    args[args.index("transformer-tiny")] = "transformer-huge"
    expect_error(args, capsys, "'transformer-huge'", "--list-presets")


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        # the --set item (or key) at fault, its value and what it needs
        ("model.n_layers", ("--set", "'model.n_layers'", "key=value")),
        ("foo=1", ("'foo'", "model.KEY", "train.KEY", "data.KEY")),
        ("model.d_model.x=1", ("'d_model'", "section")),
        # blamed on --set (it used to name the preset as if its file had the typo)
        ("train.lrr=0.1", ("--set 'train.lrr=0.1'", "'lrr'", "'lr'")),
        ("train.lr=abc", ("--set 'train.lr=abc'", "train.lr", "number", "str")),
        ("model.transformer.x=1", ("--set 'model.transformer.x=1'", "transformer", "options")),
        ("train.tokens=-128", ("train.tokens", ">= 1", "-128")),
        ("train.lr=0", ("train.lr", "> 0", "0.0")),
        ("train.seq_len=128", ("train.seq_len (128)", "model.context_length (64)")),
        ("train.tokens=64", ("train.tokens (64)", "batch")),
        ("model.n_heads=3", ("model.d_model (32)", "model.n_heads (3)")),
    ],
    ids=[
        "no_equals",
        "unknown_key",
        "not_a_section",
        "misspelt_key",
        "wrong_type",
        "no_family_options",
        "negative_tokens",
        "zero_lr",
        "seq_len_over_context",
        "tokens_below_batch",
        "heads_not_dividing",
    ],
)
def test_set_override(data, tmp_path, capsys, override, needles):
    expect_error(train_args(data, tmp_path / "run", override), capsys, *needles)
    assert not (tmp_path / "run").exists()


@pytest.mark.unit
def test_negative_stop_after_steps(data, tmp_path, capsys):
    """--stop-after-steps must be positive; -1 used to be ignored (the whole run trained)."""
    args = [*train_args(data, tmp_path / "run"), "--stop-after-steps", "-1"]
    expect_error(args, capsys, "--stop-after-steps")


# ----------------------------------------------------------------------------------------------
# data dirs and token shards


def test_no_data_dir_given(tmp_path, capsys):
    args = train_args("x", tmp_path / "run")
    i = args.index("--data")
    del args[i : i + 2]
    expect_error(args, capsys, "--data DIR")


def test_data_dir_is_not_a_prepare_output(tmp_path, capsys):
    d = tmp_path / "stuff"
    d.mkdir()
    (d / "notes.txt").write_text("hi")
    expect_error(train_args(d, tmp_path / "run"), capsys, str(d), "meta.json", "taperlm prepare")


def test_meta_json_not_json(data_copy, tmp_path, capsys):
    (data_copy / "meta.json").write_text("{oops")
    expect_error(
        train_args(data_copy, tmp_path / "run"),
        capsys,
        str(data_copy / "meta.json"),
        "JSON",
        "taperlm prepare",
    )


def _rewrite_shard(path: Path, payload: bytes, **fields) -> None:
    """Rewrite a shard with consistent checksums (so only the intended defect remains)."""
    raw = bytearray(path.read_bytes()[:64])
    magic, version, code, count, vocab, _ = struct.unpack_from("<8sIIQQI", raw)
    count = fields.get("count", len(payload) // code)
    vocab = fields.get("vocab", vocab)
    head = struct.pack("<8sIIQQI", magic, version, code, count, vocab, zlib.crc32(payload))
    head += struct.pack("<I", zlib.crc32(head))
    path.write_bytes(head.ljust(64, b"\0") + payload)


@pytest.mark.parametrize(
    ("defect", "needles"),
    [
        # the defect, with the numbers that show it (the shard's path is checked for each)
        ("random_bytes", ("magic bytes", "taperlm prepare")),
        ("truncated", ("truncated",)),
        ("bitflip", ("checksum", "crc32", "taperlm prepare")),
        ("id_beyond_vocab", ("token id 400", "vocab_size 300")),
        ("extra_bytes", ("bytes after", "corrupt")),
    ],
    ids=["random_bytes", "truncated", "bitflip", "id_beyond_vocab", "extra_bytes"],
)
def test_corrupt_train_shard(data_copy, tmp_path, capsys, defect, needles):
    shard = data_copy / "train-00000.bin"
    raw = shard.read_bytes()
    if defect == "random_bytes":
        shard.write_bytes(bytes(range(256)) * 8)
    elif defect == "truncated":
        shard.write_bytes(raw[:-7])
    elif defect == "bitflip":
        b = bytearray(raw)
        b[64 + 101] ^= 0x04
        shard.write_bytes(bytes(b))
    elif defect == "id_beyond_vocab":
        payload = bytearray(raw[64:])
        payload[0:2] = struct.pack("<H", 400)
        _rewrite_shard(shard, bytes(payload))
    else:
        shard.write_bytes(raw + b"\0\0\0")
    expect_error(
        train_args(data_copy, tmp_path / "run"),
        capsys,
        str(shard),
        *needles,
        unchanged=(data_copy,),
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def _shrink_split(data: Path, split: str, n_tokens: int) -> Path:
    """Cut a one-shard split to its first `n_tokens` tokens, consistently (shard checksums and
    meta.json), so that its size is the only defect."""
    shard = data / f"{split}-00000.bin"
    _rewrite_shard(shard, shard.read_bytes()[64 : 64 + 2 * n_tokens])
    meta = json.loads((data / "meta.json").read_text())
    info = meta["splits"][split]
    assert len(info["shards"]) == 1
    info["tokens"] = info["shards"][0]["tokens"] = n_tokens
    info["shards"][0]["crc32"] = struct.unpack_from("<I", shard.read_bytes(), 32)[0]
    (data / "meta.json").write_text(json.dumps(meta))
    return shard


# Issue 16, class 6: every input too small for the run is caught before the first step (the
# harness run: seq_len 32, 4 windows per optimizer step, validation every 4 steps).
TOO_SMALL = {  # (split, its tokens, --set, what the message names: DATA is the data dir)
    "train_split_shorter_than_a_window": (
        "train", 20, (), ("train", "DATA", "20 tokens", "seq_len + 1 = 33")),
    "train_split_shorter_than_a_batch": (
        "train", 100, (), ("train", "DATA", "100 tokens", "3 windows", "4 windows")),
    "val_split_shorter_than_a_window": (
        "val", 20, ("train.eval_every=2",), ("val", "DATA", "20 tokens", "seq_len + 1 = 33")),
    "compare_val_split_shorter_than_novelty_tokens": (
        "val", 40, (), ("40 tokens", "--novelty-tokens 64")),
    "compare_novelty_text_shorter_than_novelty_tokens": (
        None, 0, (), ("short.txt", "7 tokens", "--novelty-tokens", "--novelty-data")),
    "novelty_text_shorter_than_tokens": (None, 0, (), ("short.txt", "64", "--tokens", "--data")),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TOO_SMALL))
def test_input_too_small_for_the_run(case, data_copy, trained, tmp_path, capsys):
    split, n, sets, needle = TOO_SMALL[case]
    # no WikiText-2 here (conftest.py turns the lookup off): novelty uses the val split
    if split is not None:
        _shrink_split(data_copy, split, n)
    short = tmp_path / "short.txt"
    short.write_text("The king.\n")
    out = tmp_path / "out"
    if case.startswith("compare"):
        extra = [x for s in sets for x in ("--set", s)]
        if "novelty_text" in case:
            extra += ["--novelty-data", str(short)]
        argv = H.compare_argv(data_copy, out, *extra)
    elif case.startswith("novelty"):
        argv = ["novelty", str(trained), "--data", str(short), "--tokens", "64", "--out",
                str(out / "n.json"), "--device", "cpu"]  # fmt: skip
    else:
        argv = train_args(data_copy, out, *sets)
    needles = [n.replace("DATA", str(data_copy)) for n in needle]
    expect_error(argv, capsys, *needles, unchanged=(data_copy, trained))
    assert not out.exists()  # caught at the start: no step ran, nothing was written


# ----------------------------------------------------------------------------------------------
# corpus files (taperlm prepare)


def _prepare(src: Path, out: Path, *extra: str) -> list[str]:
    return [
        "prepare",
        "--source",
        str(src),
        "--out",
        str(out),
        "--workers",
        "1",
        "--no-progress",
        *extra,
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "content", "needles"),
    [
        ("empty.txt", b"", ("empty",)),
        ("binary.txt", b"\x7fELF\x02\x01\x01\x00\x00\x00" * 20, ("binary",)),
        ("rows.jsonl", b'{"body": "no text"}\n', ("rows.jsonl:1", "'text'")),
        ("broken.jsonl", b'{"text": "ok"}\n{"text": \n', ("broken.jsonl:2", "JSON")),
        ("surrogate.jsonl", b'{"text": "bad \\ud800 half pair"}\n', ("surrogate.jsonl:1",)),
        ("deep.jsonl", b"[" * 100_000 + b"\n", ("deep.jsonl:1",)),
    ],
    ids=["empty", "binary", "jsonl_no_text", "jsonl_broken", "lone_surrogate", "deep_nesting"],
)
def test_corpus_file(tmp_path, capsys, name, content, needles):
    src = tmp_path / name
    src.write_bytes(content)
    out = tmp_path / "out"
    expect_error(_prepare(src, out, "--tokenizer", "bpe:300"), capsys, str(src), *needles)
    assert not (out / "meta.json").exists()


@pytest.mark.unit
def test_prepare_bad_tokenizer_spec(tmp_path, capsys):
    src = tmp_path / "c.txt"
    src.write_text(H.corpus_text(200))
    expect_error(
        _prepare(src, tmp_path / "out", "--tokenizer", "bpe:lots"), capsys, "expected bpe:N"
    )


@pytest.mark.unit
def test_prepare_missing_source(tmp_path, capsys):
    expect_error(
        _prepare(tmp_path / "nope", tmp_path / "out"), capsys, "does not exist", "--source"
    )


@pytest.mark.unit
def test_prepare_keeps_existing_data_dir_on_bad_source(data_copy, tmp_path, capsys):
    """A failing re-prepare into an existing data dir must not destroy the old shards."""
    src = tmp_path / "empty.txt"
    src.write_bytes(b"")
    expect_error(
        _prepare(src, data_copy, "--tokenizer", "bpe:300"),
        capsys,
        "file is empty",
        unchanged=(data_copy,),
    )


# ----------------------------------------------------------------------------------------------
# runs, checkpoints and resuming


def test_resume_with_a_different_config(run_copy, data, capsys):
    expect_error(
        train_args(data, run_copy, "train.lr=0.01", "model.d_model=64"),
        capsys,
        str(run_copy),
        "train.lr: 0.003",
        "0.01",
        "model.d_model: 32",
        "64",
        "fresh --out",
        unchanged=(run_copy,),
    )


def test_resume_with_another_data_dir(run_copy, tmp_path, capsys):
    other = H.prepare_data(tmp_path / "other", seed=5)
    expect_error(
        train_args(other, run_copy),
        capsys,
        str(run_copy),
        str(other),
        "was trained with another tokenizer",  # the one refusal (issue 63)
        "the data it was trained on",
        unchanged=(run_copy,),
    )


def test_resume_never_on_a_run_with_checkpoints(run_copy, data, capsys):
    expect_error(
        [*train_args(data, run_copy), "--resume", "never"],
        capsys,
        str(run_copy),
        "step_00000002",
        "--resume auto",
        unchanged=(run_copy,),
    )


def test_checkpoint_of_another_shape_in_the_run_dir(run_copy, data, tmp_path, capsys):
    """Checkpoints copied in from a run of another shape: named, not a torch size-mismatch dump."""
    other = tmp_path / "wide"
    assert (
        cli_main([*train_args(data, other, "model.mlp_width=64"), "--stop-after-steps", "1"]) == 0
    )
    capsys.readouterr()
    shutil.rmtree(run_copy / "checkpoints")
    shutil.copytree(other / "checkpoints", run_copy / "checkpoints")
    err = expect_error(
        train_args(data, run_copy),
        capsys,
        "does not fit this model",
        "step_00000001",
        unchanged=(run_copy / "checkpoints",),
    )
    assert len(err) < 1000  # one line, not torch's full parameter listing


def test_checkpoint_of_another_family_eval(run_copy, capsys):
    text = (run_copy / "config.yaml").read_text()
    (run_copy / "config.yaml").write_text(text.replace("family: transformer", "family: gated"))
    expect_error(
        ["eval", str(run_copy), "--tasks", "val", "--device", "cpu"],
        capsys,
        "model.family: 'transformer'",
        "'gated'",
        "config it was trained with",
        unchanged=(run_copy,),
    )


def test_eval_missing_run_dir(tmp_path, capsys):
    expect_error(
        ["eval", str(tmp_path / "nope"), "--tasks", "val", "--device", "cpu"],
        capsys,
        str(tmp_path / "nope"),
        "`taperlm train`",
    )


def test_eval_run_without_usable_checkpoint(run_copy, capsys):
    for p in (run_copy / "checkpoints").glob("step_*/__0_0.distcp"):
        p.write_bytes(p.read_bytes()[:-8])
    expect_error(
        ["eval", str(run_copy), "--tasks", "val", "--device", "cpu"],
        capsys,
        str(run_copy),
        "none of its checkpoints verifies",
        "taperlm train --out",
        unchanged=(run_copy,),
    )


@pytest.mark.unit
def test_out_is_a_file(data, tmp_path, capsys):
    f = tmp_path / "run"
    f.write_text("precious")
    expect_error(train_args(data, f), capsys, "is a file", unchanged=(f,))


# ----------------------------------------------------------------------------------------------
# evaluation files


def _eval_dir(tmp_path: Path, rel: str, lines: list) -> Path:
    d = tmp_path / "evaldata"
    (d / rel).parent.mkdir(parents=True, exist_ok=True)
    (d / rel).write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    )
    return d


@pytest.mark.parametrize(
    ("task", "rel", "lines", "needles"),
    [
        (
            "arc_easy",
            "arc/arc_easy_test.jsonl",
            [{"query": "Question: x", "gold": 0}],
            ("line 1", "missing field 'choices'", "expected a record like"),
        ),
        (
            "winogrande",
            "winogrande/winogrande_dev.jsonl",
            [{"context_options": ["a", "b"], "continuation": "c", "gold": 2}],
            ("line 1", "label 'gold' = 2 is out of range 0..1"),
        ),
        (
            "boolq",
            "boolq/boolq_dev.jsonl",
            [{"query": "Passage: p\nQuestion: q?", "choices": ["no", "yes"], "gold": 0}, "{oops"],
            ("line 2", "not valid JSON"),
        ),
        (
            "social_iqa",
            "siqa/dev.jsonl",
            [{"context": "c", "question": "q", "options": ["a", "b", "c"], "answer": "z"}],
            ("line 1", "answer 'z' is not one of the options"),
        ),
        ("arc_challenge", "arc/arc_challenge_test.jsonl", ["[" * 100_000], ("line 1",)),
    ],
    ids=["missing_field", "label_out_of_range", "not_json", "answer_not_an_option", "deep_nesting"],
)
def test_eval_file(trained, tmp_path, capsys, task, rel, lines, needles):
    d = _eval_dir(tmp_path, rel, lines)
    args = ["eval", str(trained), "--tasks", task, "--data-dir", str(d), "--device", "cpu"]
    expect_error(args, capsys, str(d / rel), *needles, unchanged=(trained,))


def test_eval_unknown_task(trained, capsys):
    expect_error(["eval", str(trained), "--tasks", "mmlu"], capsys, "unknown task 'mmlu'")


# ----------------------------------------------------------------------------------------------
# the catalogue in docs/reliability.md and the tests agree

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
REF = re.compile(r"`(?:tests/(\w+/test_\w+\.py)::)?(test_\w+)(\[[^\]`]*\])?`")


def _collect(files: list[str]) -> list[str]:
    """Node ids of every test (slow ones included) in `files`, as pytest collects them."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "slow or not slow", *files],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    assert ids, out.stdout[-2000:] + out.stderr[-2000:]
    return ids


def _table_rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|") and not line.startswith("|---")
    ]


def _section(doc: str, heading: str) -> str:
    part = doc.split(heading, 1)[1]
    return re.split(r"\n#{2,3} ", part, maxsplit=1)[0]


def _domain_rows() -> list[str]:
    """The class 1 table rows as they should read (to paste into docs/reliability.md)."""
    import test_domains as T

    rows = []
    for where, name, tp, depth, dom in T.config_fields():
        if dom is not None:
            vals = ", ".join(f"`{v!r}`" for v in dom.outside(integer=tp is int))
            each = " (each element)" if depth else ""
            rows.append(
                f"| `{where}.{name}` | {dom.describe()}{each} | {vals or '(free text, own parser)'} |"
            )
    for cmd, a in T.numeric_options():
        d = a.type.domain
        vals = ", ".join(f"`{v!r}`" for v in d.outside(integer=a.type.kind is int))
        rows.append(f"| `{cmd} {a.option_strings[0]}` | {d.describe()} | {vals} |")
    return rows


def _xfail_cases(module) -> set[str]:
    """Tests (and parametrized cases `name[id]`) of a module marked xfail."""
    out = set()
    for name, fn in vars(module).items():
        if not name.startswith("test_"):
            continue
        marks = getattr(fn, "pytestmark", [])
        if any(m.name == "xfail" for m in marks):
            out.add(name)
        for m in marks:
            if m.name == "parametrize":
                ids = m.kwargs.get("ids") or []
                for i, value in enumerate(m.args[1]):
                    if any(k.name == "xfail" for k in getattr(value, "marks", ())):
                        out.add(f"{name}[{ids[i] if i < len(ids) else i}]")
    return out


def test_catalogue_table_lists_every_test():
    """docs/reliability.md and the tests agree: every test (and case) of this file has a row of
    the catalogue; every test a table names exists; rows marked *xfail* are exactly the tests
    marked xfail; the class tables list exactly the cases their tests enumerate; and every test
    of the files the doc lists is named in it."""
    doc = DOC.read_text(encoding="utf-8")
    files = sorted({f"tests/{m}" for m in re.findall(r"tests/(\w+/test_\w+\.py)", doc)})
    ids = set(_collect(files))
    funcs = {i.split("[")[0] for i in ids}
    here = "tests/cli/test_bad_input.py"

    # every reference resolves (bad-input rows name this file's tests without a path)
    refs = []
    catalogue = _section(doc, "## Bad-input catalogue")
    too_small_rows = _section(doc, "### 6. Inputs too small")  # also this file's tests
    for text, default in ((doc, None), (catalogue, here), (too_small_rows, here)):
        for f, name, case in REF.findall(text):
            path = f"tests/{f}" if f else default
            if path is None:
                continue
            refs.append(f"{path}::{name}{case}")
    unknown = [r for r in refs if r not in ids and r not in funcs]
    assert not unknown, f"the doc names tests that do not exist: {unknown}"

    # every test and case of this file has a catalogue row
    named = set(refs)
    missing = sorted(
        i for i in ids
        if i.startswith(here) and i not in named and i.split("[")[0] not in named
        and "test_catalogue_table_lists_every_test" not in i
        and not i.startswith(f"{here}::test_input_too_small_for_the_run")
    )  # fmt: skip
    assert not missing, f"tests of {here} without a catalogue row: {missing}"
    too_small = {i for i in ids if "test_input_too_small_for_the_run[" in i}
    assert too_small <= named, f"class 6 cases without a row: {too_small - named}"

    # *xfail* rows <-> xfail markers
    marked = {f"{here}::{n}" for n in _xfail_cases(sys.modules[__name__])}
    xfail_rows = set()
    for row in _table_rows(catalogue):
        if any("*xfail*" in c for c in row):
            xfail_rows |= {f"{here}::{n}{c}" for _, n, c in REF.findall(row[-1])}
    assert xfail_rows == marked, f"*xfail* rows {xfail_rows} vs xfail tests {marked}"

    # class 1: one row per config key / command option, its values exactly the cases run
    sec1 = _section(doc, "### 1. Every setting has a declared domain")
    listed = set()
    for row in _table_rows(sec1)[1:]:
        key = row[0].strip("`")
        for value in re.findall(r"`([^`]+)`", row[2]):
            listed.add(f"{key}={value}")
    run = set()
    for i in ids:
        m = re.match(
            r"tests/config/test_domains.py::test_out_of_domain_(?:config_value|option)_is_named\[(.*)\]$",
            i,
        )
        if m:
            run.add(m.group(1))
    assert run == listed, (
        f"class 1 table vs tests: cases without a row {sorted(run - listed)}; rows without a "
        f"case {sorted(listed - run)}. The rows of every field and option now:\n"
        + "\n".join(_domain_rows())
    )

    # classes 3 and 8: the matrices
    def matrix(heading: str, make) -> set[str]:
        rows = [r for r in _table_rows(_section(doc, heading)) if r and r[0].startswith("`")]
        header = next(r for r in _table_rows(_section(doc, heading)) if r[0] == "Command")
        return {case for r in rows for case in make(header, r)}

    def outputs(header, r):
        cmd, opt = r[0].strip("`"), r[1].strip("`")
        for kind, cell in zip(header[2:], r[2:]):
            if kind == "an_input":
                yield from (f"{cmd} {opt} an_input {i}" for i in re.findall(r"`([^`]+)`", cell))
            elif cell == "\u2713":
                yield f"{cmd} {opt} {kind}"

    def devices(header, r):
        if len(r) == len(header) and header[1] == "unknown_name":
            yield from (
                f"{r[0].strip('`')}-{k}" for k, c in zip(header[1:], r[1:]) if c == "\u2713"
            )

    for heading, make, test in (
        ("### 3. Every output path", outputs, "tests/cli/test_outputs.py::test_bad_output_path_stops_before_work"),
        ("### 8. Device and resource errors", devices, "tests/cli/test_devices.py::test_bad_device_is_one_clear_line"),
    ):  # fmt: skip
        run = {i[len(test) + 1 : -1] for i in ids if i.startswith(test + "[")}
        listed = matrix(heading, make)
        assert run == listed, (
            f"{heading}: cases without a mark {run - listed}, marks without a case {listed - run}"
        )

    # every test of every file in the doc's table of test files is named somewhere in it
    listed_files = set(re.findall(r"^\| `(tests/\w+/test_\w+\.py)`", doc, flags=re.M))
    unnamed = sorted(
        f for f in funcs if f.split("::")[0] in listed_files and f.split("::")[1] not in doc
    )
    assert not unnamed, f"tests the doc does not name: {unnamed}"
