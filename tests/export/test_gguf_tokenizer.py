"""The tokenizer of a GGUF file rebuilt on import (`taperlm.interop.gguf_tokenizer.read_gguf_tokenizer`): our own GGUF export
imports back with a tokenizer that encodes every text as the run's did; llama.cpp's digit-first
pre-tokenizers (SmolLM's `smollm`) split as llama.cpp does, not as GPT-2's regex; control
tokens are matched in text; every kind it cannot rebuild exactly gives no tokenizer and says
why, in the run's import.json and on the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import fault_harness as H

pytest.importorskip("gguf")

from taperlm.cli import main
from taperlm.data.tokenizer import load_tokenizer
from taperlm.errors import DataError
from taperlm.interop.gguf_export import write_gguf
from taperlm.interop.gguf_tokenizer import (
    EXPORT_PRE_NAMES,
    PRE_TOKENIZERS,
    gguf_vocab,
    llama_cpp_pre_name,
)
from taperlm.interop.gguf_tokenizer import gguf_tokenizer_json as tokenizer_json
from taperlm.interop.gguf_tokenizer import read_gguf_tokenizer as read_tokenizer

TEXTS = [
    "Hello world, it's 2024!\n\n  def f(x):\treturn x",
    "naïve café — 東京 🙂 <|endoftext|> after the end",
    "   leading spaces and trailing   ",
    "numbers 1234567890 and 3.14159",
]


def test_our_gguf_export_imports_back_with_its_tokenizer(tmp_path, capsys):
    from conftest import tiny_config
    from taperlm.models import TaperedLM

    data = H.prepare_data(tmp_path / "data")
    tok = load_tokenizer(data / "tokenizer")
    torch.manual_seed(0)
    model = TaperedLM(tiny_config(vocab_size=tok.vocab_size)).eval()
    path = write_gguf(model, tok, tmp_path / "m.gguf", dtype="f32")
    capsys.readouterr()
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "tokenizer: rebuilt from the file's vocabulary" in out and "note:" not in out
    back = load_tokenizer(tmp_path / "run" / "tokenizer")
    corpus = (tmp_path / "data" / "corpus0.txt").read_text(encoding="utf-8")[:20_000]
    for text in [*TEXTS, corpus]:
        assert back.encode(text) == tok.encode(text), text[:40]
        assert back.decode(back.encode(text)) == text
    assert (back.eos_id, back.vocab_size) == (tok.eos_id, tok.vocab_size)
    record = json.loads((tmp_path / "run" / "import.json").read_text())
    assert record["tokenizer"] and "no_tokenizer_because" not in record


def _alphabet() -> list[str]:
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


def _meta(pre: str | None, **changes: Any) -> dict[str, Any]:
    """A byte-level BPE in GGUF metadata whose merges join a space with digits ("Ġ12"): GPT-2's
    regex keeps " 12" one piece (merged), a digit-first pre-tokenizer never lets them meet."""
    tokens = ["<|endoftext|>", *_alphabet(), "12", "Ġ1", "Ġ12"]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
        "tokenizer.ggml.merges": ["Ġ 1", "Ġ1 2", "1 2"],
        "tokenizer.ggml.eos_token_id": 0,
    }
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    return meta | changes


def test_the_pre_tokenizer_is_the_one_llama_cpp_uses():
    gpt2, _ = read_tokenizer("t.gguf", _meta("gpt-2"), 400)
    default, _ = read_tokenizer("t.gguf", _meta(None), 400)
    smollm, _ = read_tokenizer("t.gguf", _meta("smollm"), 400)
    assert gpt2 is not None and default is not None and smollm is not None
    ids = {t: i for i, t in enumerate(_meta(None)["tokenizer.ggml.tokens"])}
    assert gpt2.encode("a 12") == default.encode("a 12") == [ids["a"], ids["Ġ12"]]
    assert smollm.encode("a 12") == [ids["a"], ids["Ġ"], ids["1"], ids["2"]]
    # a control token in text is that one id, in both
    for tok in (gpt2, smollm):
        assert tok.encode("a<|endoftext|>b") == [ids["a"], 0, ids["b"]]
        assert tok.eos_id == 0 and tok.vocab_size == len(ids)


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"tokenizer.ggml.model": "llama"}, "'llama' kind"),
        ({"tokenizer.ggml.pre": "falcon"}, "'falcon'"),
        ({"tokenizer.ggml.merges": ["1 2", "Ġ1"]}, "two tokens joined by one space"),
        ({"tokenizer.ggml.tokens": ["a", "a"]}, "names a token twice"),
        ({"tokenizer.ggml.tokens": "abc"}, "not a list of strings"),
        ({"tokenizer.ggml.eos_token_id": 10_000}, "no EOS token"),
    ],
)
def test_what_cannot_be_rebuilt_exactly_gives_no_tokenizer_and_why(changes, needle):
    tok, why = read_tokenizer("t.gguf", _meta("smollm", **changes), 400)
    assert tok is None and needle in why, why


def test_more_tokens_than_the_model_has_rows_is_no_tokenizer():
    assert tokenizer_json(_meta("gpt-2"), 100) == (None, "it has 260 tokens but the model only 100 rows")  # fmt: skip
    assert tokenizer_json({}, 100)[1] == "the file holds no tokenizer (tokenizer.ggml.model)"


def test_a_file_without_a_tokenizer_imports_and_says_why(tmp_path, capsys):
    """A GGUF with no tokenizer.ggml.* keys: the run has weights, no tokenizer, and the reason."""
    gguf = pytest.importorskip("gguf")
    from conftest import tiny_config
    from taperlm.interop.gguf_export import gguf_tensors

    cfg = tiny_config(vocab_size=64)
    model = __import__("taperlm.models", fromlist=["TaperedLM"]).TaperedLM(cfg)
    w = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "llama")
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.mlp_widths[0])
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.kv_heads)
    w.add_layer_norm_rms_eps(float(cfg.norm_eps))
    for name, array in gguf_tensors(model, "f32").items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["import", str(tmp_path / "bare.gguf"), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "note: the run has no tokenizer (the file holds no tokenizer" in out
    assert not (tmp_path / "run" / "tokenizer").exists()
    record = json.loads((tmp_path / "run" / "import.json").read_text())
    assert record["tokenizer"] is None and "holds no tokenizer" in record["no_tokenizer_because"]


def test_every_known_pre_tokenizer_builds():
    for pre in PRE_TOKENIZERS:
        tok, why = read_tokenizer(Path("t.gguf"), _meta(pre), 400)
        assert tok is not None, (pre, why)


# ----------------------------------------------------------------------------------------------
# export: the pre-tokenizer's name is the one import reads back, and only a known splitting


def _exported_meta(tok: Any, vocab_size: int) -> dict[str, Any]:
    """The tokenizer.ggml.* keys `taperlm export --format gguf` writes for `tok`."""
    v = gguf_vocab(tok, vocab_size)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": v["pre"],
        "tokenizer.ggml.tokens": v["tokens"],
        "tokenizer.ggml.token_type": v["types"],
        "tokenizer.ggml.merges": v["merges"],
        "tokenizer.ggml.eos_token_id": tok.eos_id,
    }


@pytest.mark.parametrize("pre", [None, *PRE_TOKENIZERS])
def test_every_pre_tokenizer_import_rebuilds_exports_and_reads_back_the_same(pre):
    """Each name import knows: the tokenizer rebuilt from it exports under a name export
    writes, and that file's tokenizer encodes every text as the first did (digits included:
    the test vocabulary merges a space with digits, which only GPT-2's regex lets meet)."""
    tok, why = read_tokenizer("t.gguf", _meta(pre), 400)
    assert tok is not None, why
    data = json.loads(tok.backend.to_str())
    name = llama_cpp_pre_name(data["pre_tokenizer"], data["model"].get("ignore_merges", False))
    assert name in EXPORT_PRE_NAMES
    assert PRE_TOKENIZERS[name] == PRE_TOKENIZERS[pre or "default"]
    back, why = read_tokenizer("t.gguf", _exported_meta(tok, 400), 400)
    assert back is not None, why
    for text in [*TEXTS, "a 12 b 123 1 2 x12y 0.5"]:
        assert back.encode(text) == tok.encode(text), text


