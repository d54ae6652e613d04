"""The tokenizer of a GGUF file rebuilt on import (`taperlm.interop.importing.read_gguf_tokenizer`): our own GGUF export
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
from taperlm.interop.gguf_export import write_gguf
from taperlm.interop.importing import PRE_TOKENIZERS
from taperlm.interop.importing import gguf_tokenizer_json as tokenizer_json
from taperlm.interop.importing import read_gguf_tokenizer as read_tokenizer

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
        ({"tokenizer.ggml.pre": "qwen2"}, "'qwen2'"),
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
