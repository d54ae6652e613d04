"""RULER S-NIAH (taperlm.evaluation.niah, suite.run_niah, generation.greedy_batch, the CLI):
key words, items, scoring on hand-written generations, batched greedy decoding on every family,
context checks and the table. Equality with lm-eval: test_eval_niah_lmeval.py; a trained model
that passes: test_eval_niah_trained.py."""

from __future__ import annotations

import json
import random
import re
import uuid
from pathlib import Path

import pytest
import torch

from conftest import assert_naming, raises_naming
from niah_helpers import niah_model, niah_tokenizer
from taperlm.cli import main as cli_main
from taperlm.errors import ConfigError, DataError
from taperlm.evaluation import niah
from taperlm.evaluation.suite import format_table, niah_lengths, paper_row, run_niah
from taperlm.models.generation import greedy_batch

FAMILIES = ["transformer", "gated", "hope", "titans-mac", "titans-mag", "titans-mal"]
PROSE = (
    "Alpha is a town by the river. It was founded in 1900 by farmers! Was it large? No. "
    '"Few people lived there," a visitor wrote. (The mill closed.) 3 roads led out. '
) * 200


def _codec() -> niah.TokenizerCodec:
    return niah.TokenizerCodec(niah_tokenizer())


def _generator(task: str, seed: int = 0) -> niah.Generator:
    codec = _codec()
    hay = niah.Haystack.from_texts([PROSE], {"spec": "test prose"})
    return niah.Generator(task, lambda t: len(codec.encode(t)), hay, seed=seed)


# ----------------------------------------------------------------------------------------------
# keys, depths, sentences


def test_key_words_equal_the_sorted_set_of_pairs() -> None:
    # Hyphenated adjectives interleave with their stems; "x" + "rated-tv" == "x-rated" + "tv"
    # is a duplicate; a space sorts before "-"; duplicates in the input lists.
    adjs = ["blue", "blue-eyed", "ad hoc", "ad", "x", "x-rated", "old", "old-fashioned", "big"]
    adjs += ["blue-eyed-x", "Big", "big"]
    nouns = ["cat", "e-mail", "rated-tv", "tv", "eyed-owl", "Zebra", "dog", "cat"]
    brute = sorted({f"{a}-{n}" for a in adjs for n in nouns})
    keys = niah.KeyWords(adjs, nouns)
    assert len(keys) == len(brute)
    assert [keys[i] for i in range(len(keys))] == brute
    assert keys[-1] == brute[-1]
    with pytest.raises(IndexError):
        keys[len(brute)]
    # random.choice sees the same sequence.
    assert [random.Random(s).choice(keys) for s in range(50)] == [
        random.Random(s).choice(brute) for s in range(50)
    ]