_BYTE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_LLAMA3_SPLIT = {
    "type": "Split",
    "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"},
    "behavior": "Isolated",
    "invert": False,
}


@pytest.mark.parametrize(
    "pre",
    [
        _BYTE | {"add_prefix_space": True},  # " " before the text: llama.cpp adds none
        _BYTE | {"use_regex": False},  # no GPT-2 split at all
        {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": False}, _BYTE],
        },
        {
            "type": "Sequence",
            "pretokenizers": [_BYTE, {"type": "Digits", "individual_digits": True}],
        },
        {"type": "Sequence", "pretokenizers": [_LLAMA3_SPLIT, _BYTE | {"use_regex": False}]},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        {"type": "Whitespace"},
        {"type": "Sequence", "pretokenizers": []},
    ],
    ids=[
        "prefix-space",
        "no-regex",
        "digit-runs",
        "digits-after",
        "llama3",
        "metaspace",
        "whitespace",
        "empty-sequence",
    ],
)
def test_export_refuses_a_pre_tokenizer_llama_cpp_is_not_known_to_reproduce(pre):
    from tokenizers import Tokenizer as Backend

    assert llama_cpp_pre_name(pre) is None
    data, _ = tokenizer_json(_meta("gpt-2"), 400)
    data["pre_tokenizer"] = pre
    with pytest.raises(DataError, match=r"llama.cpp reproduces \(its pre-tokenizer is "):
        gguf_vocab(Backend.from_str(json.dumps(data)), 400)


