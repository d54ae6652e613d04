"""Issue 63 class 3: a stranger's files are bounded by what they become, not by their bytes.

- A tokenizer.json's entries are counted before the tokenizers library builds them (every shape
  of the attack: repeated merges as strings and as pairs, a huge vocabulary, added tokens), at
  a small monkeypatched bound and at the real one (a 17 MB file just past 2^23 entries).
- The normaliser x pre-tokeniser and the decoder expansion per character: each way of growing
  text (Replace by a string and by a regex, Prepend, Sequences that multiply, a decoder
  Replace, byte-level twice after NFKC, a precompiled map) refused; released pipelines (Llama 2,
  Qwen2, BERT, NFKC + byte-level) accepted; and the bound is never below what the library
  really produces.
- Regexes from the file: repeated repetitions refused statically, a pattern the engine gives up
  on refused at load by the probes, a panic while encoding turned into one error; released
  patterns accepted. Both tokenizer readers (prepare's `load_tokenizer`, import's) and the CLI.
- A config.json's sizes checked on the raw JSON before any per-layer list (every size key).
- RoPE tables built for the positions used, not the claimed context (16M), with the non-finite
  check for the whole context done analytically -- equal to building the tables.
- `prune --calibration-tokens` past the train split; `train.distill_temperature` bounds.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as Backend

import fault_harness as H
from taperlm.cli import main
from taperlm.config import ModelConfig, RunConfig, apply_overrides, run_config_from_dict, to_dict
from taperlm.config.budget import ROPE_PREBUILT, memory_floor
from taperlm.data import tokenizer_bounds as TB
from taperlm.data.loader import open_split
from taperlm.data.tokenizer import Tokenizer, load_tokenizer
from taperlm.errors import ConfigError, DataError
from taperlm.hf import llama
from taperlm.interop.importing import read_tokenizer
from taperlm.models import TaperedLM
from taperlm.models.layers import Rotary
from taperlm.spec.domains import MAX_CONTEXT, MAX_VOCAB


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("bounds-data"))


@pytest.fixture(scope="module")
def base_tokenizer(data) -> dict:
    return json.loads((data / "tokenizer" / "tokenizer.json").read_text())


def _read_prepare(path: Path) -> object:
    return load_tokenizer(path)


def _read_import(path: Path) -> object:
    (path.parent / "tokenizer_config.json").write_text('{"eos_token": "<|endoftext|>"}')
    return read_tokenizer(path.parent, {}, 1 << 20)


READERS = {"prepare": _read_prepare, "import": _read_import}


def _write(tmp_path: Path, tok: dict | str) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir(exist_ok=True)
    path = folder / "tokenizer.json"
    path.write_text(tok if isinstance(tok, str) else json.dumps(tok))
    return path


# ----------------------------------------------------------------------------------------------
# entries


def _merges(tok: dict, n: int) -> None:
    tok["model"]["merges"] = [tok["model"]["merges"][0]] * n


def _merge_pairs(tok: dict, n: int) -> None:
    first = tok["model"]["merges"][0]
    pair = first.split(" ") if isinstance(first, str) else first
    tok["model"]["merges"] = [pair] * n


def _vocabulary(tok: dict, n: int) -> None:
    vocab = tok["model"]["vocab"]
    vocab |= {f"zz{i}": len(vocab) + i for i in range(n)}


def _added(tok: dict, n: int) -> None:
    top = max(tok["model"]["vocab"].values())
    tok["added_tokens"] += [
        {"id": top + 1 + i, "content": f"<x{i}>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i in range(n)
    ]  # fmt: skip


ENTRY_ATTACKS = {"merges": _merges, "merge_pairs": _merge_pairs, "vocabulary": _vocabulary,
                 "added_tokens": _added}  # fmt: skip


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("attack", sorted(ENTRY_ATTACKS))
def test_entries_are_counted_before_the_library_builds_them(
    tmp_path, base_tokenizer, monkeypatch, reader, attack
):
    tok = json.loads(json.dumps(base_tokenizer))
    ENTRY_ATTACKS[attack](tok, 3000)
    path = _write(tmp_path, tok)
    built = []
    real = TB.Backend.from_str
    monkeypatch.setattr(TB.Backend, "from_str", lambda text: built.append(1) or real(text))
    READERS[reader](path)  # within the real bound: built and read
    assert built
    built.clear()
    monkeypatch.setattr(TB, "MAX_ENTRIES", 2000)
    with pytest.raises(DataError, match="more than the 2,000 taperlm builds") as err:
        READERS[reader](path)
    assert str(path) in str(err.value)
    assert not built  # refused before the library saw it


def test_the_real_entry_bound_refuses_a_file_just_past_it(tmp_path, monkeypatch):
    """The default bound, on a 17 MB file of 2^23 + 1 entries: refused without a parse."""
    monkeypatch.setattr(TB.Backend, "from_str", lambda text: pytest.fail("parsed"))
    text = '{"model": {"type": "BPE", "merges": [' + "0," * TB.MAX_ENTRIES + "0]}}"
    path = _write(tmp_path, text)
    start = time.monotonic()
    with pytest.raises(DataError, match="8,388,6"):
        load_tokenizer(path)
    assert time.monotonic() - start < 10


def test_gpt2_files_are_counted_too(tmp_path, monkeypatch):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "a b\n" * 3000)
    monkeypatch.setattr(TB, "MAX_ENTRIES", 2000)
    with pytest.raises(DataError, match="more than the 2,000"):
        load_tokenizer(folder)


# ----------------------------------------------------------------------------------------------
# expansion


def _replace(pattern: dict, content: str) -> dict:
    return {"type": "Replace", "pattern": pattern, "content": content}


SPLIT_GPT2 = {"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {"Regex":
              r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"}}  # fmt: skip
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}  # fmt: skip

# name -> {component: definition}; refused ones grow text past MAX_EXPANSION
GROWING = {
    "replace_a_space_by_20000": {"normalizer": _replace({"String": " "}, "x" * 20000)},
    "replace_by_regex": {"normalizer": _replace({"Regex": " "}, "x" * 200)},
    "prepend": {"normalizer": {"type": "Prepend", "prepend": "x" * 200}},
    "sequence_that_multiplies": {
        "normalizer": {"type": "Sequence", "normalizers": [_replace({"String": " "}, "     ")] * 3}
    },
    "decoder_replace": {"decoder": _replace({"String": "a"}, "x" * 500)},
    "nfkc_then_byte_level_twice": {
        "normalizer": {"type": "NFKC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [BYTE_LEVEL, BYTE_LEVEL]},
    },
}
RELEASED = {
    "llama2": {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, _replace({"String": " "}, "\u2581")]},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": [
            _replace({"String": "\u2581"}, " "), {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    },
    "qwen2": {
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT_GPT2, BYTE_LEVEL]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    },
    "bert": {
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
    },
    "nfkc_byte_level": {"normalizer": {"type": "NFKC"}, "pre_tokenizer": BYTE_LEVEL},
}  # fmt: skip


def _with(base: dict, parts: dict) -> dict:
    tok = json.loads(json.dumps(base))
    tok.update(parts)
    return tok


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("case", sorted(GROWING))
def test_a_pipeline_that_grows_text_is_refused(tmp_path, base_tokenizer, reader, case):
    path = _write(tmp_path, _with(base_tokenizer, GROWING[case]))
    with pytest.raises(DataError, match="can turn one character into up to") as err:
        READERS[reader](path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("case", sorted(RELEASED))
def test_released_pipelines_are_accepted(tmp_path, base_tokenizer, reader, case):
    READERS[reader](_write(tmp_path, _with(base_tokenizer, RELEASED[case])))


PROBE_TEXT = "a b  c\u00e9 \ufdfa \u0130 \u4e00x " * 8  # spaces, a ligature NFKC makes 18 of, İ


@pytest.mark.parametrize("case", sorted(GROWING) + sorted(RELEASED))
def test_the_bound_is_never_below_what_the_library_produces(base_tokenizer, case):
    parts = {**RELEASED, **GROWING}[case]
    backend = Backend.from_str(json.dumps(_with(base_tokenizer, parts)))
    n = len(PROBE_TEXT)
    grown = n
    if backend.normalizer is not None:
        grown = len(backend.normalizer.normalize_str(PROBE_TEXT))
    if backend.pre_tokenizer is not None:
        text = backend.normalizer.normalize_str(PROBE_TEXT) if backend.normalizer else PROBE_TEXT
        grown = sum(len(p) for p, _ in backend.pre_tokenizer.pre_tokenize_str(text))
    state = TB._state
    bound = TB.expansion(state(backend.normalizer)) * TB.expansion(state(backend.pre_tokenizer))
    assert grown <= bound * n
    if backend.decoder is not None:
        tokens = ["a", "\u2581b", "aa", " ", "\u0120x"] * 4
        decoded = backend.decoder.decode(tokens)
        assert len(decoded) <= TB.expansion(state(backend.decoder)) * sum(map(len, tokens))


def test_a_precompiled_map_is_bounded_by_its_longest_replacement():
    pool = b"x" * 300 + b"\0ab\0"
    blob = struct.pack("<I", 8) + b"\0" * 8 + pool
    step = {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(blob).decode()}
    assert TB.expansion(step) == 300
    assert TB.expansion({"type": "NotAStep"}) == float("inf")


def test_a_growing_normalizer_through_prepare(tmp_path, base_tokenizer, capsys):
    path = _write(tmp_path, _with(base_tokenizer, GROWING["replace_a_space_by_20000"]))
    source = tmp_path / "c.txt"
    source.write_text(H.corpus_text(200))
    argv = ["prepare", "--source", str(source), "--tokenizer", str(path), "--out", str(tmp_path / "d")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err, err
    assert not (tmp_path / "d").exists()


# ----------------------------------------------------------------------------------------------
# regexes

STATIC = ["(a+)+$", "(a*)*b", "(?:x+y?)+z", "((ab)*c)*", r"(\w+\s?)+$", "(a{2,})+", "(?i:a+)*"]
PROBED = ["(a|a)*$", "(a|aa)+$", r"(\s|\s)*$"]  # exponential without nested quantifiers
LAUNCHED = {
    "gpt2": SPLIT_GPT2["pattern"]["Regex"],
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "o200k": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}  # fmt: skip


def _split(pattern: str) -> dict:
    return {"pre_tokenizer": {"type": "Split", "pattern": {"Regex": pattern},
                              "behavior": "Isolated", "invert": False}}  # fmt: skip


def _replace_regex(pattern: str) -> dict:
    return {"normalizer": _replace({"Regex": pattern}, "")}


PLACES = {"split": _split, "replace": _replace_regex}


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("pattern", STATIC + PROBED + ["a" * 5000])
def test_an_unbounded_regex_is_refused_at_load(tmp_path, base_tokenizer, place, pattern):
    path = _write(tmp_path, _with(base_tokenizer, PLACES[place](pattern)))
    start = time.monotonic()
    with pytest.raises(DataError) as err:
        load_tokenizer(path)
    text = str(err.value)
    assert str(path) in text
    expected = {True: "repeats a repeated group", False: "gives up on"}[pattern in STATIC]
    assert (expected if len(pattern) < 5000 else "more than 4,096") in text, text
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("name", sorted(LAUNCHED))
def test_released_patterns_are_accepted(tmp_path, base_tokenizer, place, name):
    load_tokenizer(_write(tmp_path, _with(base_tokenizer, PLACES[place](LAUNCHED[name]))))


def test_the_static_check_skips_escapes_and_classes():
    assert TB.repeated_repetition(r"\(a+\)+") is None
    assert TB.repeated_repetition(r"[(a+)+]x") is None
    assert TB.repeated_repetition(r"(?:ab)+(c+)?") is None
    assert TB.repeated_repetition(r"(x{1,3})?") is None
    assert TB.repeated_repetition(r"(a+)+") == "(a+)+"


def test_a_panic_while_encoding_is_one_error(base_tokenizer):
    backend = Backend.from_str(json.dumps(_with(base_tokenizer, _split(PROBED[0]))))  # unchecked
    tok = Tokenizer(backend, kind="local", spec="crafted.json", eos_token="<|endoftext|>")
    for call in (lambda: tok.encode("a" * 64 + "!"), lambda: tok.encode_batch(["a" * 64 + "!"])):
        with TB.quiet_stderr(), pytest.raises(DataError, match=r"tokenizer crafted\.json failed"):
            call()


# ----------------------------------------------------------------------------------------------
# model sizes, context, calibration, distillation


def _config(**changes) -> dict:
    cfg = llama.llama_config(
        ModelConfig(vocab_size=320, d_model=16, n_layers=2, n_heads=2, mlp_width=32).resolve()
    )
    return cfg | changes


@pytest.mark.parametrize("key", sorted(llama._SIZE_LIMITS))
@pytest.mark.parametrize("over", [1, 300_000_000, 10**30])
def test_config_sizes_are_checked_on_the_raw_json(tmp_path, key, over):
    value = llama._SIZE_LIMITS[key] + 1 if over == 1 else over
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(ConfigError, match=f"its {key} is {value:,}"):
            llama.model_config(tmp_path, _config(**{key: value}))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < 1 and peak < 1 << 20


def _rotaries(model: torch.nn.Module) -> list[Rotary]:
    return [m for m in model.modules() if isinstance(m, Rotary)]


def test_a_16m_context_builds_only_the_positions_used():
    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, mlp_width=32,
                      context_length=MAX_CONTEXT).resolve()  # fmt: skip
    model = TaperedLM(cfg).eval()
    assert ROPE_PREBUILT == Rotary.PREBUILT
    for r in _rotaries(model):
        assert r.cos.shape[0] == Rotary.PREBUILT
    from taperlm.models.generation import SamplingConfig, generate_tokens

    out = list(generate_tokens(model, [1, 2, 3], SamplingConfig(max_new_tokens=2, temperature=0)))
    assert len(out) <= 2
    assert all(r.cos.shape[0] == Rotary.PREBUILT for r in _rotaries(model))
    need, _ = memory_floor(cfg)
    assert need < 2 * Rotary.PREBUILT * cfg.head_dim * 4 + 10 * 2**20
    with torch.no_grad():  # positions past the prebuilt ones are built as they are reached
        x = torch.randn(1, 1, 3, 8)
        r = _rotaries(model)[0]
        r(x, start=Rotary.PREBUILT + 5)
        assert r.cos.shape[0] >= Rotary.PREBUILT + 8


@pytest.mark.parametrize("theta", [1e4, 1e-30, 1e-35, 3e-36, 1e-36, 2.7e-37])
def test_the_analytic_rope_check_equals_building_the_tables(monkeypatch, theta):
    def refused() -> bool:
        try:
            Rotary(16, 4096, theta)
        except ConfigError:
            return True
        return False

    eager = refused()  # PREBUILT > 4096: the whole table is built and checked
    monkeypatch.setattr(Rotary, "PREBUILT", 64)
    assert refused() == eager


def test_calibration_past_the_split_is_refused(data):
    from taperlm.compress import prune as P

    _, stream = open_split(data, "train", verify=False)
    held = (len(stream) - 1) // 32 * 32
    assert P.calibration_budget(data, 32, None) == min(65536, held)
    assert P.calibration_budget(data, 32, held) == held
    for asked in (held + 32, 10**9):
        with pytest.raises(DataError, match=f"--calibration-tokens {held} or fewer"):
            P.calibration_budget(data, 32, asked)
        with pytest.raises(DataError, match="asks for more than the train split"):
            next(P.calibration_windows(data, 32, asked))


@pytest.mark.parametrize("value", ["1e30", "1e-30", "0", "-1", "100.5", "0.009", "inf", "nan"])
def test_distill_temperature_outside_its_domain(value):
    data = to_dict(RunConfig())
    with pytest.raises(ConfigError, match=r"distill_temperature must be in \[0\.01, 100\]"):
        apply_overrides(data, [f"train.distill_temperature={value}"])
        run_config_from_dict(data)
    data = to_dict(RunConfig())
    data["train"]["distill_temperature"] = float(value)  # a config file's value
    with pytest.raises(ConfigError, match="distill_temperature"):
        run_config_from_dict(data)


@pytest.mark.parametrize("value", ["0.01", "1", "20", "100"])
def test_distill_temperature_inside_its_domain(value):
    data = to_dict(RunConfig())
    apply_overrides(data, [f"train.distill_temperature={value}"])
    assert run_config_from_dict(data).train.distill_temperature == float(value)


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("top", [MAX_VOCAB, 2**31, 2**32 - 1])
def test_an_id_past_the_largest_vocabulary_is_refused(tmp_path, base_tokenizer, reader, top):
    """One vocabulary entry with id 2^31 made prepare spend 45 s and write a data dir of
    2,147,483,649 ids; every table sized by ids is that large."""
    tok = json.loads(json.dumps(base_tokenizer))
    tok["model"]["vocab"]["zz"] = top
    path = _write(tmp_path, tok)
    start = time.monotonic()
    # import compares with its model's rows first; both name the id
    with pytest.raises(DataError, match=f"has ids up to ({top:,}, past the 16,777,216|{top} but)"):
        READERS[reader](path)
    assert time.monotonic() - start < 10


ARGS = {  # constructor arguments of the steps that need some
    "Precompiled": lambda: (struct.pack("<I", 0) + b"a\0",),  # an empty trie, one replacement
    "Replace": lambda: (" ", "_"),
    "Sequence": lambda: ([],),
    "CharDelimiterSplit": lambda: ("x",),
    "Split": lambda: (" ", "isolated"),
}


def _steps() -> list[tuple[str, str]]:
    from tokenizers import decoders, normalizers, pre_tokenizers

    bases = {"Normalizer", "PreTokenizer", "Decoder", "DecodeStream"}
    return [
        (mod.__name__.rsplit(".", 1)[1], name)
        for mod in (normalizers, pre_tokenizers, decoders)
        for name in dir(mod)
        if isinstance(getattr(mod, name), type) and not name.startswith("_") and name not in bases
    ]


@pytest.mark.parametrize(("module", "name"), _steps())
def test_every_step_of_the_library_has_a_bound(module, name):
    """Each normaliser, pre-tokeniser and decoder class the installed tokenizers library has is
    known to `expansion` (a new one would be refused as unbounded: this test names it)."""
    import importlib

    cls = getattr(importlib.import_module(f"tokenizers.{module}"), name)
    try:
        step = cls(*ARGS.get(name, lambda: ())())
    except TypeError:  # a signature this table does not know: still must be typed
        pytest.fail(f"give {module}.{name} constructor arguments in ARGS")
    assert TB.expansion(TB._state(step)) < float("inf")


def test_a_pattern_the_probes_miss_ends_prepare_in_one_line(tmp_path, base_tokenizer, capfd):
    """`(\\s|\\s)*x` passes the probes (they hold no `x`) and backtracks exponentially on
    spaces followed by `!x`: the engine's step limit ends the encode (a Rust panic, whose own
    report and backtrace to fd 2 are silenced) and prepare says so in one line."""
    split = _split(r"(\s|\s)*x")["pre_tokenizer"]
    parts = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, BYTE_LEVEL]}}
    path = _write(tmp_path, _with(base_tokenizer, parts))
    load_tokenizer(path)  # accepted at load
    source = tmp_path / "c.txt"
    source.write_text("hello world\n" + " " * 80 + "!x\n")
    argv = ["prepare", "--source", str(source), "--tokenizer", str(path),
            "--out", str(tmp_path / "d"), "--workers", "1", "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert err.strip().splitlines() == [err.strip()], err
    assert f"tokenizer {path} failed on this text" in err and "panicked" not in err
    assert not (tmp_path / "d" / "meta.json").exists()  # no data dir (its lock and marker stay)