def test_wonderwords_keys_are_adjective_noun_pairs() -> None:
    keys = niah.key_words()
    assert len(keys) > 6_000_000
    probe = [keys[i] for i in range(0, len(keys), len(keys) // 1000)]
    assert probe == sorted(probe) and len(set(probe)) == len(probe)


def test_depths_are_rounded_linspace() -> None:
    np = pytest.importorskip("numpy")
    assert np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int).tolist() == niah.DEPTHS


def test_split_sentences() -> None:
    text = 'He left. "Why?" she asked! (It rained.) 3 days later, e.g. Mr. J. Li came... back. End'
    sents = niah.split_sentences(text)
    assert sents == [
        "He left.",
        '"Why?" she asked!',
        "(It rained.)",
        "3 days later, e.g. Mr. J. Li came... back.",
        "End",
    ]
    assert " ".join(sents) == text
    assert niah.split_sentences("no end here") == ["no end here"]
    assert niah.split_sentences("") == []


def test_wikitext_prose_drops_headings_and_detokenizes() -> None:
    raw = " \n = Title = \n \n The town , 1 @,@ 000 people . \n = = History = = \n It grew . \n"
    assert niah.wikitext_prose(raw) == ["The town, 1,000 people.", "It grew."]


def test_haystack_words_follow_ruler() -> None:
    hay = niah.Haystack.from_texts(["a  b\nc", "d\t e "])
    assert hay.words == ["a", "b", "c", "d", "e", ""]  # RULER keeps a trailing empty word


# ----------------------------------------------------------------------------------------------
# items


@pytest.mark.parametrize("task", niah.TASKS)
def test_items_are_well_formed(task: str) -> None:
    codec = _codec()
    data = _generator(task).lengths([256, 512], limit=4)
    spec = niah.SPECS[task]
    for length, d in data.items():
        assert len(d.samples) == 4
        for s in d.samples:
            assert s.length == length and s.input_tokens == len(codec.encode(s.input))
            assert s.input_tokens + niah.MAX_NEW_TOKENS <= length
            (value,) = s.answers
            needle = f"One of the special magic {spec.values} for "
            assert s.input.count(needle) == 1 and s.input.count(value) == 1
            key = re.search(needle + r"(\S+) is: ", s.input).group(1)
            assert s.input.startswith(f"A special magic {spec.kind} is hidden within")
            assert s.input.endswith(f"What is the special magic {spec.kind} for {key} "
                                    "mentioned in the provided text?")  # fmt: skip
            assert s.prompt == s.input + " " + s.gen_prefix
            assert s.gen_prefix == (
                f"The special magic {spec.kind} for {key} mentioned in the provided text is"
            )
            if spec.values == "numbers":
                assert re.fullmatch(r"[1-9]\d{6}", value)
            else:
                assert uuid.UUID(value).version == 4
            if spec.haystack == "repeat":
                assert s.input.count(niah.REPEAT_LINE) <= d.haystack_units


def test_repeat_haystack_fills_the_length_in_steps() -> None:
    # Below 4096 tokens RULER adds 5 lines at a time: the haystack is the largest multiple of
    # 5 whose input (answer included) leaves 128 tokens; one more step would not fit.
    gen = _generator("niah_single_1")
    d = gen.length_data(1024, limit=3)
    codec = _codec()
    line = len(codec.encode(niah.REPEAT_LINE + "\n"))
    assert d.haystack_units % 5 == 0 and d.haystack_units >= 5
    for s in d.samples:
        assert s.input_tokens + 128 <= 1024 < s.input_tokens + 128 + 5 * line + 10


def test_streams_are_deterministic_and_continue_across_lengths() -> None:
    a = _generator("niah_single_3").lengths([256, 512])
    b = _generator("niah_single_3").lengths([256, 512], limit=5)
    c = _generator("niah_single_3", seed=1).lengths([256, 512], limit=5)
    assert [s.answers for s in b[256].samples] == [s.answers for s in a[256].samples[:5]]
    assert [s.answers for s in b[512].samples] == [s.answers for s in a[512].samples[:5]]
    assert [s.answers for s in c[256].samples] != [s.answers for s in b[256].samples]
    # The second length continues the stream: its items are not the first length's draws.
    alone = _generator("niah_single_3").lengths([512], limit=5)
    assert [s.answers for s in alone[512].samples] != [s.answers for s in b[512].samples]
    assert len(a[256].samples) + a[256].skipped == niah.NUM_SAMPLES


def test_needle_depths_spread_over_the_prose() -> None:
    d = _generator("niah_single_2").length_data(2048, limit=30)
    assert d.haystack_units >= 500
    where = []
    for s in d.samples:
        context = s.input.split("\n")[1]
        where.append(context.index("One of the special magic") / len(context))
    assert min(where) < 0.2 and max(where) > 0.8 and len({round(w, 2) for w in where}) > 10


def test_too_short_lengths_and_haystacks_are_clear_errors() -> None:
    with raises_naming(DataError, "niah_single_1", "128 tokens", "--niah-lengths"):
        _generator("niah_single_1").length_data(128)
    codec = _codec()
    short = niah.Haystack.from_texts(["Only a few words here. " * 60], {"spec": "short"})
    gen = niah.Generator("niah_single_2", lambda t: len(codec.encode(t)), short)
    with raises_naming(DataError, "short", "4096", "--niah-haystack"):
        gen.length_data(4096, limit=1)
    with raises_naming(DataError, "'niah_multikey_1'", "niah_single_1"):
        niah.Generator("niah_multikey_1", len)


def test_load_haystack_sources(tmp_path: Path) -> None:
    (tmp_path / "wikitext-2").mkdir()
    (tmp_path / "wikitext-2" / "wiki.test.raw").write_text(" = T = \n A b . \n", "utf-8")
    assert niah.load_haystack("wikitext", tmp_path, 10**6).words == ["A", "b."]
    (tmp_path / "prose.txt").write_text("One two.\nThree four.", "utf-8")
    hay = niah.load_haystack(str(tmp_path / "prose.txt"), None, 10**6)
    assert hay.words == ["One", "two.", "Three", "four."] and hay.source["kind"] == "local"
    with pytest.raises(DataError, match="--data-dir"):
        niah.load_haystack("wikitext", None, 10**6)
    with raises_naming(DataError, str(tmp_path / "nope"), "--data-dir"):
        niah.load_haystack("wikitext", tmp_path / "nope", 10**6)


def test_default_haystack_ships_with_python() -> None:
    """The default S-NIAH-2/3 prose needs no download and no ../shared: the language reference's
    prose paragraphs (no grammar rules, code, or heading underlines), the same every time."""
    hay = niah.load_haystack(niah.DEFAULT_HAYSTACK, None, 10**6)
    text = " ".join(hay.words)
    assert len(hay.words) > 20_000 and hay.source["module"] == "pydoc_data.topics"
    assert "::=" not in text and ">>>" not in text and "*****" not in text
    assert len(niah.split_sentences(text)) > 1000
    again = niah.load_haystack(niah.DEFAULT_HAYSTACK, None, 10**6)
    assert again.words == hay.words and again.source["sha256"] == hay.source["sha256"]
    first = niah.load_haystack(niah.DEFAULT_HAYSTACK, None, 1000).words  # max_chars honoured
    assert 100 < len(first) < 200 and first[:-1] == hay.words[: len(first) - 1]


def test_haystack_too_short_for_the_length_is_refused_up_front() -> None:
    codec = _codec()
    count = lambda t: len(codec.encode(t))  # noqa: E731
    short = niah.Haystack.from_texts(["Only a few words here. " * 60], {"spec": "short"})
    niah.check_haystack(short, count, 256)
    with raises_naming(DataError, "short", "of the 4096", "--niah-haystack", "--niah-lengths"):
        niah.check_haystack(short, count, 4096)


# ----------------------------------------------------------------------------------------------
# scoring


def test_string_match_all() -> None:
    assert niah.string_match_all(" 1234567.", ["1234567"]) == 1.0
    assert niah.string_match_all("\n\x0bABC-DEF\x00 ", ["abc-def"]) == 1.0  # case, control chars
    assert niah.string_match_all("123456", ["1234567"]) == 0.0
    assert niah.string_match_all("12 and 34", ["12", "34", "56", "78"]) == 0.5
    assert niah.postprocess("  a\x01b\tc  ") == "a\nb\nc"


def _hand_written(monkeypatch, texts_for) -> None:
    """Make greedy_batch return hand-written generations (tokens of text), EOS and all."""
    tok = niah_tokenizer()

    def fake(model, prompts, max_new_tokens, eos_id=None, **kw):
        assert max_new_tokens == 128 and eos_id == tok.eos_id
        return [tok.encode(texts_for(i)) for i in range(len(prompts))]

    monkeypatch.setattr("taperlm.models.generation.greedy_batch", fake)


@pytest.mark.parametrize(
    ("case", "right", "expect"),
    [("all", {0, 1, 2, 3}, 1.0), ("partial", {1, 3}, 0.5), ("none", set(), 0.0)],
)
def test_scores_of_hand_written_generations(monkeypatch, case, right, expect) -> None:
    model, tok = niah_model(context_length=512), niah_tokenizer()
    answers = {L: [s.answers[0] for s in d.samples] for L, d in _items_by_length().items()}
    current: dict[str, int] = {"length": 256}

    def text(i: int) -> str:
        value = answers[current["length"]][i]
        if i in right:
            return [f" {value}.", f"\n{value.upper()} and more", f" is {value}", f"{value}"][i]
        return [" 0000000.", " I do not know.", f" {value[:-1]}", ""][i]

    _hand_written(monkeypatch, text)
    res = run_niah(model, tok, "niah_single_1", [256], limit=4, progress=False, keep_items=True)
    assert res.metrics == {"256": expect} and res.counts == {"256": 4} and res.n == 4
    p = expect
    se = (p * (1 - p) * 4 / 3) ** 0.5 / 2  # sample std / sqrt(n) of 0/1 scores
    assert res.stderr["256"] == pytest.approx(se)
    assert [r["score"] for r in res.per_item] == [float(i in right) for i in range(4)]
    assert res.per_item[0]["answers"] == [answers[256][0]]


def _items_by_length() -> dict[int, niah.LengthData]:
    codec = _codec()
    return niah.Generator("niah_single_1", lambda t: len(codec.encode(t))).lengths([256], limit=4)


def test_prediction_is_cut_at_eos_text() -> None:
    codec, tok = _codec(), niah_tokenizer()
    # greedy_batch stops at the EOS id; lm-eval also cuts the text at the EOS *string*, which
    # ordinary pieces can spell out.
    ids = tok.encode(" 42 then <|endof") + tok.encode("text|> 1234567")
    assert tok.eos_id not in ids and codec.eos_text == "<|endoftext|>"
    assert codec.prediction(ids) == " 42 then "
    assert codec.prediction(tok.encode(" 42")) == " 42"


# ----------------------------------------------------------------------------------------------
# batched greedy decoding


@torch.no_grad()
def _reference(model, prompt: list[int], n: int, eos: int | None) -> list[int]:
    ids, out = list(prompt), []
    for _ in range(n):
        t = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        if t == eos:
            break
        out.append(t)
        ids.append(t)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_batch_equals_one_prompt_at_a_time(family: str) -> None:
    model = niah_model(family, context_length=64)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 1000) for _ in range(n)] for n in (9, 5, 9, 12, 5, 9)]
    want = [_reference(model, p, 6, None) for p in prompts]
    assert greedy_batch(model, prompts, 6, batch_size=2) == want
    assert greedy_batch(model, prompts, 6, batch_size=8, use_cache=False) == want
    # EOS: a row stops before the first EOS; other rows go on.
    eos = want[3][2]
    got = greedy_batch(model, prompts, 6, eos_id=eos, batch_size=4)
    assert got == [_reference(model, p, 6, eos) for p in prompts]
    assert got[3] == want[3][:2]
    assert greedy_batch(model, prompts[:1], 0) == [[]]


