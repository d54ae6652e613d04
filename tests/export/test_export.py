"""Hugging Face export: round trip with equal logits, generate(), remote code and the lazy
Auto-class registration of `import taperlm`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import raises_naming
from eval_helpers import tiny_model, tiny_tokenizer

transformers = pytest.importorskip("transformers")

from taperlm.hf.export import AUTO_MAP, export_model  # noqa: E402


@pytest.mark.parametrize("family", ["transformer", "gated"])
def test_round_trip_logits_equal(tmp_path: Path, family: str) -> None:
    model = tiny_model(family)
    out = export_model(model, tmp_path / "hf", tiny_tokenizer())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "taperlm" and cfg["auto_map"] == AUTO_MAP
    assert cfg["taperlm"]["mlp_widths"] == model.config.mlp_widths
    assert cfg["max_position_embeddings"] == model.config.context_length
    for f in (
        "model.safetensors",
        "configuration_taperlm.py",
        "modeling_taperlm.py",
        "tokenizer.json",
        "generation_config.json",
    ):
        assert (out / f).is_file(), f
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    x = torch.randint(0, model.config.vocab_size, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, atol=1e-5, rtol=0)


def test_tapered_widths_and_tied_embeddings_survive(tmp_path: Path) -> None:
    from taperlm.spec.taper import TaperSpec

    model = tiny_model(
        n_layers=3,
        mlp_width=64,
        tie_embeddings=True,
        taper=TaperSpec(schedule="linear", start=1.5, end=0.5, multiple_of=8),
    )
    assert len(set(model.config.mlp_widths)) == 3
    out = export_model(model, tmp_path / "hf", tiny_tokenizer())
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert [b.mlp.width for b in hf.model.blocks] == model.config.mlp_widths
    assert hf.model.lm_head.weight.data_ptr() == hf.model.embed.weight.data_ptr()
    x = torch.randint(0, model.config.vocab_size, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, atol=1e-5, rtol=0)


FAMILIES = ["transformer", "gated", "hope", "titans-mac", "titans-mag", "titans-mal"]


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_cache_matches_our_greedy_decoding(tmp_path: Path, family: str) -> None:
    """`generate()` of the export decodes incrementally with a transformers cache (a prompt
    once, then one token per forward) and gives `taperlm generate`'s greedy tokens."""
    from taperlm.hf.modeling import TaperLMCache
    from taperlm.models.generation import SamplingConfig, generate_tokens

    model, tok = tiny_model(family), tiny_tokenizer()
    out = export_model(model, tmp_path / "hf", tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    enc = hf_tok("The cat sat on the", return_tensors="pt")
    assert enc["input_ids"][0].tolist() == tok.encode("The cat sat on the")
    lengths, caches = [], []
    real_forward = hf.forward

    def spy(input_ids, **kw):
        lengths.append(input_ids.shape[1])
        result = real_forward(input_ids, **kw)
        caches.append(result.cache)
        return result

    hf.forward = spy  # type: ignore[method-assign]
    gen = hf.generate(**enc, max_new_tokens=20, do_sample=False, eos_token_id=None)
    ours = list(
        generate_tokens(
            model,
            tok.encode("The cat sat on the"),
            SamplingConfig(max_new_tokens=20, temperature=0),
        )
    )
    assert gen[0, enc["input_ids"].shape[1] :].tolist() == ours
    assert lengths == [enc["input_ids"].shape[1]] + [1] * 19
    expected = TaperLMCache if family.startswith("titans") else transformers.DynamicCache
    assert all(type(c) is expected for c in caches) and len({id(c) for c in caches}) == 1
    assert caches[-1].get_seq_length() == enc["input_ids"].shape[1] + 19


@pytest.mark.parametrize("family", ["transformer", "titans-mac"])
def test_beam_search_with_cache_equals_without(tmp_path: Path, family: str) -> None:
    """Beam search reorders the cache's batch rows (`reorder_cache`)."""
    out = export_model(tiny_model(family), tmp_path / "hf", tiny_tokenizer())
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    ids = torch.tensor([[5, 9, 2, 7, 7, 3]])
    kw = dict(max_new_tokens=12, num_beams=3, do_sample=False, eos_token_id=None)
    torch.testing.assert_close(hf.generate(ids, **kw), hf.generate(ids, use_cache=False, **kw))


def test_forward_with_transformers_caches(tmp_path: Path) -> None:
    """The cache API by hand: a DynamicCache for attention families; Titans refuses a cache
    that cannot hold its memory and returns its own."""
    from taperlm.hf.modeling import TaperLMCache

    ids = torch.randint(0, tiny_tokenizer().vocab_size, (2, 13))
    for family in ("gated", "titans-mag"):
        out = export_model(tiny_model(family), tmp_path / family, tiny_tokenizer())
        hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
        with torch.no_grad():
            full = hf(ids, use_cache=False).logits
            first = hf(ids[:, :9], cache=transformers.DynamicCache(), use_cache=True)
            second = hf(ids[:, 9:], cache=first.cache, use_cache=True)
        torch.testing.assert_close(
            torch.cat((first.logits, second.logits), 1), full, atol=1e-5, rtol=0
        )
        if family.startswith("titans"):
            assert isinstance(first.cache, TaperLMCache)
            filled = transformers.DynamicCache()
            filled.update(torch.zeros(2, 2, 3, 16), torch.zeros(2, 2, 3, 16), 0)
            with pytest.raises(ValueError, match="TaperLMCache"):
                hf(ids, cache=filled, use_cache=True)


def test_left_padding_is_rejected(tmp_path: Path) -> None:
    out = export_model(tiny_model(), tmp_path / "hf", tiny_tokenizer())
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    ids = torch.tensor([[5, 6, 7]])
    hf(ids, attention_mask=torch.tensor([[1, 1, 0]]))  # right padding is harmless
    with raises_naming(ValueError, "left padding", "padding_side='right'"):
        hf(ids, attention_mask=torch.tensor([[0, 1, 1]]))


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_import_taperlm_registers_auto_classes_lazily(tmp_path: Path) -> None:
    out = export_model(tiny_model(), tmp_path / "hf", tiny_tokenizer())
    stdout = _run(
        "import sys, taperlm\n"
        "print('heavy', 'torch' in sys.modules or 'transformers' in sys.modules)\n"
        "from transformers import AutoModelForCausalLM, AutoConfig\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(out)!r})\n"
        "print(type(m).__module__, type(AutoConfig.for_model('taperlm')).__name__)\n"
    )
    assert "heavy False" in stdout
    assert "taperlm.hf.modeling TaperLMConfig" in stdout
    # transformers imported first, taperlm afterwards: registers at once.
    stdout = _run(
        "from transformers import AutoModelForCausalLM\nimport taperlm\n"
        f"print(type(AutoModelForCausalLM.from_pretrained({str(out)!r})).__name__)\n"
    )
    assert "TaperLMForCausalLM" in stdout


def test_export_cli_refuses_non_empty_out(tmp_path: Path, capsys) -> None:
    from taperlm.cli import main

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_import_taperlm_stays_cheap() -> None:
    t0 = time.perf_counter()
    stdout = _run(
        "import sys, taperlm; print(sorted(m for m in ('torch', 'transformers', "
        "'numpy') if m in sys.modules))"
    )
    assert "torch" not in stdout and "transformers" not in stdout
    assert time.perf_counter() - t0 < 60  # sanity only; the real number is in the docs


def test_exported_files_have_the_default_mode(tmp_path: Path) -> None:
    """Every exported file gets the mode of a newly created file (0644 under umask 022), the
    weights included (safetensors alone leaves them at 0600)."""
    import os

    old = os.umask(0o022)
    try:
        out = export_model(tiny_model(), tmp_path / "hf", tiny_tokenizer())
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert "model.safetensors" in modes
    assert set(modes.values()) == {0o644}, modes
