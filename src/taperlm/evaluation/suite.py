"""Run the paper's evaluation suite: per-task metrics and standard errors as lm-eval defines
them, the paper's table, and a JSON record of every number and setting.

Metrics (lm-eval 0.4.x):
- multiple choice: acc = mean[argmax_i ll_i == gold]; acc_norm = mean[argmax_i ll_i / len(choice_i)
  == gold] with len in characters of lm-eval's doc_to_choice string (no leading space). Ties go
  to the first choice (numpy argmax). stderr = sample std / sqrt(n) (lm-eval's mean_stderr).
- lambada_openai: acc = mean[greedy], perplexity = exp(-mean ll).
- wikitext: word_perplexity = exp(-sum ll / sum words), byte_perplexity = exp(-sum ll / sum bytes),
  bits_per_byte = -sum ll / sum bytes / ln 2 (words and bytes of the original page).
- val: exp(mean next-token loss) on non-overlapping windows of the run's validation shard.
- niah_single_1/2/3 (RULER S-NIAH, `taperlm.evaluation.niah`): per length, the mean of the
  per-item string-match scores (metric named by the length, as lm-eval names it), stderr =
  mean_stderr of the item scores (lm-eval reports none for these).
Perplexity standard errors use the delta method (lm-eval bootstraps perplexity and reports none
for the weighted ones): se(exp(-m)) = exp(-m) * se(m), with se of a ratio of sums estimated from
per-item residuals. Documented in docs/evaluation.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from taperlm.errors import ConfigError, DataError
from taperlm.evaluation import niah
from taperlm.evaluation.record import Column, Task
from taperlm.evaluation.registry import TASKS, TaskData, needs_haystack
from taperlm.evaluation.scoring import Scorer
from taperlm.models import generation
from taperlm.runtime.progress import progress_bar


@dataclass
class TaskResult:
    task: str
    metrics: dict[str, float]
    stderr: dict[str, float | None]
    n: int
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    per_item: list[dict[str, Any]] | None = None
    counts: dict[str, int] = field(default_factory=dict)  # items behind a metric, when not n

    def to_dict(self) -> dict[str, Any]:
        d = {
            "task": self.task,
            "metrics": self.metrics,
            "stderr": self.stderr,
            "n": self.n,
            **({"counts": self.counts} if self.counts else {}),
            "seconds": round(self.seconds, 3),
            "items_per_s": round(self.n / self.seconds, 2) if self.seconds > 0 else None,
            "settings": self.settings,
        }
        if self.per_item is not None:
            d["per_item"] = self.per_item
        return d


# ----------------------------------------------------------------------------------------------
# statistics


def parse_task_list(
    text: str | Sequence[str],
    choices: Sequence[str],
    option: str,
    skip: Sequence[str] = (),
    groups: dict[str, Sequence[str]] | None = None,
) -> list[str]:
    """Comma-separated task names (or the names of such a list, already split) -> the distinct
    names in order; a group name stands for its tasks (default groups: `paper` and `all` = every
    choice), names in `skip` are ignored; ConfigError (naming `option`) for unknown ones."""
    groups = {"paper": choices, "all": choices} if groups is None else groups
    out: list[str] = []
    for t in (x.strip() for x in (text.split(",") if isinstance(text, str) else text)):
        if not t or t in skip:
            continue
        for name in groups.get(t, [t]):
            if name not in choices:
                raise ConfigError(
                    f"{option}: unknown task {name!r}; choose from {', '.join(choices)}"
                )
            if name not in out:
                out.append(name)
    return out


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def mean_stderr(xs: Sequence[float]) -> float | None:
    """lm-eval's mean_stderr: sample standard deviation / sqrt(n)."""
    n = len(xs)
    if n < 2:
        return None
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)


def ratio_stderr(num: Sequence[float], den: Sequence[float]) -> float | None:
    """Delta-method standard error of sum(num) / sum(den) over items."""
    n = len(num)
    if n < 2:
        return None
    r = sum(num) / sum(den)
    resid = [a - r * b for a, b in zip(num, den)]
    return math.sqrt(sum(e * e for e in resid) / (n * (n - 1))) / mean(den)