def test_logits_to_keep() -> None:
    model = niah_model(context_length=64)
    x = torch.randint(0, 1000, (2, 10))
    with torch.no_grad():
        full = model(x).logits
        assert torch.allclose(model(x, logits_to_keep=1).logits, full[:, -1:], atol=1e-6)
        assert torch.allclose(model(x, logits_to_keep=3).logits, full[:, -3:], atol=1e-6)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(x, targets=x, logits_to_keep=1)


def test_hf_generate_with_use_cache_matches_greedy() -> None:
    """lm-eval's hf model always calls generate(use_cache=True)."""
    pytest.importorskip("transformers")
    from taperlm.hf.export import to_hf_model

    model = niah_model(context_length=64)
    prompt = niah_tokenizer().encode("The grass is green. The sky is")
    out = to_hf_model(model).generate(
        torch.tensor([prompt]), max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0
    )
    assert out[0, len(prompt) :].tolist() == _reference(model, prompt, 8, None)


# ----------------------------------------------------------------------------------------------
# context length, table, CLI


def test_lengths_beyond_the_context_are_skipped_with_the_reason() -> None:
    keep, skipped = niah_lengths([256, 512, 128], 256, extrapolate=False)
    assert keep == [256, 128] and list(skipped) == [512]
    assert "context_length 256" in skipped[512] and "--niah-extrapolate" in skipped[512]
    assert niah_lengths([512], 256, extrapolate=True) == ([512], {})
    with raises_naming(ConfigError, "--niah-lengths", "context_length", "--niah-extrapolate"):
        run_niah(niah_model(context_length=256), niah_tokenizer(), "niah_single_1", [512])


