"""Sampling: cached and uncached greedy decoding agree for every family with a cache; sampling
options; the generate CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eval_helpers import tiny_model, tiny_tokenizer
from taperlm.errors import ConfigError
from taperlm.models.generation import SamplingConfig, filter_logits, generate_tokens, stream_text


@pytest.mark.parametrize(
    "family", ["transformer", "gated", "hope", "titans-mac", "titans-mag", "titans-mal"]
)
def test_cached_equals_uncached_greedy(family: str) -> None:
    model = tiny_model(family, context_length=32)
    prompt = tiny_tokenizer().encode("The cat sat on the")
    # 40 new tokens run past the 32-token context: exercises the sliding-window fallback too.
    cached = list(generate_tokens(model, prompt, SamplingConfig(max_new_tokens=40, temperature=0)))
    plain = list(
        generate_tokens(
            model, prompt, SamplingConfig(max_new_tokens=40, temperature=0, use_cache=False)
        )
    )
    assert len(cached) == 40 and cached == plain
    # and both equal the argmax of full forward passes
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(10):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert cached[:10] == seq[len(prompt) :]


def test_models_without_cache_fall_back() -> None:
    model = tiny_model()

    def no_cache():
        raise NotImplementedError

    model.new_cache = no_cache  # type: ignore[method-assign]
    out = list(generate_tokens(model, [1, 2, 3], SamplingConfig(max_new_tokens=5, temperature=0)))
    assert len(out) == 5


def test_seed_reproducible_and_eos_stops() -> None:
    model = tiny_model()
    cfg = SamplingConfig(max_new_tokens=20, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    a = list(generate_tokens(model, [1, 2], cfg))
    assert a == list(generate_tokens(model, [1, 2], cfg))
    greedy = list(generate_tokens(model, [1, 2], SamplingConfig(max_new_tokens=5, temperature=0)))
    stop = list(
        generate_tokens(
            model, [1, 2], SamplingConfig(max_new_tokens=5, temperature=0, eos_id=greedy[2])
        )
    )
    assert stop == greedy[:2]


def test_filter_logits_top_k_top_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isinf(filter_logits(logits, 2, None)).tolist() == [False, False, True, True]
    # nucleus 0.7: 0.5 < 0.7 so the second token is needed; mass before the third is 0.8 >= 0.7
    assert torch.isinf(filter_logits(logits, None, 0.7)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_logits(logits, None, 0.4)).tolist() == [False, True, True, True]
    with pytest.raises(ConfigError):
        SamplingConfig(top_p=1.5).validate()
    with pytest.raises(ConfigError):
        SamplingConfig(temperature=-1).validate()


def test_stream_text_holds_back_partial_utf8() -> None:
    tok = tiny_tokenizer()
    ids = tok.encode("naïve café ✓ ok")
    assert "".join(stream_text(iter(ids), tok.decode)) == "naïve café ✓ ok"
    pieces = list(stream_text(iter(ids), tok.decode))
    assert all("\ufffd" not in p for p in pieces)


def test_generate_cli_on_export_dir(tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers")
    from taperlm.cli import main
    from taperlm.hf.export import export_model

    out = export_model(tiny_model(), tmp_path / "hf", tiny_tokenizer())
    assert (
        main(["generate", str(out), "--prompt", "The cat", "--max-new-tokens", "8", "--seed", "1"])
        == 0
    )
    first = capsys.readouterr().out
    assert first.startswith("The cat")
    assert (
        main(["generate", str(out), "--prompt", "The cat", "--max-new-tokens", "8", "--seed", "1"])
        == 0
    )
    assert capsys.readouterr().out == first
    assert main(["generate", str(out), "--top-p", "2"]) == 2
    assert "--top-p" in capsys.readouterr().err
