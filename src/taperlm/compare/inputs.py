"""What every cell of a comparison reads: the data dir (without --data, the built-in corpus,
prepared once into the cache: $TAPERLM_CACHE, else $XDG_CACHE_HOME/taperlm, else
~/.cache/taperlm) and how cells are evaluated (zero-shot tasks, NIAH lengths, novelty text)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from taperlm.compare.options import CompareOptions, model_preset
from taperlm.compare.runner import EvalSettings
from taperlm.config import RunConfig
from taperlm.data import corpus as data_corpus
from taperlm.data import prepare as data_prepare
from taperlm.data.loader import load_meta
from taperlm.errors import ConfigError, DataError
from taperlm.evaluation.locate import eval_data_dir, wikitext_test
from taperlm.evaluation.niah import DEFAULT_HAYSTACK
from taperlm.evaluation.niah import TASKS as NIAH_TASKS
from taperlm.evaluation.registry import needs_haystack, task_names, zero_shot_tasks
from taperlm.evaluation.suite import parse_task_list

DEFAULT_CORPUS_TOKENIZER = "bpe:2048"
# A preset size whose own vocabulary is smaller reads the built-in corpus through its own
# tokenizer: nano's 512 tokens (at bpe:2048 its embeddings would be 2/3 of the model). At bpe:512
# the corpus has 13.1M training tokens: nano's 68 tokens per parameter (18.1M) is 1.4 epochs.
SIZE_CORPUS_TOKENIZERS = {"nano": "bpe:512"}


def corpus_tokenizer(opts: CompareOptions) -> str:
    """The tokenizer of the built-in corpus for `opts`' preset (its size's own, else the
    default)."""
    preset = model_preset(opts)
    size = None if preset is None else preset.rpartition("-")[2]
    return SIZE_CORPUS_TOKENIZERS.get(size or "", DEFAULT_CORPUS_TOKENIZER)


def cache_root() -> Path:
    env = os.environ.get("TAPERLM_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "taperlm"


def default_corpus_dir(progress: bool, tokenizer: str = DEFAULT_CORPUS_TOKENIZER) -> Path:
    """The default corpus at `tokenizer`, prepared once into the cache (atomic: a temp dir
    renamed into place, so concurrent or interrupted runs never see a half-written data dir)."""
    meta_file = data_prepare.META_FILE
    # Keyed by what it is built from (the installed files, the pipeline): an upgraded package
    # or taperlm gets a fresh corpus rather than a stale one under the same name.
    inputs = json.dumps([data_prepare.PIPELINE_VERSION, data_corpus.default_corpus_identity()])
    digest = hashlib.sha256(inputs.encode()).hexdigest()[:12]
    target = cache_root() / f"default-{tokenizer.replace(':', '')}-{digest}"
    if (target / meta_file).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    print(
        f"taperlm compare: preparing the default corpus into {target} (once; ~1 min)",
        file=sys.stderr,
    )
    try:
        data_prepare.prepare("default", tmp, tokenizer, workers=2, progress=progress)
        if target.exists() and not (target / meta_file).is_file():
            shutil.rmtree(target)  # an incomplete leftover
        if not target.exists():
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def data_dir_of(opts: CompareOptions, provisional: RunConfig) -> Path:
    """The assembled data.dir of the provisional base config (--data, a config file's, --set or
    $TAPERLM_SET: `taperlm.compare.recipe.base_config`), else the default corpus (prepared
    once). The one folder the cells train on and the vocabulary and evaluation are read from."""
    if provisional.data.dir:
        data_dir = Path(provisional.data.dir).expanduser().resolve()
    else:
        tokenizer = corpus_tokenizer(opts)
        target = default_corpus_dir(not opts.no_progress, tokenizer)
        print(default_corpus_note(target, tokenizer), file=sys.stderr)
        return target
    load_meta(data_dir)  # DataError naming `taperlm prepare` when missing or incomplete
    return data_dir


def default_corpus_note(target: Path, tokenizer: str = DEFAULT_CORPUS_TOKENIZER) -> str:
    """Which data a compare without --data trains on, and the prepared folders it leaves alone
    (its own corpus keeps the main job's numbers reproducible: another tokenizer would change
    the models' size)."""
    here = sorted(str(p.parent) for p in Path("data").glob(f"*/{data_prepare.META_FILE}"))[:3]
    other = f"; {', '.join(here)} (prepared here) is used only with --data" if here else ""
    return (
        f"taperlm compare: data: the built-in corpus (Debian's Python, Perl and Linux "
        f"documentation) with its {tokenizer} tokenizer, cached in {target}; "
        f"--data DIR trains on other data{other}"
    )


def compare_task_groups() -> dict[str, list[str]]:
    """--eval-tasks groups, from the task registry: `paper` (the zero-shot suite), `niah`, and
    `all` = those, then every other registered task (a task registered later is a compare
    option as it is an `eval` one). `val` is not among them: compare always measures it."""
    suite, needles = zero_shot_tasks(), task_names("niah")
    others = [t for t in task_names() if t not in ("val", *suite, *needles)]
    return {"paper": suite, "niah": needles, "all": [*suite, *needles, *others]}


def eval_settings(opts: CompareOptions) -> EvalSettings:
    """How every cell is evaluated (zero-shot tasks, their data, novelty text and tokens); the
    options' ranges are checked by `check_option_ranges`."""
    groups = compare_task_groups()
    tasks = parse_task_list(
        opts.eval_tasks, groups["all"], "--eval-tasks", skip=("none", "val"), groups=groups
    )
    return EvalSettings(
        val_tokens=opts.val_tokens or None,
        eval_tasks=tasks,
        eval_limit=opts.eval_limit or None,
        eval_data=_eval_data(opts, tasks),
        niah_lengths=list(opts.eval_niah_lengths) or None,
        # in the cache key: cells evaluated on another prose (WikiText before) are re-evaluated
        niah_haystack=DEFAULT_HAYSTACK if any(needs_haystack(t) for t in tasks) else None,
        novelty_tokens=opts.novelty_tokens,
        novelty_text=_novelty_text(opts),
    )


def _eval_data(opts: CompareOptions, tasks: list[str]) -> str | None:
    """The folder of the zero-shot tasks' files (the NIAH tasks need none: their prose ships
    with Python)."""
    if not [t for t in tasks if t not in NIAH_TASKS]:
        return None
    eval_data = opts.eval_data or eval_data_dir()
    if eval_data is None or not Path(eval_data).is_dir():
        raise DataError(
            f"--eval-tasks {','.join(tasks)} needs the evaluation files: pass --eval-data DIR "
            "(laid out like ../shared/data) or set TAPERLM_EVAL_DATA, or use --eval-tasks none"
        )
    return str(Path(eval_data).resolve())


def _novelty_text(opts: CompareOptions) -> str | None:
    """--novelty-data, else WikiText-2's test split where it is, else None (the val split)."""
    if opts.novelty_data is not None:
        if not opts.novelty_data.is_file():
            raise DataError(
                f"--novelty-data {opts.novelty_data} is not a file; give a UTF-8 text file, or "
                "leave the option out to measure on WikiText-2's test split (or the val split)"
            )
        return str(opts.novelty_data.resolve())
    try:
        return str(wikitext_test())
    except DataError:
        return None  # fall back to the val split


def check_niah_lengths(settings: EvalSettings, context: int) -> None:
    """Refuse before training when every NIAH length would be skipped (longer than the cells'
    context); longer lengths among shorter ones are skipped per cell, with the reason."""
    lengths = settings.niah_lengths
    if lengths and any(t in NIAH_TASKS for t in settings.eval_tasks) and min(lengths) > context:
        raise ConfigError(
            f"--eval-niah-lengths {','.join(map(str, lengths))}: every length is longer than the "
            f"models' context_length {context}; give lengths <= {context}"
        )
