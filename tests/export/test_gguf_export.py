"""GGUF export for llama.cpp (`taperlm export RUN --format gguf`): the file read back with the
`gguf` package (every tensor's shape, the per-layer widths and heads, the tokenizer), a
forward pass computed from the file alone in llama.cpp's conventions (adjacent-pair RoPE,
per-layer heads from the metadata) against ours, the command and its errors; and, in the slow
test, the file run by llama.cpp itself (llama-cpp-python): next-token logits and 32 greedy
tokens against ours, and its tokenization of texts against ours."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conftest import assert_naming, raises_naming, tiny_config
from eval_helpers import corpus_text, tiny_tokenizer

gguf = pytest.importorskip("gguf")

from taperlm.cli import main  # noqa: E402
from taperlm.config.model import RopeScaling  # noqa: E402
from taperlm.errors import ConfigError, DataError  # noqa: E402
from taperlm.files.outfiles import written_by_taperlm  # noqa: E402
from taperlm.interop.gguf_export import check_supported, write_gguf  # noqa: E402
from taperlm.interop.gguf_tokenizer import EXPORT_PRE_NAMES  # noqa: E402
from taperlm.models import TaperedLM  # noqa: E402

# (id, model fields): uniform; MLP taper; head taper; both with grouped-query attention and tied
# embeddings (the head taper moves whole KV groups)
MODELS = {
    "uniform": dict(taper="uniform"),
    "mlp-taper": dict(taper="cosine"),
    "head-taper": dict(taper="uniform", head_taper="cosine"),
    "zero-mlp": dict(taper="cosine:2:0"),  # the last layer attention only: widths 128/96/32/0
    "both-gqa-tied": dict(
        taper="linear:1.5:0.5", head_taper="linear:1.5:0.5", n_kv_heads=2, tie_embeddings=True
    ),
    # imported checkpoints' options: Llama 3.x RoPE (head dim 8, theta 1e4: wavelengths 6.3,
    # 63, 628, 6283 against an original context of 128, so every branch of llama3 is used) with
    # q/k/v/o biases; Qwen2's q/k/v biases with linear RoPE scaling
    "biases-llama3": dict(
        attention_bias="qkvo",
        n_kv_heads=2,
        rope_scaling=RopeScaling(factor=8.0, original_context=128),
    ),
    "qkv-bias-linear": dict(attention_bias="qkv", rope_scaling=RopeScaling("linear", 4.0)),
}
UNIFORM = {"uniform", "biases-llama3", "qkv-bias-linear"}


def make_model(kind: str, seed: int = 0, context_length: int = 128) -> tuple[TaperedLM, object]:
    tok = tiny_tokenizer()
    # a large init makes attention (and so the RoPE layout) matter and greedy tokens clear-cut
    fields = {"n_layers": 4, "vocab_size": tok.vocab_size + 12, "context_length": context_length,
              "init_std": 0.4}  # fmt: skip
    cfg = tiny_config(preset="transformer-tiny", **{**fields, **MODELS[kind]})
    torch.manual_seed(seed)
    model = TaperedLM(cfg).eval()
    with torch.no_grad():  # biases start at zero: give them values that show
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    return model, tok


def read(path: Path) -> tuple[dict, dict]:
    """(metadata key -> value, tensor name -> numpy array in our (out, in) shape)."""
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items()}
    tensors = {t.name: np.asarray(t.data) for t in r.tensors}
    return meta, tensors


# ----------------------------------------------------------------------------------------------
# the file read back


@pytest.mark.parametrize("kind", list(MODELS))
def test_file_has_every_tensor_and_the_per_layer_metadata(tmp_path: Path, kind: str) -> None:
    model, tok = make_model(kind)
    cfg = model.config
    meta, tensors = read(write_gguf(model, tok, tmp_path / "m.gguf", dtype="f16"))
    heads = [cfg.attention_heads(i) for i in range(cfg.n_layers)]
    uniform = len(set(cfg.mlp_widths)) == 1 and len(set(heads)) == 1
    arch = "llama" if uniform else "deci"
    assert (kind in UNIFORM) == uniform
    assert meta["general.architecture"] == arch
    # a width-0 layer is written as a one-unit FFN of zero weights (llama.cpp drops the whole of
    # an FFN-free layer: gguf_export's docstring)
    file_ff = [w or 1 for w in cfg.mlp_widths]
    expect_ff = file_ff[0] if uniform else file_ff
    assert meta[f"{arch}.feed_forward_length"] == expect_ff
    assert meta[f"{arch}.attention.head_count"] == (
        heads[0][0] if uniform else [h for h, _ in heads]
    )
    assert meta[f"{arch}.attention.head_count_kv"] == (
        heads[0][1] if uniform else [kv for _, kv in heads]
    )
    d, hd, V = cfg.d_model, cfg.head_dim, cfg.vocab_size
    assert meta[f"{arch}.attention.key_length"] == hd == meta[f"{arch}.rope.dimension_count"]
    assert meta[f"{arch}.block_count"] == cfg.n_layers
    assert meta[f"{arch}.embedding_length"] == d
    assert meta[f"{arch}.context_length"] == cfg.context_length
    assert meta[f"{arch}.rope.freq_base"] == pytest.approx(cfg.rope_theta)
    assert meta[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(cfg.norm_eps)
    # every tensor, with the shape the config implies (written out here, not by the exporter)
    want = {"token_embd.weight": (V, d), "output_norm.weight": (d,)}
    if not cfg.tie_embeddings:
        want["output.weight"] = (V, d)
    for i, (w, (h, kv)) in enumerate(zip(file_ff, heads)):
        want |= {
            f"blk.{i}.attn_norm.weight": (d,),
            f"blk.{i}.attn_q.weight": (h * hd, d),
            f"blk.{i}.attn_k.weight": (kv * hd, d),
            f"blk.{i}.attn_v.weight": (kv * hd, d),
            f"blk.{i}.attn_output.weight": (d, h * hd),
        }
        if cfg.attention_bias != "none":
            want |= {
                f"blk.{i}.attn_q.bias": (h * hd,),
                f"blk.{i}.attn_k.bias": (kv * hd,),
                f"blk.{i}.attn_v.bias": (kv * hd,),
            }
        if cfg.attention_bias == "qkvo":
            want[f"blk.{i}.attn_output.bias"] = (d,)
        want |= {
            f"blk.{i}.ffn_norm.weight": (d,),
            f"blk.{i}.ffn_gate.weight": (w, d),
            f"blk.{i}.ffn_up.weight": (w, d),
            f"blk.{i}.ffn_down.weight": (d, w),
        }
    if cfg.rope_scaling is not None and cfg.rope_scaling.type == "llama3":
        want["rope_freqs.weight"] = (hd // 2,)
    if cfg.rope_scaling is not None and cfg.rope_scaling.type == "linear":
        assert meta[f"{arch}.rope.scaling.type"] == "linear"
        assert meta[f"{arch}.rope.scaling.factor"] == cfg.rope_scaling.factor
    assert {k: v.shape for k, v in tensors.items()} == want
    for name, arr in tensors.items():  # llama.cpp wants norms in f32
        assert arr.dtype == (np.float32 if arr.ndim == 1 else np.float16), name
    if kind not in UNIFORM:
        assert len(set(cfg.mlp_widths)) > 1 or len(set(heads)) > 1
    assert (kind == "zero-mlp") == (0 in cfg.mlp_widths)
    for i, w in enumerate(cfg.mlp_widths):  # the zero-width layer's FFN adds exactly 0
        if w == 0:
            assert not tensors[f"blk.{i}.ffn_down.weight"].any()
            assert not tensors[f"blk.{i}.ffn_gate.weight"].any()


def test_an_ffn_free_layer_as_llama_cpp_reads_it_drops_the_attention_too(tmp_path: Path) -> None:
    """Why a width-0 layer is not written as llama.cpp's FFN-free layer: the same model written
    that way (feed_forward_length 0, no ffn_* tensors) gives other logits in llama.cpp's deci
    graph (the layer is left before its residual add), the one-unit zero FFN gives ours."""
    import taperlm.interop.gguf_export as ge

    model, tok = make_model("zero-mlp")
    ids = tok.encode("The cat sat on the mat, and then the dog came in.")[:24]
    path = write_gguf(model, tok, tmp_path / "ours.gguf", dtype="f32")
    np.testing.assert_allclose(llama_cpp_logits(path, ids), ours(model, ids), atol=2e-4)
    real = ge.gguf_tensors
    with pytest.MonkeyPatch.context() as mp:  # the FFN-free form: widths as they are, no ffn_*
        mp.setattr(ge, "gguf_widths", lambda cfg: list(cfg.mlp_widths))
        mp.setattr(
            ge,
            "gguf_tensors",
            lambda model, dtype: {
                k: v for k, v in real(model, dtype).items() if not k.startswith("blk.3.ffn_")
            },
        )
        free = write_gguf(model, tok, tmp_path / "free.gguf", dtype="f32")
    assert read(free)[0]["deci.feed_forward_length"][3] == 0
    assert np.abs(llama_cpp_logits(free, ids) - ours(model, ids)).max() > 1e-2


def test_tokenizer_is_gpt2_bpe_with_our_ids(tmp_path: Path) -> None:
    model, tok = make_model("mlp-taper")
    meta, _ = read(write_gguf(model, tok, tmp_path / "m.gguf"))
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == model.config.vocab_size  # padded to the embedding rows
    assert tokens[: tok.vocab_size] == [tok.backend.id_to_token(i) for i in range(tok.vocab_size)]
    assert types[tok.eos_id] == gguf.TokenType.CONTROL
    assert set(types[: tok.vocab_size]) - {gguf.TokenType.CONTROL} == {gguf.TokenType.NORMAL}
    assert set(types[tok.vocab_size :]) == {gguf.TokenType.UNUSED}
    merges = json.loads(tok.backend.to_str())["model"]["merges"]
    assert meta["tokenizer.ggml.merges"] == [" ".join(m) for m in merges]
    assert meta["tokenizer.ggml.eos_token_id"] == tok.eos_id == meta["tokenizer.ggml.bos_token_id"]
    assert meta["tokenizer.ggml.add_bos_token"] is False


def test_gpt2_style_files_give_the_same_tokenizer(tmp_path: Path) -> None:
    """A tokenizer read from GPT-2 files (vocab.json + merges.txt, EOS a plain vocabulary
    entry) exports like the BPE it was written from, EOS marked as a control token."""
    from taperlm.data.tokenizer import load_tokenizer
    from taperlm.interop.gguf_tokenizer import gguf_vocab

    tok = tiny_tokenizer()
    data = json.loads(tok.backend.to_str())["model"]
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(tok.backend.get_vocab()), encoding="utf-8")
    merges = "\n".join(" ".join(m) for m in data["merges"])
    (folder / "merges.txt").write_text("#version: 0.2\n" + merges + "\n", encoding="utf-8")
    files = load_tokenizer(folder)
    assert files.eos_id == tok.eos_id
    ours_, theirs = gguf_vocab(tok, tok.vocab_size), gguf_vocab(files, tok.vocab_size)
    assert theirs == ours_ and theirs["types"][tok.eos_id] == gguf.TokenType.CONTROL


# ----------------------------------------------------------------------------------------------
# llama.cpp's computation, from the file alone


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_pairs(x: np.ndarray, base: float, divisors: np.ndarray | float = 1.0) -> np.ndarray:
    """llama.cpp's "normal" RoPE: rotates adjacent pairs (2i, 2i+1); x [T, H, hd]; each
    frequency divided by `divisors` (its `rope_freqs` tensor, or a linear scaling factor)."""
    T, _, hd = x.shape
    theta = np.arange(T)[:, None] * base ** (-np.arange(0, hd, 2) / hd) / divisors  # [T, hd/2]
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    """Logits of `ids` computed from the GGUF file the way llama.cpp's llama/deci graph does."""
    meta, t = read(path)
    t = {k: v.astype(np.float64) for k, v in t.items()}
    arch = meta["general.architecture"]
    n = meta[f"{arch}.block_count"]

    def per_layer(key: str) -> list[int]:
        v = meta[f"{arch}.{key}"]
        return v if isinstance(v, list) else [v] * n

    heads, kv_heads = per_layer("attention.head_count"), per_layer("attention.head_count_kv")
    n_ff = per_layer("feed_forward_length")
    hd, eps = meta[f"{arch}.attention.key_length"], meta[f"{arch}.attention.layer_norm_rms_epsilon"]
    base = meta[f"{arch}.rope.freq_base"]
    # llama.cpp divides each frequency by rope_freqs (Llama 3.x) and multiplies every one by
    # 1 / rope.scaling.factor for linear scaling
    divisors = t.get("rope_freqs.weight", 1.0)
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        divisors = divisors * meta[f"{arch}.rope.scaling.factor"]
    zero = np.zeros(1)

    def bias(name: str) -> np.ndarray:  # llama.cpp's optional attention biases
        return t.get(name, zero)

    x = t["token_embd.weight"][ids]
    T = len(ids)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(n):
        p, H, Hkv = f"blk.{i}.", heads[i], kv_heads[i]
        before = x
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        q = h @ t[p + "attn_q.weight"].T + bias(p + "attn_q.bias")
        k = h @ t[p + "attn_k.weight"].T + bias(p + "attn_k.bias")
        q = _rope_pairs(q.reshape(T, H, hd), base, divisors)
        k = _rope_pairs(k.reshape(T, Hkv, hd), base, divisors)
        v = (h @ t[p + "attn_v.weight"].T + bias(p + "attn_v.bias")).reshape(T, Hkv, hd)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        y = np.einsum("hts,shd->thd", a, v).reshape(T, H * hd)
        x = x + y @ t[p + "attn_output.weight"].T + bias(p + "attn_output.bias")
        if n_ff[i] == 0:  # llama.cpp's deci graph leaves an FFN-free layer before the
            x = before  # attention's residual add: the layer's output is dropped
            continue
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        g = h @ t[p + "ffn_gate.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
    head = t.get("output.weight", t["token_embd.weight"])
    return _rms(x, t["output_norm.weight"], eps) @ head.T


def ours(model: TaperedLM, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.mark.parametrize("kind", list(MODELS))
def test_llama_cpp_computation_from_the_file_gives_our_logits(tmp_path: Path, kind: str) -> None:
    """Proves the Q/K row permutation (our rotate-half RoPE -> llama.cpp's pairs), the split of
    the fused matrices and the per-layer heads: f32 agrees to rounding, f16 to f16 rounding."""
    model, tok = make_model(kind)
    ids = tok.encode("The cat sat on the mat, and then the dog came in.")[:24]
    for dtype, tol in (("f32", 2e-4), ("f16", 0.15)):  # logits up to ~10
        path = write_gguf(model, tok, tmp_path / f"{dtype}.gguf", dtype=dtype)
        np.testing.assert_allclose(llama_cpp_logits(path, ids), ours(model, ids), atol=tol)


def test_the_check_fails_without_the_permutation(tmp_path: Path, monkeypatch) -> None:
    """The reference above is sensitive to the RoPE layout (it is not a tautology)."""
    import taperlm.interop.gguf_export as ge

    monkeypatch.setattr(ge, "_permute_rope", lambda w, heads: w)
    model, tok = make_model("head-taper")
    ids = tok.encode("The cat sat on the mat.")
    path = write_gguf(model, tok, tmp_path / "m.gguf", dtype="f32")
    assert np.abs(llama_cpp_logits(path, ids) - ours(model, ids)).max() > 1.0


@pytest.mark.parametrize("left_out", ["rope_freqs.weight", "attn_q.bias", "attn_output.bias"])
def test_the_check_sees_the_rope_freqs_and_the_biases(tmp_path: Path, monkeypatch, left_out):
    """The reference computation depends on the llama3 divisors and on each bias: a file
    without one of them gives other logits."""
    import taperlm.interop.gguf_export as ge

    real = ge.gguf_tensors
    monkeypatch.setattr(
        ge,
        "gguf_tensors",
        lambda model, dtype: {k: v for k, v in real(model, dtype).items() if left_out not in k},
    )
    model, tok = make_model("biases-llama3")
    ids = tok.encode("The cat sat on the mat, and then the dog came in.")[:24]
    path = write_gguf(model, tok, tmp_path / "m.gguf", dtype="f32")
    assert np.abs(llama_cpp_logits(path, ids) - ours(model, ids)).max() > 1e-2


def test_qk_norm_and_per_layer_biases_are_refused_by_name(tmp_path: Path) -> None:
    """Per-head q/k norms (Qwen3) and biases with per-layer sizes have no llama/deci form."""
    qwen3 = tiny_config(preset="transformer-tiny", qk_norm=True)
    with raises_naming(ConfigError, "model.qk_norm", "qwen3"):
        check_supported(qwen3)
    tapered = tiny_config(preset="transformer-tiny", taper="cosine", attention_bias="qkv")
    with raises_naming(ConfigError, "attention biases", "per-layer sizes"):
        check_supported(tapered)


# ----------------------------------------------------------------------------------------------
# what cannot be exported


OTHER_PRESETS = ["gated-tiny", "hope-tiny", "titans-mac-tiny", "titans-mag-tiny", "titans-mal-tiny"]


def test_only_transformer_is_marked_for_llama_cpp() -> None:
    """Every registered family is either written for llama.cpp or refused (one test each)."""
    from taperlm.config.presets import get_preset
    from taperlm.families import FAMILIES
    from taperlm.interop.gguf_export import LLAMA_CPP_FAMILIES

    assert list(LLAMA_CPP_FAMILIES) == ["transformer"]
    assert {get_preset(p, resolve=False).family for p in OTHER_PRESETS} == set(FAMILIES) - {
        "transformer"
    }


@pytest.mark.parametrize("preset", OTHER_PRESETS)
def test_other_families_are_refused_clearly(
    tmp_path: Path, preset: str, monkeypatch, capsys
) -> None:
    import taperlm.checkpoint.loading

    cfg = tiny_config(preset=preset)
    with raises_naming(ConfigError, repr(cfg.family), "llama.cpp", "taperlm export RUN --out DIR"):
        check_supported(cfg)
    torch.manual_seed(0)
    model, tok = TaperedLM(cfg).eval(), tiny_tokenizer()
    with raises_naming(ConfigError, repr(cfg.family), "llama.cpp"):
        write_gguf(model, tok, tmp_path / "m.gguf")
    # the command: one line naming the family, nothing written
    monkeypatch.setattr(
        taperlm.checkpoint.loading, "load_run", lambda run, step=None: (model, tok, None)
    )
    (tmp_path / "run").mkdir()
    argv = ["export", str(tmp_path / "run"), "--format", "gguf", "--out", str(tmp_path / "m.gguf")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert_naming(err, f"model family {cfg.family!r}", "llama.cpp", "taperlm export RUN --out DIR")
    assert err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_tokenizer_llama_cpp_would_split_differently_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers

    from taperlm.data.tokenizer import Tokenizer

    backend = Backend(models.BPE(vocab={"<|endoftext|>": 0, "a": 1, "b": 2}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    tok = Tokenizer(backend, kind="file", spec="sp.json", eos_token="<|endoftext|>")
    torch.manual_seed(0)
    model = TaperedLM(tiny_config(vocab_size=3))
    with raises_naming(DataError, "'sp.json'", "byte-level BPE", "bpe:N", "Hugging Face export"):
        write_gguf(model, tok, tmp_path / "m.gguf")
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------------
# the command


@pytest.fixture(scope="module")
def tapered_run(tmp_path_factory) -> Path:
    """A 2-step `taperlm train` run of a 3-layer model with MLP and head tapers."""
    import fault_harness as H

    root = tmp_path_factory.mktemp("gguf_run")
    data = H.prepare_data(root)
    run = root / "run"
    argv = H.train_argv(
        data, run, "model.n_layers=3", "model.n_heads=4", "model.taper=linear:1.5:0.5",
        "model.head_taper=linear:1.5:0.5", "train.tokens=256",
    )  # fmt: skip
    assert main(argv) == 0
    return run


def test_export_command_writes_a_file_llama_cpp_reads(tapered_run: Path, tmp_path: Path, capsys):
    from taperlm.checkpoint.loading import load_run

    out = tmp_path / "model.gguf"
    assert main(["export", str(tapered_run), "--format", "gguf", "--out", str(out)]) == 0
    assert "llama-completion -m" in capsys.readouterr().out
    model, tok, _ = load_run(tapered_run)
    meta, _ = read(out)
    assert meta["general.architecture"] == "deci"
    assert meta["deci.feed_forward_length"] == model.config.mlp_widths
    assert meta["deci.attention.head_count"] == model.config.layer_heads
    assert meta["general.name"] == "run"
    ids = tok.encode("Some words of the corpus.")
    np.testing.assert_allclose(llama_cpp_logits(out, ids), ours(model, ids), atol=0.15)
    # an existing file is replaced only with --force; a folder is refused before any work
    before = out.read_bytes()
    assert main(["export", str(tapered_run), "--format", "gguf", "--out", str(out)]) == 2
    assert "add --force" in capsys.readouterr().err and out.read_bytes() == before
    assert written_by_taperlm(
        out, "gguf"
    )  # what --force may replace (tests/safety/test_outfiles.py)
    argv = ["export", str(tapered_run), "--format", "gguf", "--out", str(out), "--dtype", "f32"]
    assert main([*argv, "--force"]) == 0
    assert read(out)[1]["blk.0.attn_q.weight"].dtype == np.float32
    assert main(["export", str(tapered_run), "--format", "gguf", "--out", str(tmp_path)]) == 2
    assert "is a folder, not a file" in capsys.readouterr().err
    assert main(["export", str(tapered_run), "--out", str(tmp_path / "hf"), "--dtype", "f16"]) == 2
    assert "--dtype is for --format gguf" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
    # a checkpoint directory: the file is named after its run
    ckpt = max((tapered_run / "checkpoints").iterdir())
    argv = ["export", str(ckpt), "--format", "gguf", "--out", str(tmp_path / "c.gguf")]
    assert main(argv) == 0
    assert read(tmp_path / "c.gguf")[0]["general.name"] == "run"


# ----------------------------------------------------------------------------------------------
# llama.cpp itself


TEXTS = [
    "The cat sat on the mat.",
    "Hello, world!  Two  spaces,\ttabs\nand new lines\n\n",
    "Numbers 12345 and 3.14159, symbols #@$%^&*() and don't we'll they're",
    "Ünïcödé: café, naïve, 東京, Ελληνικά, emoji 🙂",
    "   leading spaces and trailing   ",
    "Hello , world . Is it ? Yes ! It 's a ' quoted ' word",  # no clean-up of spaces
    "I'M SURE IT'S FINE; WE'LL SEE.\r\nLine two 2024-12-07\r\n\r\n  x",  # case, CRLF
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "dtype"), [(k, "f32") for k in MODELS] + [("both-gqa-tied", "f16")]
)
def test_llama_cpp_runs_the_file(tmp_path: Path, kind: str, dtype: str) -> None:
    """llama.cpp (llama-cpp-python, built from source) loads the file with its per-layer widths
    and heads; its logits of a prompt match ours within f32 (f16) rounding, and 32 greedy tokens
    decoded incrementally with its KV cache are ours (f32; in f16, each is our argmax or a
    near tie within f16 rounding)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    model, tok = make_model(kind, context_length=128)
    path = write_gguf(model, tok, tmp_path / "m.gguf", dtype=dtype)
    # f32 KV cache and no flash attention: llama.cpp's defaults keep K and V in f16
    f32 = llama_cpp.GGML_TYPE_F32
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=128, n_batch=128, logits_all=True, n_threads=1,
        type_k=f32, type_v=f32, flash_attn=False, verbose=False,
    )  # fmt: skip
    ids = tok.encode(TEXTS[0] + " " + TEXTS[2])[:40]
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    tol = 1e-3 if dtype == "f32" else 0.15  # logits up to ~10; f16 also rounds activations
    np.testing.assert_allclose(theirs, ours(model, ids), atol=tol)
    # greedy decoding, one token per llama.cpp eval (its KV cache) against ours
    from taperlm.models.generation import greedy_batch

    llm.reset()
    prompt = ids[:8]
    llm.eval(prompt)
    got = []
    for _ in range(32):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        got.append(nxt)
        llm.eval([nxt])
    if dtype == "f32":
        assert got == greedy_batch(model, [prompt], max_new_tokens=32)[0]
    else:  # f16 rounding may flip a near tie and the sequences part: check every step of
        # llama.cpp's sequence is our argmax there, or within the f16 tolerance of it
        logits = ours(model, prompt + got)[len(prompt) - 1 : -1]
        picked = logits[np.arange(len(got)), got]
        assert (picked >= logits.max(-1) - 2 * tol).all()


def with_pre_tokenizer(tok: Any, name: str) -> Any:
    """`tok` with the pre-tokenizer that GGUF's `name` stands for (its vocabulary and merges)."""
    from tokenizers import Tokenizer as Backend

    from taperlm.data.tokenizer import Tokenizer
    from taperlm.interop.gguf_tokenizer import PRE_TOKENIZERS

    data = json.loads(tok.backend.to_str())
    data["pre_tokenizer"] = PRE_TOKENIZERS[name].pre_tokenizer
    data["model"]["ignore_merges"] = PRE_TOKENIZERS[name].ignore_merges
    backend = Backend.from_str(json.dumps(data))
    return Tokenizer(backend, kind=tok.kind, spec=f"{tok.spec}+{name}", eos_token=tok.eos_token)


# text with what the splittings differ on, to train each one's vocabulary: digit runs (merged
# only where a run is one piece: Llama 3's up to 3, GPT-2's any length), contractions in both
# cases, a letter run after punctuation, CRLF
_SPLIT_CORPUS = [
    *TEXTS,
    "In 2024 there were 12345 items, 678 more than 1999's 11667 and 123 456 789 000.",
    "IT'S (quoted) [words] and {braces}: don't, DON'T, we'll, WE'LL, they're, THEY'RE.",
    "Line one\r\nLine two\r\n\r\n    indented 42 and 4242 and 424242\n",
    "one document ends.<|endoftext|>The next begins",  # a control token spelled in the text
]


def trained_under(name: str) -> Any:
    """A byte-level BPE whose vocabulary was trained under GGUF's `name` splitting (so its
    merges hold what that splitting keeps together), as a taperlm tokenizer."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import pre_tokenizers, trainers

    from taperlm.data.tokenizer import Tokenizer
    from taperlm.interop.gguf_tokenizer import PRE_TOKENIZERS

    known = PRE_TOKENIZERS[name]
    data = json.loads(tiny_tokenizer().backend.to_str())
    data["added_tokens"], data["pre_tokenizer"] = [], known.pre_tokenizer
    data["model"] |= {"vocab": {}, "merges": [], "ignore_merges": known.ignore_merges}
    backend = Backend.from_str(json.dumps(data))
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([*_SPLIT_CORPUS, corpus_text()] * 3, trainer=trainer)
    return Tokenizer(backend, kind="bpe", spec=f"trained:{name}", eos_token="<|endoftext|>")


def _llama_cpp_tokens(llama_cpp: Any, tok: Any, path: Path, name: str | None = None) -> list:
    """llama.cpp's tokens of every text of _SPLIT_CORPUS from a file of `tok` (written under
    the pre-tokenizer name `name` where given, whatever `tok` splits as)."""
    import taperlm.interop.gguf_tokenizer as gt

    model = TaperedLM(
        tiny_config(preset="transformer-tiny", n_layers=1, vocab_size=tok.vocab_size)
    ).eval()
    with pytest.MonkeyPatch.context() as mp:
        if name is not None:
            mp.setattr(gt, "llama_cpp_pre_name", lambda pre, ignore_merges=False: name)
        write_gguf(model, tok, path)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, vocab_only=True, verbose=False)
    # special: a control token spelled in the text is that token, as our tokenizer reads it
    out = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in _SPLIT_CORPUS]
    assert [llm.detokenize(ids, special=True).decode("utf-8") for ids in out] == _SPLIT_CORPUS
    return out


@pytest.mark.slow
@pytest.mark.parametrize("pre", EXPORT_PRE_NAMES)
def test_llama_cpp_tokenizes_text_as_we_do(tmp_path: Path, pre: str) -> None:
    """llama.cpp splits and merges text as our tokenizer does under each pre-tokenizer name
    export writes (GPT-2's regex; SmolLM's digits alone first; Llama 3's split regex, digit runs
    of up to 3 and whole pieces looked up; Qwen2's with single digits), each with a vocabulary
    trained under that splitting; and the check sees a wrong name: for each other name export
    writes, one of the two vocabularies written under the other's name tokenizes some text
    differently (a vocabulary shows a splitting only where its merges cross the other's
    boundaries: one trained to keep digit runs whole does, read one digit at a time)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tok = trained_under(pre)
    path = tmp_path / "m.gguf"
    theirs = _llama_cpp_tokens(llama_cpp, tok, path)
    assert read(path)[0]["tokenizer.ggml.pre"] == pre
    assert theirs == [tok.encode(t) for t in _SPLIT_CORPUS]
    for other in EXPORT_PRE_NAMES:
        if other == pre:
            continue
        tok_other = trained_under(other)
        mine_as_other = _llama_cpp_tokens(llama_cpp, tok, tmp_path / f"a-{other}.gguf", other)
        other_as_mine = _llama_cpp_tokens(llama_cpp, tok_other, tmp_path / f"b-{other}.gguf", pre)
        assert mine_as_other != theirs or other_as_mine != [
            tok_other.encode(t) for t in _SPLIT_CORPUS
        ], other


def test_only_a_zero_down_projection_reads_back_as_width_0(tmp_path: Path, monkeypatch) -> None:
    """Import reads a one-unit FFN back as the width-0 layer it stands for only where its down
    projection is all zero (then it adds exactly 0); any other value keeps the unit."""
    import taperlm.interop.gguf_export as ge
    from taperlm.interop.gguf_file import read_header
    from taperlm.interop.gguf_import import as_ffn_free, zero_ffn_layers

    model, tok = make_model("zero-mlp")
    path = write_gguf(model, tok, tmp_path / "m.gguf", dtype="f32")
    header = read_header(path)
    assert zero_ffn_layers(path, header) == [3]
    free = as_ffn_free(header, [3])
    assert free.metadata["deci.feed_forward_length"][3] == 0
    assert not any(n.startswith("blk.3.ffn_") for n in free.tensors)
    real = ge._zero_width_ffn

    def one_nonzero(t, state, wide):
        out = real(t, state, wide)
        if t.kind.role == "down":
            out[0, 0] = 1e-3
        return out

    monkeypatch.setattr(ge, "_zero_width_ffn", one_nonzero)
    other = write_gguf(model, tok, tmp_path / "other.gguf", dtype="f32")
    assert zero_ffn_layers(other, read_header(other)) == []