def argmax(xs: Sequence[float]) -> int:
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


# ----------------------------------------------------------------------------------------------
# task runners


def run_task(scorer: Scorer, data: TaskData, keep_items: bool = False) -> TaskResult:
    """Score a zero-shot task's docs by its kind (rolling, loglikelihood, multiple_choice)."""
    t0 = time.perf_counter()
    score = {"rolling": _rolling, "loglikelihood": _lambada}.get(data.kind, _multiple_choice)
    res = score(scorer, data.name, data.items(), keep_items)
    res.seconds = time.perf_counter() - t0
    res.settings.update(
        {
            "max_length": scorer.max_length,
            "batch_size": scorer.batch_size,
            "source": data.source,
            "files": data.files,
            "num_fewshot": 0,
        }
    )
    return res


def _multiple_choice(scorer: Scorer, name: str, items: list, keep: bool) -> TaskResult:
    pairs, owner = [], []
    for k, it in enumerate(items):
        for ctx, cont in it.requests:
            pairs.append(scorer.encode_pair(ctx, cont))
            owner.append(k)
    lls = scorer.loglikelihood(pairs, desc=name)
    per: list[list[float]] = [[] for _ in items]
    for k, (ll, _) in zip(owner, lls):
        per[k].append(ll)
    acc, acc_norm, records = [], [], []
    for it, ll in zip(items, per):
        lengths = [float(len(c)) for c in it.choices]
        pred = argmax(ll)
        pred_norm = argmax([x / n for x, n in zip(ll, lengths)])
        acc.append(float(pred == it.gold))
        acc_norm.append(float(pred_norm == it.gold))
        if keep:
            records.append({"lls": ll, "gold": it.gold, "pred": pred, "pred_norm": pred_norm})
    return TaskResult(
        task=name,
        metrics={"acc": mean(acc), "acc_norm": mean(acc_norm)},
        stderr={"acc": mean_stderr(acc), "acc_norm": mean_stderr(acc_norm)},
        n=len(items),
        seconds=0.0,
        settings={"acc_norm": "ll / len(choice) in characters (lm-eval)", "requests": len(pairs)},
        per_item=records if keep else None,
    )


def _lambada(scorer: Scorer, name: str, items: list, keep: bool) -> TaskResult:
    pairs = [scorer.encode_pair(*it.requests[0]) for it in items]
    out = scorer.loglikelihood(pairs, desc=name)
    lls = [ll for ll, _ in out]
    acc = [float(g) for _, g in out]
    m = mean(lls)
    se_m = mean_stderr(lls)
    ppl = math.exp(-m)
    return TaskResult(
        task=name,
        metrics={"perplexity": ppl, "acc": mean(acc)},
        stderr={"perplexity": None if se_m is None else ppl * se_m, "acc": mean_stderr(acc)},
        n=len(items),
        seconds=0.0,
        settings={"acc": "greedy argmax reproduces every continuation token"},
        per_item=[{"ll": ll, "greedy": bool(g)} for ll, g in out] if keep else None,
    )


def _rolling(scorer: Scorer, name: str, items: list, keep: bool) -> TaskResult:
    token_lists = [scorer.tok.encode(it.text) for it in items]
    lls = scorer.loglikelihood_rolling(token_lists, desc=name)
    words = [float(it.words) for it in items]
    nbytes = [float(it.bytes) for it in items]
    per_word = sum(lls) / sum(words)
    per_byte = sum(lls) / sum(nbytes)
    se_w = ratio_stderr(lls, words)
    se_b = ratio_stderr(lls, nbytes)
    wppl, bppl = math.exp(-per_word), math.exp(-per_byte)
    return TaskResult(
        task=name,
        metrics={
            "word_perplexity": wppl,
            "byte_perplexity": bppl,
            "bits_per_byte": -per_byte / math.log(2),
        },
        stderr={
            "word_perplexity": None if se_w is None else wppl * se_w,
            "byte_perplexity": None if se_b is None else bppl * se_b,
            "bits_per_byte": None if se_b is None else se_b / math.log(2),
        },
        n=len(items),
        seconds=0.0,
        settings={
            "windows": "disjoint rolling windows of max_length, EOS prefix (lm-eval)",
            "tokens": sum(len(t) for t in token_lists),
            "words": int(sum(words)),
            "bytes": int(sum(nbytes)),
        },
        per_item=[{"ll": ll, "tokens": len(t)} for ll, t in zip(lls, token_lists)]
        if keep
        else None,
    )


