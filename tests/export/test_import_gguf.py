"""`taperlm import FILE.gguf`: a tiny random Llama written with gguf.GGUFWriter the way llama.cpp's
converter writes one (Q/K rows in adjacent-pair order), in F32 and quantized (Q8_0, and Q4_0),
imports with transformers' logits on the same (dequantized) weights; our own GGUF export (biases,
linear RoPE) imports back to our logits; the source's quantization is recorded in the run and
stated; crafted headers (counts, lengths, types, ranges, overlaps, alignment) and what the
import cannot carry are refused by name with nothing written."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fault_harness as H

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
transformers.utils.logging.disable_progress_bar()

from taperlm.checkpoint.loading import load_run_model  # noqa: E402
from taperlm.cli import main  # noqa: E402
from taperlm.interop.gguf_export import write_gguf  # noqa: E402

VOCAB = 320
ATOL = 1e-4
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("import-gguf-data"))


def hf_llama(tied: bool = False, bias: bool = False, seed: int = 0) -> Any:
    """A random LlamaForCausalLM (widths multiples of 32: whole Q8_0/Q4_0 blocks)."""
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=0.05,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        tie_word_embeddings=tied,
        attention_bias=bias,
        initializer_range=0.3,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    return model


def _pairs(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: Q/K rows (or biases) from rotate-half to adjacent-pair order."""
    rest = w.shape[1:]
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *rest).swapaxes(1, 2).reshape(w.shape)


# HF name (per layer) -> llama.cpp name
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_tensors(model: Any) -> dict[str, np.ndarray]:
    c = model.config
    out = {}
    for name, t in model.state_dict().items():
        a = t.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = a
        elif name == "model.norm.weight":
            out["output_norm.weight"] = a
        elif name == "lm_head.weight" and not c.tie_word_embeddings:
            out["output.weight"] = a
        elif name.startswith("model.layers."):
            i, rest = name[len("model.layers.") :].split(".", 1)
            if rest.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                a = _pairs(a, c.num_attention_heads if "q_proj" in rest else c.num_key_value_heads)
            out[f"blk.{i}.{_LAYER[rest]}"] = a
    return out