def test_paper_table_puts_niah_columns_after_the_zero_shot_ones(monkeypatch) -> None:
    _hand_written(monkeypatch, lambda i: " nothing")
    model, tok = niah_model(context_length=512), niah_tokenizer()
    res = run_niah(model, tok, "niah_single_1", [256, 512], limit=2, progress=False)
    row = paper_row({"niah_single_1": res})
    cols = list(row)
    assert cols[: cols.index("Avg") + 1][-1] == "Avg"
    assert cols[cols.index("Avg") + 1 :] == ["S-NIAH-1 256", "S-NIAH-1 512"]
    assert row["S-NIAH-1 256"] == 0.0
    table = format_table({"niah_single_1": res})
    assert "| S-NIAH-1 256 | S-NIAH-1 512 |" in table.split("\n")[0] + "|"
    assert re.search(r"\| niah_single_1 \| 2 \| 512 \| 0\.0000 \| 0\.0000 \|", table)
    assert niah.length_label(16384) == "16K" and niah.length_label(1000) == "1000"


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    from taperlm.hf.export import export_model

    root = tmp_path_factory.mktemp("niah_exports")
    return {
        f: export_model(niah_model(f, context_length=256), root / f, niah_tokenizer())
        for f in FAMILIES
    }


def _eval(args: list[str], capsys) -> tuple[int, dict | None, str]:
    rc = cli_main(["eval", *args])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc == 0 and "--json" in args else None), out.err


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_runs_niah_on_every_family(exports, family, capsys) -> None:
    rc, blob, err = _eval(
        [str(exports[family]), "--tasks", "niah_single_1", "--niah-lengths", "256", "--limit",
         "1", "--json"],
        capsys,
    )  # fmt: skip
    assert rc == 0, err
    res = blob["tasks"]["niah_single_1"]
    assert set(res["metrics"]) == {"256"} and res["counts"] == {"256": 1}
    assert 0.0 <= res["metrics"]["256"] <= 1.0 and res["stderr"]["256"] is None
    per_length = res["settings"]["lengths"]["256"]
    assert per_length["n"] == 1 and per_length["items_per_s"] > 0
    # Every family decodes with its cache (Titans: memory state, conv tails, window/segment KV).
    assert "decoding cache" in res["settings"]["decoding"]
    assert blob["paper_table"]["S-NIAH-1 256"] == 100 * res["metrics"]["256"]