def run_val(scorer: Scorer, tokens: Any, limit: int | None, source: str) -> TaskResult:
    """In-distribution validation perplexity on a token stream (the run's val shard)."""
    t0 = time.perf_counter()
    total, count, per = scorer.token_losses(tokens, desc="val", max_windows=limit)
    loss = total / count
    se = mean_stderr(per)
    ppl = math.exp(loss)
    return TaskResult(
        task="val",
        metrics={"loss": loss, "perplexity": ppl},
        stderr={"loss": se, "perplexity": None if se is None else ppl * se},
        n=len(per),
        seconds=time.perf_counter() - t0,
        settings={
            "max_length": scorer.max_length,
            "windows": "non-overlapping, each predicts max_length tokens",
            "tokens": count,
            "source": source,
        },
    )


# ----------------------------------------------------------------------------------------------
# long context: RULER single needle in a haystack


def niah_lengths(
    lengths: Sequence[int], context_length: int, extrapolate: bool
) -> tuple[list[int], dict[int, str]]:
    """(lengths to evaluate, {skipped length: reason}) for a model trained at `context_length`."""
    keep, skipped = [], {}
    for length in lengths:
        if length > context_length and not extrapolate:
            skipped[length] = (
                f"longer than the model's context_length {context_length}; pass "
                "--niah-extrapolate to evaluate beyond the trained context"
            )
        else:
            keep.append(length)
    return keep, skipped


def niah_generate(
    model: Any,
    codec: niah.TokenizerCodec,
    samples: Sequence[niah.Sample],
    batch_size: int = 8,
    device: str = "cpu",
    dtype: Any = None,
    progress: bool = True,
    desc: str = "niah",
) -> list[dict[str, Any]]:
    """Greedy answers (128 tokens at most, stop at EOS) and string-match scores of `samples`."""
    prompts = [codec.encode(s.prompt) for s in samples]
    bar = progress_bar(
        total=len(samples), desc=desc, unit="item", disable=not progress, leave=False
    )
    out = generation.greedy_batch(
        model,
        prompts,
        niah.MAX_NEW_TOKENS,
        eos_id=codec.eos_id,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        on_batch=bar.update,
    )
    bar.close()
    records = []
    for s, p, toks in zip(samples, prompts, out):
        pred = codec.prediction(toks)
        records.append(
            {
                "length": s.length,
                "index": s.index,
                "prompt_tokens": len(p),
                "answers": s.answers,
                "prediction": pred,
                "score": niah.string_match_all(pred, s.answers),
            }
        )
    return records


def _generated_lengths(lengths: Sequence[int], evaluate: Sequence[int]) -> list[int]:
    """The lengths whose items are drawn: every one in order up to the last evaluated (one
    stream through them all, as lm-eval draws)."""
    return list(lengths)[: max(i for i, n in enumerate(lengths) if n in evaluate) + 1]


def check_niah_inputs(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[str],
    lengths: Sequence[int],
    haystack: niah.Haystack | None,
    extrapolate: bool = False,
) -> None:
    """Everything the S-NIAH `tasks` need, checked before any item runs: a length the model
    takes, RULER's key words, a tokenizer, and prose that fills the longest length."""
    evaluate, _ = niah_lengths(lengths, model.config.context_length, extrapolate)
    if not evaluate:
        raise ConfigError(
            f"every --niah-lengths value ({', '.join(map(str, lengths))}) is longer than the "
            f"model's context_length {model.config.context_length}; give shorter lengths or "
            "pass --niah-extrapolate"
        )
    niah.key_words()
    codec = niah.TokenizerCodec(tokenizer)
    if any(needs_haystack(t) for t in tasks):
        if haystack is None:
            raise DataError("niah_single_2/3 hide their needle in prose: give a haystack")
        longest = max(_generated_lengths(lengths, evaluate))
        niah.check_haystack(haystack, lambda text: len(codec.encode(text)), longest)