def test_trim_offsets_does_not_change_the_name():
    """trim_offsets moves offsets, never a split: a tokenizer.json with either value is GPT-2's."""
    assert llama_cpp_pre_name(_BYTE | {"trim_offsets": False}) == "gpt-2"
    assert llama_cpp_pre_name({"type": "ByteLevel"}) == "gpt-2"  # the defaults taperlm writes


def test_a_smollm_model_exports_to_gguf_and_imports_back_with_its_tokenizer(tmp_path, capsys):
    """A run whose tokenizer splits digits first (SmolLM's, as `taperlm import` rebuilds it from
    a GGUF file) exports with tokenizer.ggml.pre `smollm`; importing that file gives the same
    tokenizer and the same logits."""
    gguf = pytest.importorskip("gguf")
    from conftest import tiny_config
    from taperlm.models import TaperedLM

    tok, _ = read_tokenizer("t.gguf", _meta("smollm"), 400)
    torch.manual_seed(0)
    model = TaperedLM(tiny_config(vocab_size=264)).eval()
    path = write_gguf(model, tok, tmp_path / "m.gguf", dtype="f32")
    assert gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents() == "smollm"
    capsys.readouterr()
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) == 0
    back = load_tokenizer(tmp_path / "run" / "tokenizer")
    for text in [*TEXTS, "a 12 b 123"]:
        assert back.encode(text) == tok.encode(text), text
    from taperlm.checkpoint.loading import load_run_model

    again, _ = load_run_model(tmp_path / "run")
    ids = torch.tensor([tok.encode("a 12 b 123 numbers")])
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(ids).logits, model(ids).logits, atol=1e-5, rtol=0)


# the pre-tokenizers of Llama 3's and Qwen2's released tokenizer.json files, as written there
_RELEASED = {
    "llama-bpe": '{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:\'s|\'t|\'re|\'ve|\'m|\'ll|\'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]}',
    "qwen2": '{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:\'s|\'t|\'re|\'ve|\'m|\'ll|\'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]}',
}


@pytest.mark.parametrize("name, ignore_merges", [("llama-bpe", True), ("qwen2", False)])
def test_released_llama3_and_qwen2_pre_tokenizers_get_their_llama_cpp_names(name, ignore_merges):
    """A run imported from Llama 3 (ignore_merges true in its tokenizer.json) or Qwen2 exports
    to GGUF under the name llama.cpp splits it with; the same pre-tokenizer with the other
    ignore_merges is no known splitting (llama.cpp ties the two together per name)."""
    pre = json.loads(_RELEASED[name])
    assert llama_cpp_pre_name(pre, ignore_merges) == name
    assert llama_cpp_pre_name(pre, not ignore_merges) is None
    assert pre["pretokenizers"][0]["pattern"]["Regex"].count("\\p{N}") == 3  # a real regex
