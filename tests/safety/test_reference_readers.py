"""Issue 63 class 5: what the reference readers refuse, we refuse -- tested side by side.

Each case builds one hostile file, asks the reference library (safetensors; tokenizers and
transformers) and our reader, and checks that both refuse -- and, for the controls, that both
accept. Safetensors: every way a header's byte ranges can fail to tile the data section
(overlap, aliasing, a gap, bytes after the last tensor, past the end, a wrong length, a negative
offset) and every malformed header (not an object, not JSON, a length past the file, not
an unknown dtype, no shape). Tokenizer vs model: a tokenizer whose ids reach
past the model's embedding rows (a gap in its ids, an added token past the end) -- the
reference model cannot embed such an id, and our import refuses the folder.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

import fault_harness as H
from hf_folders import VOCAB, make_llama_folder
from taperlm.cli import main
from taperlm.errors import CheckpointError
from taperlm.hf.safetensors_file import read_header, read_tensors

F32 = lambda n: {"dtype": "F32", "shape": [n]}  # noqa: E731


def _file(path: Path, header: dict | bytes, data: bytes, length: int | None = None) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def _at(start: int, end: int, n: int = 4) -> dict:
    return {**F32(n), "data_offsets": [start, end]}


HOSTILE = {  # name -> (header, data bytes, header length override)
    "overlap": ({"a": _at(0, 16), "b": _at(8, 24)}, 24, None),
    "aliased": ({"a": _at(0, 16), "b": _at(0, 16)}, 16, None),
    "gap": ({"a": _at(0, 16), "b": _at(20, 36)}, 36, None),
    "bytes_after_the_last": ({"a": _at(0, 16)}, 20, None),
    "past_the_end": ({"a": _at(0, 16)}, 8, None),
    "wrong_length": ({"a": _at(0, 12)}, 12, None),
    "negative_offset": ({"a": _at(-4, 12)}, 16, None),
    "not_an_object": (b"[]", 0, None),
    "not_json": (b'{"a": ', 0, None),
    "length_past_the_file": ({"a": _at(0, 16)}, 16, 1 << 20),
    "unknown_dtype": ({"a": {"dtype": "X9", "shape": [4], "data_offsets": [0, 16]}}, 16, None),
    "no_shape": ({"a": {"dtype": "F32", "data_offsets": [0, 16]}}, 16, None),
}
FINE = {  # both read these
    "two_in_order": ({"a": _at(0, 16), "b": _at(16, 32)}, 32),
    "listed_out_of_order": ({"b": _at(16, 32), "a": _at(0, 16)}, 32),
    "an_empty_tensor": ({"e": {**F32(0), "data_offsets": [0, 0]}, "a": _at(0, 16)}, 16),
    "metadata": ({"__metadata__": {"format": "pt"}, "a": _at(0, 16)}, 16),
    "header_padded_with_spaces": (json.dumps({"a": _at(0, 16)}).encode() + b"    ", 16),
}


def _reference_reads(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 -- safe_open has no iter


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_safetensors_header_is_refused_by_both(tmp_path, case):
    header, size, length = HOSTILE[case]
    path = _file(tmp_path / "x.safetensors", header, bytes(range(size)), length)
    with pytest.raises(Exception):  # noqa: B017 -- safetensors' own error type
        _reference_reads(path)
    with pytest.raises(CheckpointError) as err:
        read_header(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("case", sorted(FINE))
def test_a_valid_safetensors_file_is_read_alike_by_both(tmp_path, case):
    header, size = FINE[case]
    data = torch.arange(size // 4, dtype=torch.float32).numpy().tobytes()
    path = _file(tmp_path / "x.safetensors", header, data)
    theirs, ours = _reference_reads(path), read_tensors(path)
    assert sorted(theirs) == sorted(ours)
    for name, t in theirs.items():
        assert torch.equal(t, ours[name])


# ----------------------------------------------------------------------------------------------
# a tokenizer whose ids reach past the model's rows


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("reference-data"))


def _word_tokenizer(ids: dict[str, int], added: dict[str, int] | None = None) -> str:
    tok = Tokenizer(models.WordLevel(ids, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    for content in added or {}:
        tok.add_special_tokens([AddedToken(content, special=True)])
    return tok.to_str()


BASE = {"<unk>": 0, "<|endoftext|>": 1, "a": 2}
BEYOND = {
    "a_gap_in_the_ids": (_word_tokenizer({**BASE, "far": 5000}), "far", 5000),
    "the_last_row_plus_one": (_word_tokenizer({**BASE, "edge": VOCAB}), "edge", VOCAB),
    "an_added_token_past_the_end": (
        _word_tokenizer({**BASE, **{f"w{i}": 3 + i for i in range(VOCAB - 3)}}, {"<extra>": 0}),
        "<extra>",
        VOCAB,
    ),
}


@pytest.mark.parametrize("case", sorted(BEYOND))
def test_ids_past_the_rows_are_refused_by_both(tmp_path, data, capsys, case):
    transformers = pytest.importorskip("transformers")
    text, word, top = BEYOND[case]
    folder = make_llama_folder(tmp_path / "hf", data)
    (folder / "tokenizer.json").write_text(text)
    ids = Tokenizer.from_str(text).encode(word).ids
    assert ids == [top]  # the tokenizer gives the id ...
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with pytest.raises(IndexError), torch.no_grad():  # ... that the reference model cannot embed
        model(torch.tensor([ids]))
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"ids up to {top}" in err and f"vocab_size is {VOCAB}" in err, err
    assert not (tmp_path / "run").exists()


def test_ids_up_to_the_last_row_are_accepted_by_both(tmp_path, data):
    transformers = pytest.importorskip("transformers")
    text = _word_tokenizer({**BASE, "edge": VOCAB - 1})
    folder = make_llama_folder(tmp_path / "hf", data)
    (folder / "tokenizer.json").write_text(text)
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        model(torch.tensor([Tokenizer.from_str(text).encode("edge").ids]))
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 0