def run_niah(
    model: Any,
    tokenizer: Any,
    task: str,
    lengths: Sequence[int],
    *,
    haystack: niah.Haystack | None = None,
    limit: int | None = None,
    extrapolate: bool = False,
    batch_size: int = 8,
    device: str = "cpu",
    dtype: Any = None,
    seed: int = 0,
    keep_items: bool = False,
    progress: bool = True,
) -> TaskResult:
    """One S-NIAH task at every length the model's context allows (or all, extrapolating)."""
    t_all = time.perf_counter()
    evaluate, skipped = niah_lengths(lengths, model.config.context_length, extrapolate)
    if not evaluate:
        raise ConfigError(
            f"{task}: every --niah-lengths value ({', '.join(map(str, lengths))}) is longer than "
            f"the model's context_length {model.config.context_length}; give shorter lengths or "
            "pass --niah-extrapolate"
        )
    codec = niah.TokenizerCodec(tokenizer)
    gen = niah.Generator(task, lambda text: len(codec.encode(text)), haystack, seed=seed)
    # One stream through the lengths in order (lm-eval's items), up to the last one evaluated.
    wanted = _generated_lengths(lengths, evaluate)
    t0 = time.perf_counter()
    data = gen.lengths(wanted, limit)
    data_seconds = time.perf_counter() - t0
    metrics, stderr, counts, per_length, items, notes = {}, {}, {}, {}, [], []
    for length in evaluate:
        d = data[length]
        t0 = time.perf_counter()
        records = niah_generate(
            model, codec, d.samples, batch_size, device, dtype, progress, f"{task}@{length}"
        )
        seconds = time.perf_counter() - t0
        scores = [r["score"] for r in records]
        key = str(length)
        metrics[key], stderr[key], counts[key] = mean(scores), mean_stderr(scores), len(scores)
        per_length[key] = _length_settings(d, records, seconds)
        if niah.SPECS[task].haystack == "essay" and d.haystack_units < 500:
            notes.append(
                f"{task} @ {length}: RULER adds prose in steps of 500 words, and not one step "
                f"fits {length} tokens with this tokenizer, so the haystack is "
                f"{d.haystack_units} word(s); use longer lengths for a real haystack"
            )
        if keep_items:
            items.extend(records)
    spec = niah.SPECS[task]
    return TaskResult(
        task=task,
        metrics=metrics,
        stderr=stderr,
        n=sum(counts.values()),
        seconds=time.perf_counter() - t_all,
        counts=counts,
        settings={
            "lengths": per_length,
            "skipped_lengths": {str(k): v for k, v in skipped.items()},
            "notes": notes,
            "haystack": haystack.source if spec.haystack == "essay" and haystack else "repeat",
            "seed": seed,
            "items_per_length": f"first {limit} of {niah.NUM_SAMPLES}" if limit else "all",
            "max_new_tokens": niah.MAX_NEW_TOKENS,
            "decoding": "greedy, batched by prompt length, "
            + ("decoding cache" if _has_cache(model) else "prefix recomputed each step (no cache)"),
            "batch_size": batch_size,
            "data_seconds": round(data_seconds, 3),
            "score": "string_match_all: fraction of answers in the generation (case-insensitive)",
        },
        per_item=items if keep_items else None,
    )


def _length_settings(
    d: niah.LengthData, records: list[dict[str, Any]], seconds: float
) -> dict[str, Any]:
    """What one NIAH length's items were: counts, haystack size, prompt tokens, speed."""
    tokens = [r["prompt_tokens"] for r in records]
    return {
        "n": len(records),
        "skipped_items": d.skipped,
        "haystack_units": d.haystack_units,
        "prompt_tokens": {"min": min(tokens), "mean": mean(tokens), "max": max(tokens)},
        "seconds": round(seconds, 3),
        "items_per_s": round(len(records) / seconds, 3) if seconds > 0 else None,
    }


def _has_cache(model: Any) -> bool:
    return generation.new_cache_or_none(model) is not None


# ----------------------------------------------------------------------------------------------
# reporting