def write_llama_gguf(model: Any, path: Path, qtype: Any = Q.F32, **extra: Any) -> dict[str, np.ndarray]:  # fmt: skip
    """`model` as a GGUF file (matrices in `qtype`, 1-D tensors F32); returns the tensors the
    file holds, dequantized (what an import of it must compute with)."""
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(500.0)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    for key, value in extra.items():
        w.add_string(key, value) if isinstance(value, str) else w.add_float32(key, value)
    held = {}
    for name, a in llama_cpp_tensors(model).items():
        if a.ndim == 2 and qtype != Q.F32:
            raw = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
            held[name] = gguf.quants.dequantize(raw, qtype)
        else:
            w.add_tensor(name, a)
            held[name] = a
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def with_weights(model: Any, held: dict[str, np.ndarray]) -> Any:
    """A copy of `model` holding the file's (dequantized) weights, Q/K rows permuted back."""
    c = model.config
    copy = transformers.LlamaForCausalLM(c).eval()
    state = {}
    inverse = {v: k for k, v in _LAYER.items()}
    for name, a in held.items():
        if name.startswith("blk."):
            _, i, rest = name.split(".", 2)
            hf = inverse[rest]
            if hf.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                heads = c.num_attention_heads if "q_proj" in hf else c.num_key_value_heads
                rows = a.shape[0]
                a = a.reshape(heads, rows // heads // 2, 2, *a.shape[1:]).swapaxes(1, 2)
                a = a.reshape(rows, *held[name].shape[1:])
            state[f"model.layers.{i}.{hf}"] = torch.from_numpy(np.ascontiguousarray(a))
        else:
            hf = {"token_embd.weight": "model.embed_tokens.weight",
                  "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}[name]  # fmt: skip
            state[hf] = torch.from_numpy(np.ascontiguousarray(a))
    copy.load_state_dict(state, strict=False)
    if c.tie_word_embeddings:
        copy.tie_weights()
    return copy


def _ids(n: int = 40) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(1))


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


# ----------------------------------------------------------------------------------------------
# logits equal


@pytest.mark.parametrize(
    ("qtype", "tied", "bias"),
    [(Q.F32, False, False), (Q.F32, True, True), (Q.Q8_0, False, True), (Q.Q4_0, True, False)],
)
def test_gguf_imports_with_transformers_logits(tmp_path, capsys, qtype, tied, bias):
    model = hf_llama(tied=tied, bias=bias)
    path = tmp_path / "tiny.gguf"
    held = write_llama_gguf(model, path, qtype)
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    ours, _ = load_run_model(tmp_path / "run")
    ids = _ids()
    theirs = _logits(with_weights(model, held), ids)
    assert theirs.abs().max() > 1.0
    torch.testing.assert_close(_logits(ours, ids), theirs, atol=ATOL, rtol=0)
    if qtype == Q.F32:  # the very weights: transformers' own model
        torch.testing.assert_close(_logits(ours, ids), _logits(model, ids), atol=ATOL, rtol=0)
    else:  # quantization moved the logits: the comparison is with the dequantized weights
        assert (_logits(model, ids) - theirs).abs().max() > 10 * ATOL
    cfg = ours.config
    assert (cfg.tie_embeddings, cfg.attention_bias) == (tied, "qkvo" if bias else "none")
    assert (cfg.rope_theta, cfg.norm_eps, cfg.kv_heads, cfg.mlp_widths) == (
        500.0,
        0.05,
        2,
        [96] * 2,
    )
    record = json.loads((tmp_path / "run" / "import.json").read_text())
    n_matrices = 2 * 7 + 1 + (0 if tied else 1)
    n_vectors = 2 * 2 + 1 + (2 * 4 if bias else 0)
    name = qtype.name
    want = (
        {name: n_matrices + n_vectors} if qtype == Q.F32 else {name: n_matrices, "F32": n_vectors}
    )
    assert record["quantization"] == want and record["format"] == "gguf"
    assert f"{want[name]} {name}" in out and "dequantized to float32" in out


def test_our_gguf_export_imports_back(tmp_path, data):
    """A run with q/k/v/o biases and linear RoPE scaling, exported by `taperlm.interop.gguf_export` in
    f32, imports with the run's logits (Q/K rows and biases permuted back)."""
    from conftest import tiny_config
    from taperlm.config.model import RopeScaling
    from taperlm.data.tokenizer import load_tokenizer
    from taperlm.models import TaperedLM

    tok = load_tokenizer(data / "tokenizer")
    cfg = tiny_config(
        n_layers=3, n_kv_heads=2, vocab_size=tok.vocab_size, init_std=0.4,
        attention_bias="qkvo", rope_scaling=RopeScaling("linear", 4.0),
    )  # fmt: skip
    torch.manual_seed(0)
    model = TaperedLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    path = write_gguf(model, tok, tmp_path / "m.gguf", dtype="f32")
    assert main(["import", str(path), "--out", str(tmp_path / "run")]) == 0
    back, _ = load_run_model(tmp_path / "run")
    assert back.config.rope_scaling == cfg.rope_scaling
    ids = torch.randint(0, tok.vocab_size, (2, 30), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(_logits(back, ids), _logits(model, ids), atol=ATOL, rtol=0)
    a, b = model.state_dict(), back.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # f32: the very weights


# ----------------------------------------------------------------------------------------------
# refusals: what the import cannot carry, and crafted files


def _refused(tmp_path: Path, path: Path, capsys, *needles: str) -> None:
    out = tmp_path / "run"
    assert main(["import", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("taperlm import: error: ") and err.count("\n") == 1, err
    assert all(n in err for n in needles), err
    assert "Traceback" not in err
    assert not out.exists()


def test_what_the_import_cannot_carry_is_refused_by_name(tmp_path, capsys):
    model = hf_llama()
    cases = {
        "yarn": ({"llama.rope.scaling.type": "yarn"}, ("'yarn'", "rope.scaling.type")),
        "unknown-key": ({"llama.attn_logit_softcapping": 30.0}, ("attn_logit_softcapping",)),
        "moe": ({"llama.expert_count": 8.0}, ("expert_count",)),
    }
    for name, (extra, needles) in cases.items():
        path = tmp_path / f"{name}.gguf"
        write_llama_gguf(model, path, **extra)
        _refused(tmp_path, path, capsys, *needles)
    # another architecture
    w = gguf.GGUFWriter(str(tmp_path / "qwen.gguf"), "qwen2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _refused(tmp_path, tmp_path / "qwen.gguf", capsys, "'qwen2'", "general.architecture")


def _raw_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def raw_gguf(keys: list[bytes], tensors: list[bytes], data: bytes, n_tensors: int | None = None,
             n_keys: int | None = None, version: int = 3, magic: bytes = b"GGUF") -> bytes:  # fmt: skip
    """A GGUF file from raw parts: each key or tensor entry already packed."""
    head = magic + struct.pack("<IQQ", version, n_tensors if n_tensors is not None else len(tensors),
                               n_keys if n_keys is not None else len(keys))  # fmt: skip
    body = head + b"".join(keys) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


def _key(name: bytes, vtype: int, payload: bytes) -> bytes:
    return _raw_string(name) + struct.pack("<I", vtype) + payload


def _tensor(name: bytes, dims: list[int], ggml_type: int, offset: int) -> bytes:
    return (_raw_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ggml_type, offset))  # fmt: skip


ARCH = _key(b"general.architecture", 8, _raw_string(b"llama"))
CRAFTED = {
    "magic": (raw_gguf([], [], b"", magic=b"GGML"), "does not start with GGUF"),
    "version": (raw_gguf([], [], b"", version=7), "its version is 7"),
    "tensor-count": (raw_gguf([], [], b"", n_tensors=1 << 40), "the tensor count is 1099511627776"),
    "key-count": (raw_gguf([], [], b"", n_keys=1 << 30), "the metadata key count is"),
    "string-length": (
        raw_gguf([struct.pack("<Q", 1 << 19) + b"abc"], [], b""),
        "metadata key 0 claims 524288 bytes",
    ),
    "huge-string": (
        raw_gguf([struct.pack("<Q", 1 << 50)], [], b""),
        "the length of metadata key 0 is 1125899906842624",
    ),
    "array-length": (
        raw_gguf([_key(b"k", 9, struct.pack("<IQ", 6, 1 << 23))], [], b""),
        "'k' claims 33554432 bytes",
    ),
    "nested-array": (
        raw_gguf([_key(b"k", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 6, 0))], [], b""),
        "'k'[0] has value type 9",
    ),
    "value-type": (raw_gguf([_key(b"k", 42, b"")], [], b""), "'k' has value type 42"),
    "duplicate-key": (raw_gguf([ARCH, ARCH], [], b""), "'general.architecture' is given twice"),
    "rank": (raw_gguf([ARCH], [_tensor(b"t", [1] * 5, 0, 0)], b""), "5 dimensions"),
    "ggml-type": (raw_gguf([ARCH], [_tensor(b"t", [4], 99, 0)], b"\0" * 16), "ggml type 99"),
    "elements": (raw_gguf([ARCH], [_tensor(b"t", [1 << 30, 1 << 30], 0, 0)], b""), "dimensions"),
    "blocks": (raw_gguf([ARCH], [_tensor(b"t", [33], 8, 0)], b"\0" * 64), "not whole blocks"),
    "outside": (
        raw_gguf([ARCH], [_tensor(b"t", [1 << 20], 0, 0)], b"\0" * 16),
        "outside the file",
    ),
    "misaligned": (raw_gguf([ARCH], [_tensor(b"t", [4], 0, 4)], b"\0" * 64), "misaligned"),
    "overlap": (
        raw_gguf([ARCH], [_tensor(b"a", [8], 0, 0), _tensor(b"b", [8], 0, 0)], b"\0" * 64),
        "tensors 'a' and 'b' overlap",
    ),
    "twice": (
        raw_gguf([ARCH], [_tensor(b"a", [8], 0, 0), _tensor(b"a", [8], 0, 32)], b"\0" * 64),
        "'a' is listed twice",
    ),
    "alignment": (
        raw_gguf([_key(b"general.alignment", 4, struct.pack("<I", 3))], [], b""),
        "not a power of two",
    ),
    "truncated": (b"GGUF" + struct.pack("<I", 3) + b"\0\0", "the tensor count claims 8 bytes"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_headers_are_refused_before_anything_is_allocated(tmp_path, capsys, case):
    raw, needle = CRAFTED[case]
    path = tmp_path / "crafted.gguf"
    path.write_bytes(raw)
    _refused(tmp_path, path, capsys, needle)


def test_a_fifo_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    assert main(["import", str(fifo), "--out", str(tmp_path / "run")]) == 2
    assert "FIFO" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    shutil.rmtree(tmp_path / "run", ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# the way back out: a pruned (per-layer widths) model through GGUF and back


def _pruned(data: Path, root: Path) -> Path:
    """A 1-step tiny run pruned to half its MLP parameters as a cosine 1.5 -> 0.5 taper."""
    run, pruned = root / "run", root / "pruned"
    assert main([*H.train_argv(data, run), "--stop-after-steps", "1"]) == 0
    argv = ["prune", str(run), "--out", str(pruned), "--params", "0.5", "--params-of",
            "non-embedding", "--taper", "cosine:1.5:0.5", "--calibration-tokens", "256"]  # fmt: skip
    assert main(argv) == 0
    return pruned


@pytest.mark.parametrize("taper", ["pruned", "cosine:2:0"])
def test_per_layer_widths_go_through_gguf_and_back(tmp_path, data, capsys, taper):
    """A pruned run (export --format gguf writes llama.cpp's `deci` with its per-layer widths),
    and a taper with an FFN-free layer (width 0, no ffn_* tensors), import back from the f32
    file to the very weights and logits."""
    if taper == "pruned":
        run = _pruned(data, tmp_path)
    else:
        run = tmp_path / "run"
        argv = [
            *H.train_argv(data, run, f"model.taper={taper}"),
            "--stop-after-steps",
            "1",
        ]
        assert main(argv) == 0
    model, _ = load_run_model(run)
    assert len(set(model.config.mlp_widths)) > 1
    assert (0 in model.config.mlp_widths) == (taper != "pruned"), model.config.mlp_widths
    gguf_path = tmp_path / "m.gguf"
    argv = ["export", str(run), "--format", "gguf", "--dtype", "f32", "--out", str(gguf_path)]
    assert main(argv) == 0
    assert main(["import", str(gguf_path), "--out", str(tmp_path / "back")]) == 0
    capsys.readouterr()
    back, _ = load_run_model(tmp_path / "back")
    assert back.config.mlp_widths == model.config.mlp_widths
    a, b = model.state_dict(), back.state_dict()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    # only an FFN-free layer's MLP norm, which feeds nothing, is not in the file
    assert all(k.endswith("mlp_norm.weight") for k in different), different
    ids = torch.randint(0, 300, (2, 30), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(back, ids), _logits(model, ids), atol=ATOL, rtol=0)


@pytest.mark.slow
def test_llama_cpp_runs_a_pruned_model(tmp_path, data):
    """The pruned run's GGUF file (f32, `deci` per-layer widths) loaded by llama.cpp itself
    (llama-cpp-python, built from source): its logits of a prompt are ours."""
    llama_cpp = pytest.importorskip("llama_cpp")
    run = _pruned(data, tmp_path)
    from taperlm.checkpoint.loading import load_any

    model, tok, _ = load_any(run)
    path = tmp_path / "pruned.gguf"
    argv = ["export", str(run), "--format", "gguf", "--dtype", "f32", "--out", str(path)]
    assert main(argv) == 0
    f32 = llama_cpp.GGML_TYPE_F32
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, n_threads=1,
        type_k=f32, type_v=f32, flash_attn=False, verbose=False,
    )  # fmt: skip
    ids = tok.encode("The cat sat on the mat, and then the dog came in.")[:30]
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].double().numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-3)
