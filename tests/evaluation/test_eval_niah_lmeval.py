"""Our S-NIAH evaluation vs lm-evaluation-harness's `niah_single_1` (`--model hf` on an exported
tiny model, lengths from `--metadata`): the same items (prompts, answers) at every length, the
same greedy generations and the same scores, item by item; S-NIAH-2/3 items equal lm-eval's when
it is given our prose (the one deviation); and our key words are lm-eval's.

Offline: lm-eval sizes the items with the exported tokenizer (passed as `pretrained`), and its
RULER module, which asks NLTK for the `punkt_tab` sentence model on import (only the prose tasks
use it), finds an empty stand-in instead of downloading it. Takes ~20 s, most of it lm-eval
building its 6.2M key words on import."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from niah_helpers import niah_model, niah_tokenizer
from taperlm.evaluation import niah
from taperlm.evaluation.suite import run_niah

pytestmark = pytest.mark.lmeval

LENGTHS = [512, 256]  # two lengths, not sorted: items follow one stream in the order given
PER_LENGTH = 3


def _offline_ruler(tmp_path: Path, monkeypatch) -> None:
    nltk = pytest.importorskip("nltk")
    pytest.importorskip("wonderwords")
    stand_in = tmp_path / "nltk_data"
    (stand_in / "tokenizers" / "punkt_tab").mkdir(parents=True)
    monkeypatch.setattr(nltk.data, "path", [str(stand_in), *nltk.data.path])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def test_niah_single_1_items_generations_and_scores_equal_lm_eval(
    tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("lm_eval")
    pytest.importorskip("transformers")
    _offline_ruler(tmp_path, monkeypatch)
    import lm_eval.tasks
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from taperlm.checkpoint.loading import load_any
    from taperlm.hf.export import export_model

    export = export_model(niah_model(context_length=512), tmp_path / "export", niah_tokenizer())
    model, tokenizer, _ = load_any(export)
    ours = run_niah(
        model, tokenizer, "niah_single_1", LENGTHS, limit=PER_LENGTH, batch_size=2,
        progress=False, keep_items=True,
    )  # fmt: skip
    # lm-eval's doc ids of our items: the first items of each length in its flat dataset.
    codec = niah.TokenizerCodec(tokenizer)
    first = niah.Generator("niah_single_1", lambda t: len(codec.encode(t))).lengths(LENGTHS[:1])
    offset = len(first[LENGTHS[0]].samples)
    doc_ids = [*range(PER_LENGTH), *range(offset, offset + PER_LENGTH)]
    # What `lm_eval --model hf --model_args pretrained=EXPORT --metadata {max_seq_lengths}`
    # hands the task, with only lm-eval's ruler folder indexed (all tasks take ~10 s).
    ruler = Path(lm_eval.tasks.__file__).parent / "ruler"
    tasks = TaskManager(
        include_path=str(ruler),
        include_defaults=False,
        metadata={"pretrained": str(export), "max_seq_lengths": LENGTHS},
    )
    out = simple_evaluate(
        model="hf",
        # max_length: lm-eval cuts the prompt to max_length - 128 tokens, and RULER's sizing
        # leaves out the answer prefix (~20 tokens), so give it room; we never cut prompts.
        model_args=f"pretrained={export},max_length=1024",
        tasks=["niah_single_1"],
        task_manager=tasks,
        samples={"niah_single_1": doc_ids},
        batch_size=1,
        device="cpu",
        log_samples=True,
        bootstrap_iters=0,
    )
    theirs = sorted(out["samples"]["niah_single_1"], key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in theirs] == doc_ids
    mine = ours.per_item
    assert len(mine) == len(theirs) == 2 * PER_LENGTH
    data = niah.Generator("niah_single_1", lambda t: len(codec.encode(t))).lengths(LENGTHS)
    prompts = {(s.length, s.index): s.prompt for d in data.values() for s in d.samples}
    for ref, item in zip(theirs, mine):
        doc = ref["doc"]
        assert (doc["max_length"], doc["index"]) == (item["length"], item["index"])
        assert doc["outputs"] == item["answers"]
        assert ref["arguments"][0][0] == prompts[(item["length"], item["index"])]
        assert doc["length"] == item["prompt_tokens"] - _prefix_tokens(codec, doc) + 128
        assert ref["resps"][0][0] == item["prediction"]
        assert ref[str(item["length"])] == item["score"]
    for length in LENGTHS:
        assert out["results"]["niah_single_1"][f"{length},none"] == ours.metrics[str(length)]


def _prefix_tokens(codec: niah.TokenizerCodec, doc: dict) -> int:
    """Tokens the answer prefix adds to RULER's input (the model sees both)."""
    return len(codec.encode(doc["input"] + " " + doc["gen_prefix"])) - len(
        codec.encode(doc["input"])
    )