def paper_columns() -> list[tuple[Task, Column]]:
    """(task, column) of the paper's table before Avg: the registered tasks' columns in order
    (the NIAH columns, one per length, follow Avg)."""
    return [(t, c) for t in TASKS.values() if t.kind != "niah" for c in t.columns]


def paper_row(results: dict[str, TaskResult]) -> dict[str, float | None]:
    row: dict[str, float | None] = {}
    columns = paper_columns()
    for task, col in columns:
        r = results.get(task.name)
        row[col.label] = None if r is None else r.metrics[col.metric] * col.scale
    accs = [row[col.label] for _, col in columns if col.average]
    row["Avg"] = None if any(a is None for a in accs) else mean(accs)  # type: ignore[arg-type]
    for task in TASKS.values():
        if task.kind == "niah" and task.name in results:
            for col in task.columns:
                for length, value in results[task.name].metrics.items():
                    row[f"{col.label} {niah.length_label(int(length))}"] = value * col.scale
    return row


def no_skill_accuracy(data: TaskData) -> float | None:
    """The accuracy (0-1) a model without any skill reaches on these items: the larger of
    random guessing (mean of 1/choices) and always giving the most frequent gold position
    (BoolQ's "yes" is 62%). None for tasks without choices (LAMBADA, WikiText)."""
    if data.kind != "multiple_choice":
        return None
    items = data.items()
    if not items:
        return None
    guess = mean([1.0 / len(it.requests) for it in items])
    counts: dict[int, int] = {}
    for it in items:
        counts[it.gold] = counts.get(it.gold, 0) + 1
    return max(guess, max(counts.values()) / len(items))


def chance_columns(chance: dict[str, float | None]) -> dict[str, float]:
    """Task -> no-skill accuracy (0-1) as paper-table column -> percent, for the accuracy
    columns whose task has one (`paper_columns`)."""
    out = {}
    for task, col in paper_columns():
        c = chance.get(task.name)
        if c is not None and col.metric in ("acc", "acc_norm"):
            out[col.label] = c * col.scale
    return out


def at_chance(accuracy: float, chance: float, n: int, z: float = 1.96) -> bool:
    """Whether an accuracy (percent) on n items is not significantly above the no-skill
    accuracy `chance` (percent): at most its upper 95% binomial bound, i.e. indistinguishable
    from guessing (or below it)."""
    p = chance / 100.0
    return accuracy <= 100.0 * (p + z * math.sqrt(p * (1.0 - p) / max(n, 1)))


def format_table(results: dict[str, TaskResult], label: str = "model") -> str:
    """The paper's table (markdown), plus val ppl and per-task wall time beneath it."""
    row = paper_row(results)
    cols = list(row)
    head = "| " + " | ".join(["model", *cols]) + " |"
    sep = "|" + "---|" * (len(cols) + 1)
    cells = ["-" if row[c] is None else f"{row[c]:.2f}" for c in cols]
    lines = [head, sep, "| " + " | ".join([label, *cells]) + " |"]
    if "val" in results:
        v = results["val"]
        lines.append(
            f"\nval ppl {v.metrics['perplexity']:.3f} (loss {v.metrics['loss']:.4f}, "
            f"{v.settings['tokens']} tokens)"
        )
    lines.append("")
    lines.append("| task | n | metric | value | stderr | seconds | items/s |")
    lines.append("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        for k, v in r.metrics.items():
            se = r.stderr.get(k)
            n, seconds, fmt = r.counts.get(k, r.n), r.seconds, ".1f"
            if k in r.counts:  # NIAH: one row per length, with its own time (slow: 2 decimals)
                seconds, fmt = r.settings["lengths"][k]["seconds"], ".2f"
            ips = n / seconds if seconds > 0 else float("nan")
            lines.append(
                f"| {name} | {n} | {k} | {v:.4f} | {'-' if se is None else f'{se:.4f}'} | "
                f"{seconds:.1f} | {ips:{fmt}} |"
            )
    return "\n".join(lines)


def results_json(results: dict[str, TaskResult], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "meta": meta,
        "paper_table": paper_row(results),
        "tasks": {k: v.to_dict() for k, v in results.items()},
    }
