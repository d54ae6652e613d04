"""Issue 63 class 4: no traceback from a stranger's model folder.

Every way a Hugging Face checkpoint folder can be damaged or crafted that these tests know of
-- an index naming a shard the folder lacks (an interrupted download: absent, or a dangling Hub
link), a shard name longer than any file name, per-layer sizes that overflow (DeciLM
`ffn_mult` 1e308, inf, a width past the domain), a JSON error in each JSON file import reads, a
file that is a link leading out of the folder (each file import reads), weights of each dtype
family taperlm does not load -- goes through `taperlm import` and must end in exit 2 with one
line that names the file, no traceback, nothing written. No message quotes a file's first
bytes read as a number unless the file is in the folder and looks like a safetensors file.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

import fault_harness as H
from hf_folders import make_llama_folder
from taperlm.cli import main
from taperlm.hf import llama

SECRET = b"SECRET12"  # the first 8 bytes of a file outside the folder
SECRET_NUMBER = str(struct.unpack("<Q", SECRET)[0])


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("stranger-data"))


def _refused(folder: Path, tmp_path: Path, capsys, *names: str) -> str:
    out = tmp_path / "run"
    assert main(["import", str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("taperlm import: error: "), err
    assert "Traceback" not in err
    for name in names:
        assert name in err, f"{name!r} not named in {err!r}"
    assert SECRET_NUMBER not in err
    assert not out.exists()
    return err


def test_the_base_folder_imports(tmp_path, data):
    """The control: the folder every case below damages imports as it is (one file, shards)."""
    assert main(["import", str(make_llama_folder(tmp_path / "a", data)), "--out", str(tmp_path / "r")]) == 0  # fmt: skip
    folder = make_llama_folder(tmp_path / "b", data, shards=True)
    assert main(["import", str(folder), "--out", str(tmp_path / "s")]) == 0


def _index(folder: Path) -> dict:
    return json.loads((folder / llama.INDEX_FILE).read_text())


def _rename_shard(folder: Path, new: str) -> None:
    index = _index(folder)
    old = "model-00002-of-00002.safetensors"
    index["weight_map"] = {k: (new if v == old else v) for k, v in index["weight_map"].items()}
    (folder / llama.INDEX_FILE).write_text(json.dumps(index))


SHARD_CASES = {
    "absent": lambda f: (f / "model-00002-of-00002.safetensors").unlink(),
    "dangling_hub_link": lambda f: (
        (f / "model-00002-of-00002.safetensors").unlink(),
        (f / "model-00002-of-00002.safetensors").symlink_to(f / "gone.safetensors"),
    ),
    "name_of_10000_characters": lambda f: _rename_shard(f, "m" * 10_000 + ".safetensors"),
    "name_of_300_multibyte_characters": lambda f: _rename_shard(f, "\u00e9" * 130),
}
SHARD_NEEDLES = {
    "absent": ["model-00002-of-00002.safetensors", "lacks", "download"],
    "dangling_hub_link": ["model-00002-of-00002.safetensors", "lacks", "download"],
    "name_of_10000_characters": ["10,012 characters", "longer than any file name"],
    "name_of_300_multibyte_characters": ["130 characters", "longer than any file name"],
}


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_index_names_a_shard_that_cannot_be_opened(tmp_path, data, capsys, case):
    folder = make_llama_folder(tmp_path / "hf", data, shards=True)
    SHARD_CASES[case](folder)
    _refused(folder, tmp_path, capsys, str(folder / llama.INDEX_FILE), *SHARD_NEEDLES[case])


def _decilm(folder: Path, mult) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    block = {
        "attention": {"n_heads_in_group": 1, "no_op": False, "replace_with_linear": False},
        "ffn": {"ffn_mult": 1.5, "no_op": False, "replace_with_linear": False},
    }
    cfg |= {"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas"}
    cfg |= {"intermediate_size": None, "num_key_value_heads": None}
    blocks = [json.loads(json.dumps(block)) for _ in range(cfg["num_hidden_layers"])]
    blocks[1]["ffn"]["ffn_mult"] = mult
    cfg["block_configs"] = blocks
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("mult", [1e308, float("inf"), 1e6, 2**70])
def test_decilm_ffn_mult_that_overflows(tmp_path, data, capsys, mult):
    folder = make_llama_folder(tmp_path / "hf", data)
    _decilm(folder, mult)
    _refused(folder, tmp_path, capsys, "layer 1's ffn_mult", "MLP width above")


JSON_FILES = [
    "config.json",
    llama.INDEX_FILE,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
]


@pytest.mark.parametrize("name", JSON_FILES)
@pytest.mark.parametrize("damage", ["cut", "key_twice", "not_utf8"])
def test_a_json_error_names_its_file(tmp_path, data, capsys, name, damage):
    folder = make_llama_folder(tmp_path / "hf", data, shards=name == llama.INDEX_FILE)
    path = folder / name
    text = path.read_text() if path.exists() else '{"eos_token": "<|endoftext|>"}'
    if damage == "cut":
        raw = text[: len(text) // 2].encode()
    elif damage == "key_twice":
        raw = text.replace("{", '{"x_": 1, "x_": 2, ', 1).encode()
    else:
        raw = b'{"a": "\xff\xfe"}'
    path.write_bytes(raw)
    _refused(folder, tmp_path, capsys, str(path))


LINKED = ["config.json", llama.WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json",
          "model-00001-of-00002.safetensors", llama.INDEX_FILE]  # fmt: skip


@pytest.mark.parametrize("name", LINKED)
def test_a_link_leading_out_is_refused_before_it_is_read(tmp_path, data, capsys, name):
    """A file of the folder linked to a file outside it (an /etc/passwd stand-in whose first 8
    bytes, as a number, must never reach the message) is refused by name before it is opened."""
    folder = make_llama_folder(tmp_path / "hf", data, shards="00001" in name or "index" in name)
    outside = tmp_path / "secret.txt"
    outside.write_bytes(SECRET + b"{" + b"x" * 100)
    (folder / name).unlink()
    (folder / name).symlink_to(outside)
    _refused(folder, tmp_path, capsys, str(folder / name), "outside the checkpoint folder")


def test_links_into_the_hub_cache_blobs_are_followed(tmp_path, data):
    """The one kind of link leading out that is read: a Hub cache snapshot's into ../../blobs."""
    made = make_llama_folder(tmp_path / "made", data, shards=True)
    blobs, snap = tmp_path / "models--x" / "blobs", tmp_path / "models--x" / "snapshots" / "r1"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(made.iterdir())):
        (blobs / f"b{i}").write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(Path("../../blobs") / f"b{i}")
    assert main(["import", str(snap), "--out", str(tmp_path / "run")]) == 0