def test_cli_all_tasks_skips_and_errors(exports, tmp_path, capsys) -> None:
    hay = tmp_path / "prose.txt"
    hay.write_text(PROSE, "utf-8")
    export = str(exports["transformer"])
    args = [export, "--tasks", "niah", "--niah-lengths", "256,512", "--niah-haystack", str(hay)]
    rc, _, err = _eval([*args, "--limit", "2", "--out", str(tmp_path / "r.json")], capsys)
    assert rc == 0, err
    blob = json.loads((tmp_path / "r.json").read_text())
    assert list(blob["tasks"]) == list(niah.TASKS)
    for task in niah.TASKS:
        r = blob["tasks"][task]
        assert list(r["metrics"]) == ["256"] and r["counts"] == {"256": 2}
        assert "--niah-extrapolate" in r["settings"]["skipped_lengths"]["512"]
    assert blob["tasks"]["niah_single_2"]["settings"]["haystack"]["path"] == str(hay.resolve())
    assert blob["meta"]["niah_lengths"] == [256, 512]
    assert any("niah_single_1 @ 512 skipped" in n for n in blob["meta"]["notes"])
    # --niah-extrapolate evaluates past the context; all lengths too long is an error.
    rc, blob, err = _eval(
        [export, "--tasks", "niah_single_1", "--niah-lengths", "512", "--limit", "1", "--json",
         "--niah-extrapolate"],
        capsys,
    )  # fmt: skip
    assert rc == 0 and blob["tasks"]["niah_single_1"]["counts"] == {"512": 1}, err
    rc, _, err = _eval([export, "--tasks", "niah_single_1", "--niah-lengths", "1024"], capsys)
    assert rc == 2 and "context_length 256" in err and "--niah-extrapolate" in err


def test_cli_checks_every_niah_input_before_any_item(exports, tmp_path, capsys) -> None:
    """Without evaluation data the default prose is used; a haystack too short for a length
    stops the command before S-NIAH-1 runs a single item (it used to fail after them)."""
    export = str(exports["transformer"])
    rc, blob, err = _eval(
        [export, "--tasks", "niah_single_2", "--niah-lengths", "256", "--limit", "1", "--json"],
        capsys,
    )  # fmt: skip
    assert rc == 0, err
    assert blob["tasks"]["niah_single_2"]["settings"]["haystack"]["spec"] == "python-docs"
    hay = tmp_path / "short.txt"
    hay.write_text("A few words. " * 10, "utf-8")
    rc, _, err = _eval(
        [export, "--tasks", "niah", "--niah-lengths", "256", "--niah-haystack", str(hay),
         "--limit", "1"],
        capsys,
    )  # fmt: skip
    assert rc == 2
    assert_naming(err, str(hay), "of the 256 tokens", "--niah-haystack")
    assert "niah_single_1:" not in err and "n=" not in err  # no task ran

    for bad, msg in [("256,x", "not a whole number"), ("0", "positive"), ("256,256", "twice")]:
        rc, _, err = _eval([export, "--tasks", "niah", "--niah-lengths", bad], capsys)
        assert rc == 2 and msg in err, err