def _prose(n_sentences: int, seed: int = 3) -> str:
    rng = random.Random(seed)
    words = "river stone light green old road house window field cloud rain walks sees".split()
    out = []
    for _ in range(n_sentences):
        s = " ".join(rng.choices(words, k=rng.randint(3, 14))).capitalize()
        out.append(rng.choice(['"{}!"', "{}.", "{}?", "({}.)", "Mr. {}."]).format(s))
    return "  ".join(out)


@pytest.mark.parametrize("task", ["niah_single_2", "niah_single_3"])
def test_prose_items_equal_lm_eval_given_the_same_prose(tmp_path: Path, monkeypatch, task) -> None:
    """S-NIAH-2/3 differ from lm-eval only by the prose and the sentence splitter (our haystack
    deviation): given ours, lm-eval's generator builds exactly our items (depths, sizing, UUIDs)."""
    pytest.importorskip("lm_eval")
    _offline_ruler(tmp_path, monkeypatch)
    from lm_eval.tasks.ruler import niah_utils, prepare_niah

    from taperlm.hf.export import hf_tokenizer

    tok_dir = tmp_path / "tok"
    hf_tokenizer(niah_tokenizer()).save_pretrained(tok_dir)
    hay = niah.Haystack.from_texts([_prose(1500)], {"spec": "test prose"})
    real = niah_utils.get_haystack
    monkeypatch.setattr(
        niah_utils, "get_haystack", lambda type_haystack: hay.words if type_haystack == "essay"
        else real(type_haystack),
    )  # fmt: skip
    monkeypatch.setattr(prepare_niah, "cached_sent_tokenize", niah.split_sentences)
    lengths = [2048, 1024]
    random.seed(0)  # lm-eval's default random_seed, set before the tasks are built
    theirs = getattr(niah_utils, task)(max_seq_lengths=lengths, tokenizer=str(tok_dir))["test"]
    codec = niah.TokenizerCodec(niah_tokenizer())
    data = niah.Generator(task, lambda t: len(codec.encode(t)), hay).lengths(lengths)
    assert data[2048].haystack_units >= 500  # a real haystack: at least one 500-word step
    ours = [s for L in lengths for s in data[L].samples]
    assert len(ours) == len(theirs)
    for s, ref in zip(ours, theirs):
        assert (s.input, s.answers, s.gen_prefix) == (
            ref["input"],
            ref["outputs"],
            ref["gen_prefix"],
        )
        assert (s.length, s.index, s.input_tokens + 128) == (
            ref["max_length"], ref["index"], ref["length"],
        )  # fmt: skip


def test_key_words_are_lm_eval_words(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("lm_eval")
    _offline_ruler(tmp_path, monkeypatch)
    from lm_eval.tasks.ruler import prepare_niah

    words, ours = prepare_niah.WORDS, niah.key_words()
    assert len(ours) == len(words)
    # Every block boundary of ours and a dense stride: a wrong order shows within a block.
    probe = sorted({*range(0, len(words), 101), *ours._starts, len(words) - 1})
    assert [ours[i] for i in probe] == [words[i] for i in probe]
    assert list(prepare_niah.DEPTHS) == niah.DEPTHS