@pytest.mark.parametrize(
    "head",
    [SECRET + b"{", SECRET + b"x", b"root:x:0:0:root:/root:/bin/bash\n"],
    ids=["brace", "text", "passwd"],
)
def test_a_raw_header_number_is_quoted_only_for_a_safetensors_file(tmp_path, data, capsys, head):
    """A weights file in the folder whose first 8 bytes are no plausible header length: its
    number is quoted only when a JSON header follows (a damaged safetensors file)."""
    folder = make_llama_folder(tmp_path / "hf", data)
    (folder / llama.WEIGHTS_FILE).write_bytes(head + b"x" * 64)
    number = str(struct.unpack("<Q", head[:8])[0])
    err = _refused(folder, tmp_path, capsys, str(folder / llama.WEIGHTS_FILE)) if head[8:9] != b"{" else None  # fmt: skip
    if err is None:  # plausibly safetensors: the number is the news
        assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 2
        assert f"header claims {number} bytes" in capsys.readouterr().err
    else:
        assert number not in err and "does not start with a header length" in err


def _retype(folder: Path, dtype: str, size: int) -> None:
    """model.safetensors with model.norm.weight stored as `dtype` (`size` bytes a value)."""
    from taperlm.hf.safetensors_file import read_header

    path = folder / llama.WEIGHTS_FILE
    header, start = read_header(path)
    raw = path.read_bytes()[start:]
    out, data, offset = {}, b"", 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["start"]):
        chunk = raw[e["start"] : e["end"]]
        kind = e["dtype"]
        if name == "model.norm.weight":
            kind = dtype
            chunk = b"\0" * (len(chunk) // 4 * size)
        out[name] = {"dtype": kind, "shape": list(e["shape"]), "data_offsets": [offset, offset + len(chunk)]}  # fmt: skip
        data += chunk
        offset += len(chunk)
    text = json.dumps(out).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


DTYPES = {  # dtype -> (bytes a value, what the message must say, what it must not)
    "F64": (8, "(float64)", "quantized"),
    "I8": (1, "quantized", "float64"),
    "F8_E4M3": (1, "quantized", "float64"),
    "U8": (1, "quantized", "float64"),
    "BOOL": (1, "not a floating-point weight", "quantized"),
    "I64": (8, "not a floating-point weight", "quantized"),
    "X9": (1, "not a safetensors dtype", "quantized"),
}


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_each_dtype_family_is_named_for_what_it_is(tmp_path, data, capsys, dtype):
    folder = make_llama_folder(tmp_path / "hf", data)
    size, says, never = DTYPES[dtype]
    _retype(folder, dtype, size)
    err = _refused(folder, tmp_path, capsys, f"dtype '{dtype}'", says, "F32, F16, BF16")
    assert never not in err


@pytest.mark.parametrize("key", sorted(llama._SIZE_LIMITS))
def test_a_size_past_its_domain_through_the_command(tmp_path, data, capsys, key):
    folder = make_llama_folder(tmp_path / "hf", data)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[key] = 300_000_000
    (folder / "config.json").write_text(json.dumps(cfg))
    _refused(folder, tmp_path, capsys, f"its {key} is 300,000,000", "more than")


def test_the_folder_is_never_written(tmp_path, data):
    """Every refusal above leaves the stranger's folder as it was (a spot check over one)."""
    folder = make_llama_folder(tmp_path / "hf", data, shards=True)
    (folder / "model-00002-of-00002.safetensors").unlink()
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 2
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert os.listdir(tmp_path) == ["hf"]


CONFIG_VALUES = {  # config.json values found by trying more of the class (issue 63)
    "eos_token_id_past_u32": ({"eos_token_id": 10**30}, "names no EOS token"),
    "eos_token_id_negative": ({"eos_token_id": -1}, "names no EOS token"),
    "eos_token_id_list_past_u32": ({"eos_token_id": [2**40, 0]}, "names no EOS token"),
    "rope_theta_with_non_finite_tables": ({"rope_theta": 1e-300}, "non-finite RoPE tables"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_VALUES))
def test_config_values_that_once_crashed_or_imported_a_broken_run(tmp_path, data, capsys, case):
    """An EOS id past what the tokenizers library converts was an OverflowError traceback; a
    rope_theta whose tables are non-finite imported, and generate refused the run later."""
    folder = make_llama_folder(tmp_path / "hf", data)
    (folder / "tokenizer_config.json").unlink()  # the EOS comes from config.json's id
    changes, needle = CONFIG_VALUES[case]
    cfg = json.loads((folder / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(cfg))
    _refused(folder, tmp_path, capsys, needle)
