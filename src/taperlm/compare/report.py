"""A comparison's report, rendered from its typed results (`taperlm.compare.results`): report.md
and its figures; `write_report` writes report.json, report.md and the PNGs of one comparison.

report.md: the header, the validation table with paired differences (a CI that excludes 0 is
marked `*`), zero-shot and novelty sections, the paper comparison, the difference against tokens
with its crossing (`crossing_section`), the sequential stop (`stopping_section`, `why`) and
--tune-lr's "Learning rate tuning" section (`tuning_section`).

The PNGs (`write_plots`): width (and head) profiles, validation-loss curves, the paired loss
difference vs uniform during training and its crossing (`crossing_plot`), novelty per layer
(averaged over seeds), the sequential stop's confidence sequence (`with_stopping_plot`) and
--tune-lr's loss against lr (`with_tuning_plot`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from taperlm.analysis import plots as analysis_plots
from taperlm.analysis import stats
from taperlm.analysis.novelty import NoveltyResult, TokenStats
from taperlm.analysis.plots import _figure, _save, plot_interval_series
from taperlm.analysis.stats import PairedDifference, Summary, relative_ppl_change
from taperlm.analysis.stats import relative_ppl_change as relative_change
from taperlm.compare.grid import Grid
from taperlm.compare.options import paper_mode
from taperlm.compare.results import (
    AllocationCurve,
    AllocationSummary,
    CellResult,
    ComparisonReport,
    ComparisonSummary,
    DeltaAt,
    Execution,
    ExecutionSetting,
    LossVsTokens,
    LrCurve,
    LrTuning,
    PaperComparison,
    PilotSummary,
    ReportMeta,
    Results,
    SettingsMeta,
    Stopping,
    ZeroShotColumn,
)
from taperlm.compare.statistics import (
    BELOW_AT_END,
    BOOTSTRAP_RESAMPLES,
    CROSSED,
    REPORT_KEY,
    TOO_SHORT,
    loss_vs_tokens,
    summarize,
)
from taperlm.config import to_dict
from taperlm.files.io import (
    atomic_write_text,
)
from taperlm.spec.taper import TaperSpec

if TYPE_CHECKING:
    pass


def fmt_signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


TABLE_POINTS = 6  # rows of report.md's table: evaluations spread evenly in log tokens


# ----------------------------------------------------------------------------------------------
# report.md and the PNG


def fmt_tokens(tokens: float) -> str:
    """1,234,567 -> 1.23M (tables and lines)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if tokens >= scale:
            return f"{tokens / scale:.3g}{unit}"
    return f"{tokens:.0f}"


def crossing_text(curve: AllocationCurve, params: int) -> str:
    """One sentence: where the advantage ends (with its interval), or why nothing crosses."""
    c, iv = curve.crossing, curve.interval
    if c.kind == TOO_SHORT:
        return "fewer than 2 evaluations shared by every seed: no curve to read"
    end = curve.points[-1]
    if c.kind == CROSSED:
        assert c.tokens is not None
        text = (
            f"the mean difference crosses zero at **{fmt_tokens(c.tokens)} tokens = "
            f"{c.tokens / params:.2f} tokens/param** and stays at or above it to the end "
            f"({fmt_tokens(end.tokens)} = {end.tokens_per_param:.2f} tokens/param)"
        )
        if c.recrossed:
            text += "; it had been at or above zero before and dipped below again"
    elif c.kind == BELOW_AT_END:
        text = (
            "no crossing within the run: the mean difference is below zero at the end "
            f"({end.mean:+.4f} at {end.tokens_per_param:.2f} tokens/param), the taper still ahead"
        )
    else:
        text = (
            "no crossing within the run: the mean difference is at or above zero at every "
            "evaluation, the taper never ahead"
        )
    if iv is None:
        return text + " (one seed: no interval)"
    share = f"{100 * iv.share_not_crossing:.1f}%"
    detail = f"below zero at the end in {iv.below_at_end}, never below in {iv.never_below}"
    if not iv.share_not_crossing:
        detail = "every resample crosses"
    if iv.tokens is None:
        return text + f"; no bootstrap resample of the seeds crosses ({detail})"
    lo, hi = iv.tokens
    return text + (
        f"; 95% bootstrap interval over seeds {lo / params:.2f}–{hi / params:.2f} tokens/param "
        f"({fmt_tokens(lo)}–{fmt_tokens(hi)} tokens); {share} of {iv.resamples:,} resamples "
        f"without a crossing ({detail})"
    )


def table_rows(curve: AllocationCurve, k: int = TABLE_POINTS) -> list[DeltaAt]:
    """`k` evaluations spread evenly in log tokens, the first and the last among them."""
    pts = curve.points
    if len(pts) <= k:
        return list(pts)
    logs = np.log([p.tokens for p in pts])
    targets = np.linspace(logs[0], logs[-1], k)
    picked = sorted({int(np.argmin(np.abs(logs - x))) for x in targets})
    return [pts[i] for i in picked]


def _ci_text(p: DeltaAt) -> str:
    if p.ci is None:
        return f"{p.mean:+.4f}"
    return f"{p.mean:+.4f} [{p.ci[0]:+.4f}, {p.ci[1]:+.4f}]"


def crossing_section(data: LossVsTokens) -> list[str]:
    """report.md's section: per tapered allocation a table at a few evaluations and the
    crossing line."""
    if not data.allocations:
        return []
    evals = "" if data.eval_tokens is None else f" (each on {data.eval_tokens:,} val tokens)"
    lines = [
        "## Difference against tokens seen",
        "",
        f"The paired difference tapered − uniform at the evaluations during training{evals}, "
        "mean over seeds with its 95% Student-t interval; the crossing is where the mean "
        "difference last goes from below zero to at or above it and stays there (interpolated "
        f"in log tokens), its interval the 2.5–97.5 percentiles over {BOOTSTRAP_RESAMPLES:,} "
        "bootstrap resamples of the seeds. Points before the end are of runs whose lr has not "
        "decayed yet, so the crossing is not the budget at which a run trained to that length "
        f"stops favouring the taper. Every evaluation is in report.json (`{REPORT_KEY}`) and "
        f"drawn in {CROSSING_PLOT}.",
        "",
    ]
    for a in data.allocations:
        lines += [f"**{a.label}** ({len(a.seeds)} seeds): {crossing_text(a, data.params)}.", ""]
        rows = [
            [f"{p.tokens:,}", f"{p.tokens_per_param:.2f}", _ci_text(p), _better(p)]
            for p in table_rows(a)
        ]
        if rows:
            lines += md_table(
                ["tokens", "tokens/param", "Δ loss, nats [95% CI]", "seeds taper better"], rows
            )
            lines.append("")
    return lines


def _better(p: DeltaAt) -> str:
    return f"{sum(d < 0 for d in p.per_seed)}/{p.n}"


def headline(
    data: LossVsTokens,
    final: Mapping[str, stats.PairedDifference | None],
    settled: Mapping[str, str] | None = None,
) -> list[str]:
    """report.md's first section: per tapered allocation the verdict at the end of the run
    (`final`: allocation name -> its `paired_difference` of the final validation loss, the
    table's) and where its advantage ends. `settled`: allocation label -> a verdict the stop
    rule reached (`Stopping.settled_verdicts`: "no practical difference"), said instead."""
    if not data.allocations:
        return []
    lines = ["## Verdict", ""]
    for a in data.allocations:
        d = final.get(a.name)
        end = a.points[-1] if a.points else None
        at = (
            ""
            if end is None
            else f" at {end.tokens:,} tokens ({end.tokens_per_param:.2f} tokens/param)"
        )
        if d is None or d.mean is None:
            verdict = "no finished pair of runs yet"
        elif settled and a.label in settled:
            verdict = settled[a.label]
        else:
            verdict = _verdict(d)
        lines.append(
            f"- **{a.label} vs uniform{at}: {verdict}.** {_cap(crossing_text(a, data.params))}."
        )
    lines.append("")
    return lines


def _verdict(d: stats.PairedDifference) -> str:
    m, ci = d.mean, d.ci
    assert m is not None  # headline() reports a missing mean before asking for a verdict
    better = sum(x < 0 for x in d.per_seed)
    seeds = f", taper better in {better} of {d.n} seeds"
    if ci is None:
        return f"Δ {m:+.4f} nats (one seed, no interval)"
    span = f"Δ {m:+.4f} nats [{ci[0]:+.4f}, {ci[1]:+.4f}]{seeds}"
    if ci[1] < 0:
        return f"the taper is better, {span}"
    if ci[0] > 0:
        return f"the taper is WORSE than uniform, {span}"
    return f"no difference decided, {span}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def why(stopping: Stopping) -> str:
    """One sentence: when and why the comparison stopped."""
    n, cap, pct = stopping.stopped_at, stopping.cap, f"{100 * stopping.confidence:g}%"
    reason = stopping.reason
    if reason == "decided":
        return (
            f"stopped after {n} of at most {cap} seeds: every comparison's {pct} anytime-valid "
            "interval excludes 0 (--stop decided)"
        )
    if reason == "equivalent":
        return (
            f"stopped after {n} of at most {cap} seeds: every comparison's {pct} anytime-valid "
            f"interval lies within ±{stopping.margin:g} nats: no practical difference "
            f"(--stop {stopping.rule})"
        )
    if reason == "decided+equivalent":
        return (
            f"stopped after {n} of at most {cap} seeds: every comparison's {pct} anytime-valid "
            f"interval excludes 0 or lies within ±{stopping.margin:g} nats (--stop "
            f"{stopping.rule})"
        )
    if reason == "half-width":
        return (
            f"stopped after {n} of at most {cap} seeds: every comparison's {pct} anytime-valid "
            f"interval is within ±{stopping.rule.split(':')[1]} nats (--stop {stopping.rule})"
        )
    if stopping.rule == "fixed":
        return f"ran all {cap} seeds (--stop fixed: the fixed design)"
    return (
        f"ran all {cap} seeds (the cap, --seeds) without the rule --stop {stopping.rule} being met"
    )


def stopping_section(stopping: Stopping) -> list[str]:
    """report.md's "When it stopped" section."""
    pct = f"{100 * stopping.confidence:g}%"
    labels: list[str] = []
    for step in stopping.sequence:
        labels += [k for k in step.comparisons if k not in labels]
    head = ["seeds", *(f"{k}: Δ nats [{pct} anytime]" for k in labels)]
    rows = []
    for step in stopping.sequence:
        cells = [str(step.n) + (" (stop)" if step.stops else "")]
        for k in labels:
            e = step.comparisons.get(k)
            if e is None:
                cells.append("")
            elif not math.isfinite(e.half):
                cells.append(f"{e.mean:+.4f} (unbounded)")
            else:
                mark = (" *" if e.excludes_zero else "") + (" ≈" if e.within_margin else "")
                cells.append(f"{e.mean:+.4f} [{e.ci[0]:+.4f}, {e.ci[1]:+.4f}]{mark}")
        rows.append(cells)
    lines = [
        "## When it stopped",
        "",
        f"The comparison {why(stopping)}.",
        "",
        f"Rule `--stop {stopping.rule}`, error rate {stopping.alpha:g} per comparison, "
        f"at least {stopping.min_seeds} seeds, at most {stopping.cap} (`--seeds`), "
        f"question `--stop-on {stopping.stop_on}`. Seeds are added in order and the decision "
        "at n uses seeds 0..n-1 only, so the stop is the same on any number of workers; cells "
        "of later seeds that were already running may be in runs/ (checkpointed or done) but "
        f"are not part of this report. The interval is the {pct} {stopping.construction}: it holds at every "
        "n at once, so stopping on it keeps its level. The Student-t intervals of the tables "
        "above are the fixed-n ones at the n it stopped at, shown for comparison with fixed "
        "designs; after a data-dependent stop only the anytime-valid interval keeps its level.",
        "",
        *md_table(head, rows),
        "",
        "`*`: the interval excludes 0."
        + (
            f" `≈`: it lies within ±{stopping.margin:g} nats (no practical difference)."
            if stopping.margin is not None
            else ""
        ),
        "",
    ]
    if stopping.plot:
        lines += [f"![the interval as seeds are added]({stopping.plot})", ""]
    return lines


def mean_pm(s: Summary, fmt: str) -> str:
    if s.mean is None:
        return "–"
    if s.std is None:
        return format(s.mean, fmt)
    return f"{format(s.mean, fmt)} ± {format(s.std, fmt.lstrip('+'))}"


def diff_ci(d: PairedDifference | None, fmt: str) -> str:
    if d is None:
        return "(baseline)"
    if d.mean is None:
        return "–"
    m = format(d.mean, "+" + fmt)
    if d.ci is None:
        return f"{m} (n=1, no CI)"
    lo, hi = (format(x, "+" + fmt) for x in d.ci)
    return f"{m} [{lo}, {hi}]" + (" *" if d.excludes_zero else "")


def md_table(head: Sequence[str], rows: list[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_markdown(
    summary: ComparisonSummary,
    meta: ReportMeta,
    extra: Sequence[str] = (),
    lead: Sequence[str] = (),
) -> str:
    """report.md: how it was produced, `lead` (the verdict), validation with paired
    differences, the paper, zero-shot, novelty, plots and per-seed losses."""
    allocs = summary.allocations
    s = meta.settings
    lines = _header(summary, meta)
    lines += list(lead)
    lines += _validation_section(summary)
    lines += list(extra)  # e.g. --tune-lr's section
    if summary.paper_comparison:
        lines += _paper_section(summary.paper_comparison, allocs)
    lines += _zero_shot_section(allocs, s)
    lines += _novelty_section(allocs, s)
    lines += _plots_section(meta.plots or {}, s)
    lines += _per_seed_section(allocs, s.seeds)
    lines += [
        "",
        "Every number above (and per-seed values, curves, timings) is in `report.json`; each run "
        "is in `runs/<allocation>-s<seed>/` (config.yaml, metrics.jsonl, result.json).",
        "",
    ]
    return "\n".join(lines)


def produced_by(command: str) -> list[str]:
    """The report lines that name the command reproducing it."""
    return ["Produced by:", "", "```", command, "```", ""]


def _header(summary: ComparisonSummary, meta: ReportMeta) -> list[str]:
    s, m = meta.settings, meta.model
    return [
        f"# taperlm compare — {meta.title}",
        "",
        *produced_by(meta.command),
        f"- model: {m.family}, {m.n_layers} layers, d_model {m.d_model}, "
        f"{m.n_heads} heads, baseline MLP width {m.mlp_width}, vocab {m.vocab_size}",
        f"- training per run: {s.tokens:,} tokens ({s.steps} steps of "
        f"{s.batch_tokens:,} tokens, seq_len {s.seq_len}), peak lr {s.lr:g}, "
        f"warmup {s.warmup_tokens:,} tokens; seeds {s.seeds}",
        f"- data: `{s.data_dir}` (train {s.train_tokens:,} tokens); validation on the "
        f"first {s.val_tokens:,} tokens of its val split (the same for every run)",
        f"- {len(summary.allocations)} allocations x {len(s.seeds)} seeds = "
        f"{meta.cells} runs; wall time {meta.wall_s / 60:.1f} min this invocation, "
        f"{(meta.cpu_s or 0) / 60:.1f} CPU-min; {meta.created}",
        *_execution_lines(summary.execution),
        f"- summed over the runs (when each was trained/evaluated): training "
        f"{summary.run_times['train_s'] / 60:.1f} min, validation + zero-shot + novelty "
        f"{sum(v for k, v in summary.run_times.items() if k != 'train_s') / 60:.1f} min",
        "",
    ]


def _execution_lines(ex: Execution) -> list[str]:
    """How the cells ran (from each cell's sessions.jsonl), and what that means for a rerun."""

    def combo(e: ExecutionSetting) -> str:
        return (
            f"{e.threads} torch thread(s) per cell, torch {e.torch}, CPU "
            f"{e.cpu_capability}, device {e.device}"
        )

    at_a_time = "/".join(str(j) for j in ex.jobs) or "?"
    if not ex.settings:
        return []
    if ex.consistent:
        e = ex.settings[0]
        line = f"- computed with {combo(e)} (every cell), {at_a_time} cell(s) at a time"
        if e.threads == 1:
            line += (
                "; a rerun with the same torch and CPU capability gives bit-identical numbers, "
                "whatever --jobs and the machine's load"
            )
        return [line]
    lines = ["- **computed with different settings** (numbers may differ from a rerun in the "
             "last bits):"]  # fmt: skip
    for e in ex.settings:
        cells = ", ".join(e.cells[:6]) + (f" (+{len(e.cells) - 6})" if len(e.cells) > 6 else "")
        lines.append(f"  - {combo(e)}: {e.train_steps} training steps; cells {cells}")
    return lines


def _validation_section(summary: ComparisonSummary) -> list[str]:
    head, rows = _validation_table(summary)
    ck = summary.checks
    return [
        "## Validation",
        "",
        *md_table(head, rows),
        "",
        "Mean ± sample std over seeds. Δ = allocation − uniform of the same seed (same data "
        "order, same init seed), mean over seeds with the 95% Student-t interval "
        "mean ± t(0.975, n−1)·sd/√n; `*` = the interval excludes 0. Lower is better.",
        f"Checks: equal params {yes_no(ck.equal_params)}, equal FLOPs/token "
        f"{yes_no(ck.equal_flops_per_token)}, same data order within each seed "
        f"{yes_no(ck.same_data_order_within_seed)}, different across seeds "
        f"{yes_no(ck.distinct_data_order_across_seeds)}, init seed = seed "
        f"{yes_no(ck.init_seed_equals_seed)}.",
        "",
        *(line for note in _validation_notes(summary) for line in (note, "")),
    ]


def _validation_table(summary: ComparisonSummary) -> tuple[list[str], list[list[str]]]:
    """The validation table's header and one row per allocation."""
    allocs = summary.allocations
    show_paper = any(a.paper_ppl is not None for a in allocs)
    pilot = summary.pilot
    head = [
        "allocation",
        "taper",
        "params",
        "FLOPs/token",
        "tokens/s",
        "val loss",
        "val ppl",
        "Δ loss vs uniform, nats [95% CI]",
        "Δ ppl vs uniform, ppl points [95% CI]",
        "n",
    ]
    if show_paper:
        head.append("paper ppl (440M)")
    if pilot:
        head.append("extra cost")
    rows = []
    for a in allocs:
        d = a.diff_vs_uniform
        row = [
            a.label,
            f"`{a.taper}`",
            f"{a.params:,}",
            f"{a.flops_per_token:,}",
            mean_pm(a.tokens_per_s, ",.0f"),
            mean_pm(a.val_loss, ".4f"),
            mean_pm(a.val_ppl, ".2f"),
            diff_ci(d and d.val_loss, ".4f"),
            diff_ci(d and d.val_ppl, ".2f"),
            str(a.val_loss.n),
        ]
        if show_paper:
            row.append("–" if a.paper_ppl is None else f"{a.paper_ppl:.2f}")
        if pilot:
            row.append(_pilot_cost(pilot) if a.pilot else "–")
        rows.append(row)
    return head, rows


def _validation_notes(summary: ComparisonSummary) -> list[str]:
    """Notes under the validation table: pilots, tapered query heads, tapered KV heads."""
    allocs = summary.allocations
    pilot = summary.pilot
    notes = []
    if pilot:
        notes.append(
            "novelty:pilot widths come from each seed's own pilot (a uniform run of "
            f"{pilot.tokens:,} tokens with the same seed, `runs/pilot-s<seed>`); the extra "
            "cost is that pilot's training and novelty time per seed, on top of the run itself. "
            "Its widths per seed are in report.json (`widths_by_seed`)."
        )
    if any(a.heads and len(set(a.heads)) > 1 for a in allocs):
        notes.append(
            "Query heads per layer: "
            + "; ".join(
                f"{a.label} {'/'.join(map(str, a.heads))}"
                for a in allocs
                if a.heads and len(set(a.heads)) > 1
            )
            + f" (uniform: {allocs[0].baseline_heads} in every layer); KV heads follow "
            "the query heads at the model's group size, the head dim is fixed."
        )
    kv_uniform = allocs[0].kv_cache_bytes_per_token_bf16
    if any(a.kv_cache_bytes_per_token_bf16 != kv_uniform for a in allocs):
        notes.append(
            "KV heads per layer (KV-cache bytes per token, bf16): "
            + "; ".join(
                f"{a.label} {'/'.join(map(str, a.kv_heads or []))} "
                f"({a.kv_cache_bytes_per_token_bf16:,} B)"
                for a in allocs
            )
            + "; a KV taper's saved K/V parameters went to the MLP widths (equal parameters)."
        )
    return notes


def _pilot_cost(p: PilotSummary) -> str:
    train, nov = p.train_s.mean, p.novelty_s.mean
    secs = "" if train is None else f", {train + (nov or 0):.1f} s"
    return f"pilot {p.tokens:,} tok/seed ({100 * p.fraction_of_run:.0f}% of a run{secs})"


def _zero_shot_section(allocs: list[AllocationSummary], s: SettingsMeta) -> list[str]:
    zs = [a for a in allocs if a.zero_shot]
    if not zs:
        return []
    cols = [c for c in zs[0].zero_shot if c]
    return [
        "## Zero-shot",
        "",
        f"Tasks {', '.join(s.eval_tasks)}, first {s.eval_limit or 'all'} items each "
        f"(accuracies in %, mean ± std over seeds). {CHANCE_NOTE}",
        "",
        *md_table(
            ["allocation", *cols],
            [[a.label, *(zero_shot_cell(a.zero_shot.get(c)) for c in cols)] for a in zs],
        ),
        "",
    ]


CHANCE_NOTE = (
    "† = at chance level: not significantly above the accuracy without skill (random guessing, "
    "or always the most frequent answer), at most its upper 95% binomial bound for the items "
    "scored."
)


def zero_shot_cell(entry: ZeroShotColumn | None) -> str:
    """One zero-shot column of one allocation: mean ± std, † when at chance level."""
    if entry is None:
        return "–"
    return mean_pm(entry, ".2f") + (" †" if entry.at_chance else "")


def _novelty_section(allocs: list[AllocationSummary], s: SettingsMeta) -> list[str]:
    rows = []
    for a in allocs:
        pl = a.novelty.rho_mlp_per_layer
        rows.append(
            [
                a.label,
                mean_pm(a.novelty.pearson_mlp, "+.2f"),
                mean_pm(a.novelty.pearson_block, "+.2f"),
                " ".join("–" if v is None else f"{v:+.2f}" for v in pl),
            ]
        )
    return [
        "## Novelty",
        "",
        f"rho_mlp(l) = cos(F_l(z_l), h_l) and rho_block(l) = cos(h_(l+1) − h_l, h_l) per token, "
        f"averaged over {allocs[0].novelty.tokens} tokens of {s.novelty_text}; r = "
        "each seed's Pearson correlation of its per-layer means with depth, then mean ± std "
        "over seeds (the same statistic as in novelty.png's legend). rho_mlp per layer: the "
        "per-layer means averaged over seeds (novelty.png's lines; its bands are ±1 std over "
        "seeds). The paper measured r(rho_mlp) = 0.49–0.71 on GPT-2.",
        "",
        *md_table(
            [
                "allocation",
                "r(rho_mlp, depth), mean ± std over seeds",
                "r(rho_block, depth), mean ± std over seeds",
                "rho_mlp per layer, mean over seeds",
            ],
            rows,
        ),
    ]


def _plots_section(plots: dict[str, str], s: SettingsMeta) -> list[str]:
    evals = f"{s.eval_tokens:,} val tokens per point, not the table's {s.val_tokens:,}"
    captions = {
        "widths": "MLP width per layer (uniform baseline dashed)",
        "val_loss": f"validation loss during training, mean ± 1 std over seeds ({evals})",
        "val_loss_diff": f"paired validation-loss difference vs uniform during training ({evals})",
        "novelty": "rho_mlp and rho_block per layer, means over seeds ± 1 std over seeds",
        "paper": "perplexity change vs uniform beside the paper's",
        "sweep": "the sweep: perplexity change vs start ratio per schedule, beside the paper's",
        "kv_pareto": "paired validation-loss difference vs uniform against KV-cache bytes per token",
        REPORT_KEY: "paired difference vs uniform against tokens per parameter, with the crossing",
    }
    lines = ["", "## Plots", ""]
    lines += [f"- [{captions[key]}]({file})" for key, file in plots.items()]
    lines += ["", f"![widths]({PLOTS['widths']})"]
    if REPORT_KEY in plots:
        lines.append(f"![difference against tokens]({plots[REPORT_KEY]})")
    if "val_loss_diff" in plots:
        lines.append(f"![val loss difference]({PLOTS['val_loss_diff']})")
    if "paper" in plots:
        lines.append(f"![against the paper]({PLOTS['paper']})")
    if "sweep" in plots:
        lines.append(f"![the sweep]({PLOTS['sweep']})")
    if "kv_pareto" in plots:
        lines.append(f"![loss vs KV cache]({PLOTS['kv_pareto']})")
    return lines


def _per_seed_section(allocs: list[AllocationSummary], seeds: list[int]) -> list[str]:
    def cell(a: AllocationSummary, seed: int) -> str:
        run = a.per_seed.get(str(seed))
        return "–" if run is None else f"{run.val_loss:.4f}"

    return [
        "",
        "## Per-seed validation loss",
        "",
        *md_table(
            ["allocation", *(f"seed {x}" for x in seeds)],
            [[a.label, *(cell(a, x) for x in seeds)] for a in allocs],
        ),
    ]


def yes_no(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def _paper_section(pc: PaperComparison, allocs: list[AllocationSummary]) -> list[str]:
    label = {a.name: a.label for a in allocs}
    pw = pc.pairwise
    order_ours = sorted(pc.allocations, key=lambda n: pc.ours_val_ppl[n])
    order_paper = sorted(pc.allocations, key=lambda n: pc.paper_val_ppl[n])
    sp = pc.spearman
    lines = [
        "## Against the paper",
        "",
        "The paper's numbers are validation perplexities of a 440M Transformer after 30B tokens "
        "(its controlled experiment and schedule x ratio sweep), so only the *ordering* is "
        "comparable. Our change vs uniform is exp(Δ loss) − 1, paired over seeds, with its 95% "
        "interval.",
        "",
        f"- ours, best to worst: {' < '.join(label[n] for n in order_ours)}",
        f"- paper, best to worst: {' < '.join(label[n] for n in order_paper)}",
        f"- Spearman rank correlation: {'n/a' if sp is None else f'{sp:+.2f}'}; pairs ordered as "
        f"in the paper: {pw.agree}/{pw.pairs}"
        + (
            f" (pairs tied in the paper skipped: {pw.ties_in_reference})"
            if pw.ties_in_reference
            else ""
        ),
        f"- best allocation: ours {label[pc.best_ours]}, paper {label[pc.best_paper]}",
    ]
    u = next((a for a in allocs if a.diff_vs_uniform is None), None)
    u_paper = u.paper_ppl if u else None
    rows = []
    for a in allocs:
        if a.name not in pc.paper_val_ppl:
            continue
        d = a.diff_vs_uniform
        ours = "(baseline)"
        if d and d.val_loss.mean is not None:
            ci = d.val_loss.ci
            ours = f"{relative_ppl_change(d.val_loss.mean):+.2f}%" + (
                ""
                if ci is None
                else f" [{relative_ppl_change(ci[0]):+.2f}, {relative_ppl_change(ci[1]):+.2f}]"
            )
        paper = "(baseline)"
        if d is not None and u_paper:
            paper = f"{100 * (a.paper_ppl - u_paper) / u_paper:+.2f}%"
        rows.append([a.label, f"{a.val_ppl.mean:.2f}", ours, f"{a.paper_ppl:.2f}", paper])
    lines += [""]
    lines += md_table(
        [
            "allocation",
            "our val ppl",
            "ours vs uniform [95% CI]",
            "paper val ppl",
            "paper vs uniform",
        ],
        rows,
    )
    lines += [""]
    if pw.disagreeing_pairs:
        shown = ", ".join(f"{label[p]} vs {label[q]}" for p, q in pw.disagreeing_pairs[:12])
        more = len(pw.disagreeing_pairs) - 12
        lines.append(f"- ordered differently: {shown}" + (f" (+{more} more)" if more > 0 else ""))
    sc = pc.sweep_claims
    if sc:
        lines.append(
            f"- cosine < linear < sigmoid holds at {sc.ordering_holds_at}/{sc.ratios} "
            f"ratios (paper: 5/5); best cosine ratio: ours {sc.best_cosine_ratio_ours}, "
            f"paper {sc.best_cosine_ratio_paper}"
        )
    lines.append("")
    return lines


def write_report(
    grid: Grid,
    results: Results,
    out_dir: Path,
    meta: ReportMeta,
    stopping: Stopping | None = None,
    lr_tuning: LrTuning | None = None,
) -> ComparisonReport:
    """report.json, report.md and the PNGs in out_dir; `stopping` (--stop) and `lr_tuning`
    (--tune-lr) go into report.json and their sections into report.md after the validation
    table. Returns the report as report.json holds it."""
    summary = summarize(grid, results)
    plots = write_plots(grid, results, out_dir, summary)
    # the difference against tokens seen: where the taper's advantage ends (every report)
    vs_tokens = loss_vs_tokens(grid, results)
    if crossing_plot(vs_tokens, out_dir / CROSSING_PLOT):
        plots[REPORT_KEY] = CROSSING_PLOT
    meta = dataclasses.replace(meta, plots=plots)
    summary.loss_vs_tokens, summary.stopping, summary.lr_tuning = vs_tokens, stopping, lr_tuning
    final = {a.name: a.diff_vs_uniform and a.diff_vs_uniform.val_loss for a in summary.allocations}
    lines: list[str] = crossing_section(vs_tokens)
    # a verdict --stop settled (allocation label -> it) replaces the fixed-n reading
    settled: dict[str, str] = {}
    if stopping is not None:
        lines += stopping_section(stopping)
        settled = stopping.settled_verdicts()
    if lr_tuning is not None:
        lines += tuning_section(lr_tuning)
    runs = {name: dataclasses.replace(r, config=None) for name, r in results.items()}
    report = ComparisonReport(out_dir, meta, to_dict(grid.base), summary, runs)
    md = render_markdown(summary, meta, lines, headline(vs_tokens, final, settled))
    written = report.write()
    atomic_write_text(report.md_path, md)
    return written


def tuning_section(t: LrTuning) -> list[str]:
    """report.md's "Learning rate tuning" section."""
    lrs = t.lrs
    lines = [
        "## Learning rate tuning",
        "",
        f"`--tune-lr`: every {'allocation' if t.scope == 'each' else 'uniform run'} trained "
        f"at lr {', '.join(f'{x:g}' for x in lrs)} on tuning seeds {t.tuning_seeds} "
        f"(disjoint from the reported seeds {t.reported_seeds}); chosen lr = the lowest mean "
        "validation loss over the tuning seeds. "
        + (
            "Every allocation was then trained at uniform's chosen lr: the table above is at "
            "that lr."
            if t.scope == "uniform"
            else "The reported seeds then ran each allocation at its own chosen lr."
        ),
        "",
        *_curves_table(t),
        "",
        "Mean validation loss over the tuning seeds ± the half-width of its 95% t interval. "
        "`(grid edge)`: the best lr is the grid's smallest or largest, so the optimum may lie "
        "beyond it; widen --lr-grid.",
        "",
    ]
    if t.tuned:
        lines += _tuned_table(t)
    if t.tuned_stopping:
        lines += [f"The own-lr comparison {why(t.tuned_stopping)}.", ""]
    c = t.cost
    if c.factor is not None:
        lines += [
            f"Extra cost of tuning: {c.tuning_cells} tuning runs ({c.tuning_s / 60:.1f} min of "
            f"run time) + {c.tuned_cells} reported runs at lrs other than the recipe's "
            f"({c.tuned_s / 60:.1f} min), against {c.reported_s / 60:.1f} min for the "
            f"reported grid itself ({c.factor:.2f}x in all).",
            "",
        ]
    lines += [
        f"![loss vs lr]({t.plot})" if t.plot else "",
        "",
    ]
    return lines


def _curves_table(t: LrTuning) -> list[str]:
    """Mean validation loss of every allocation at every lr of the grid, and the chosen lr."""
    head = ["allocation", *(f"lr {x:g}" for x in t.lrs), "chosen lr"]
    rows = []
    for c in t.curves.values():
        cells = []
        for p in c.curve:
            if p.loss.mean is None:
                cells.append("–")
            elif p.ci is None:
                cells.append(f"{p.loss.mean:.4f}")
            else:
                cells.append(f"{p.loss.mean:.4f} ± {(p.ci[1] - p.ci[0]) / 2:.4f}")
        edge = " (grid edge)" if c.at_edge else ""
        rows.append([c.label, *cells, f"**{c.chosen_lr:g}**{edge}"])
    return md_table(head, rows)


def _tuned_table(t: LrTuning) -> list[str]:
    """Scope `each`: the paired differences vs uniform at the shared lr and at own lrs."""
    rows = [
        [
            a.label,
            f"{t.recipe_lr:g}",
            diff_ci(a.shared_diff, ".4f"),
            f"{a.lr:g}",
            diff_ci(a.tuned_diff, ".4f"),
            mean_pm(a.shared_loss, ".4f"),
            mean_pm(a.tuned_loss, ".4f"),
        ]
        for a in t.tuned
    ]
    head = [
        "allocation",
        "shared lr",
        "Δ loss vs uniform, shared lr [95% CI]",
        "own lr",
        "Δ loss vs uniform, own lrs [95% CI]",
        "val loss, shared lr",
        "val loss, own lr",
    ]
    return [
        *md_table(head, rows),
        "",
        "Both differences are paired over the reported seeds (each allocation minus uniform "
        "of the same seed); at own lrs each side runs at its own chosen lr.",
        "",
    ]


CROSSING_PLOT = "delta_vs_tokens.png"


def crossing_plot(data: LossVsTokens, path: Path) -> bool:
    """The PNG: per tapered allocation the mean difference with its 95% band against tokens per
    parameter (log axis), the zero line, and the crossing with its interval; False when no
    allocation has two shared evaluations."""
    drawn = [a for a in data.allocations if len(a.points) >= 2]
    if not drawn:
        return False
    fig, (ax,) = _figure()
    for i, a in enumerate(drawn):
        color = f"C{i}"
        x = np.array([p.tokens_per_param for p in a.points])
        y = np.array([p.mean for p in a.points])
        ax.plot(
            x, y, color=color, marker="o", markersize=3, label=f"{a.label} ({len(a.seeds)} seeds)"
        )
        band = [p.ci for p in a.points]
        if all(b is not None for b in band):
            ax.fill_between(x, [b[0] for b in band], [b[1] for b in band], color=color, alpha=0.2)
        c, iv = a.crossing, a.interval
        if c.tokens is not None:
            ax.axvline(c.tokens / data.params, color=color, linestyle="--", linewidth=1)
            if iv is not None and iv.tokens is not None:
                lo, hi = (t / data.params for t in iv.tokens)
                ax.axvspan(lo, hi, color=color, alpha=0.08)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens per parameter (log)")
    ax.set_ylabel("val loss − uniform's, nats (lower: taper better)")
    ax.set_title(
        "Paired difference vs uniform during training\n(mean, 95% band over seeds;\n"
        "dashed: the crossing, shaded: its 95% bootstrap interval)"
    )
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


SEQUENCE_PLOT = "sequence.png"


# ----------------------------------------------------------------------------------------------
# report


def with_stopping_plot(stopping: Stopping, out_dir: Path) -> Stopping:
    """`stopping` with `plot` set after drawing sequence.png (each comparison's anytime-valid
    interval against the number of seeds; unbounded ones left out)."""
    series: dict[str, list] = {}
    for step in stopping.sequence:
        for label, e in step.comparisons.items():
            if math.isfinite(e.half):
                series.setdefault(label, []).append((step.n, e.mean, *e.ci))
    if not series:
        return dataclasses.replace(stopping, plotted=True, plot=None)
    plot_interval_series(
        series,
        out_dir / SEQUENCE_PLOT,
        title=f"Anytime-valid {100 * stopping.confidence:g}% interval as seeds are added",
        xlabel="seeds (0..n-1, in order)",
        ylabel="val loss difference, nats (paired)",
    )
    return dataclasses.replace(stopping, plotted=True, plot=SEQUENCE_PLOT)


LR_PLOT = "lr_tuning.png"


def plot_lr_curves(curves: dict[str, LrCurve], recipe_lr: float, path: Path) -> None:
    """Validation loss against lr per allocation (mean over tuning seeds, 95% intervals), the
    chosen lrs marked."""
    series = {}
    for c in curves.values():
        pts = []
        for p in c.curve:
            if p.loss.mean is None:
                continue
            lo, hi = p.ci if p.ci else (None, None)
            pts.append((p.lr, p.loss.mean, lo, hi))
        series[f"{c.label} (best {c.chosen_lr:g})"] = pts
    plot_interval_series(
        series,
        path,
        title=f"Validation loss vs peak lr (tuning seeds; recipe lr {recipe_lr:g})",
        xlabel="peak learning rate",
        ylabel="validation loss (mean, 95% CI)",
        logx=True,
        zero_line=False,
    )


def with_tuning_plot(tuning: LrTuning, out_dir: Path) -> LrTuning:
    """`tuning` with its plot drawn into out_dir (when it has curves)."""
    if not tuning.curves:
        return tuning
    plot_lr_curves(tuning.curves, tuning.recipe_lr, out_dir / LR_PLOT)
    return dataclasses.replace(tuning, plot=LR_PLOT)


PLOTS = {
    "widths": "widths.png",
    "val_loss": "val_loss.png",
    "val_loss_diff": "val_loss_diff.png",
    "novelty": "novelty.png",
    "paper": "paper.png",
    "sweep": "sweep.png",
    "kv_pareto": "kv_pareto.png",
}


def _averaged_novelty(results: list[CellResult], label: str):
    """One NoveltyResult per allocation: per layer, the mean over seeds of each seed's per-layer
    mean, with the sample std over seeds as its `std` (0 for one seed), so that the plot's band
    is the seed-to-seed spread the report's statistics are about (not the spread over tokens)."""
    per_seed = [NoveltyResult.from_dict(r.novelty.to_json()) for r in results]
    first = per_seed[0]

    def over_seeds(key: str) -> list[TokenStats]:
        out = []
        for i in range(first.n_layers):
            means = np.array([getattr(p, key)[i].mean for p in per_seed], dtype=float)
            sd = float(means.std(ddof=1)) if len(means) > 1 else 0.0
            m = float(means.mean())
            out.append(TokenStats(mean=m, std=sd, median=m, p10=m, p90=m, n=len(means)))
        return out

    return first.with_layers(over_seeds("rho_block"), over_seeds("rho_mlp"), name=label)


def _diff_curves(
    curves: dict[int, list[list[float]]], base: dict[int, list[list[float]]]
) -> list[list[list[float]]]:
    """Per seed: [tokens, loss - uniform loss] at the evaluations both runs made."""
    out = []
    for seed, pts in curves.items():
        ref = {t: v for t, v in base.get(seed, [])}
        diff = [[t, v - ref[t]] for t, v in pts if t in ref]
        if diff:
            out.append(diff)
    return out


# The one novelty statistic of plot and report: each seed's Pearson r of its per-layer means
# with depth, then mean ± std over seeds.
R_TITLE = "r with depth: mean ± std over seeds"


def _r_labels(summary: ComparisonSummary, labels) -> dict[str, dict[str, str]]:
    """Legend text per allocation label: the report's r statistics (summary.allocations)."""
    out = {}
    for a in summary.allocations:
        if a.label not in labels:
            continue
        texts = {}
        for key, st in (
            ("pearson_mlp", a.novelty.pearson_mlp),
            ("pearson_block", a.novelty.pearson_block),
        ):
            if st.mean is None:
                texts[key] = "r n/a"
            elif st.std is None:
                texts[key] = f"r={st.mean:+.2f}"
            else:
                texts[key] = f"r={st.mean:+.2f}±{st.std:.2f}"
        out[a.label] = texts
    return out


def _paper_rows(summary: ComparisonSummary):
    """Forest-plot rows (label, our ppl change %, CI) and the paper's change % per label, for
    the allocations the paper reports."""
    allocs = summary.allocations
    u = next((a for a in allocs if a.diff_vs_uniform is None), None)
    if u is None or u.paper_ppl is None:
        return [], {}
    rows, ref = [], {}
    for a in allocs:
        d = a.diff_vs_uniform and a.diff_vs_uniform.val_loss
        if not d or d.mean is None or a.paper_ppl is None:
            continue
        lo, hi = (relative_change(x) for x in d.ci) if d.ci else (None, None)
        rows.append((a.label, relative_change(d.mean), lo, hi))
        ref[a.label] = 100.0 * (a.paper_ppl / u.paper_ppl - 1.0)
    return rows, ref


def write_plots(
    grid: Grid, results: Results, out_dir: Path, summary: ComparisonSummary
) -> dict[str, str]:
    """The PNGs (file names relative to out_dir); `summary` (taperlm.compare.summary) supplies
    the statistics shown in legends, so plots and report.md show the same numbers, and our
    perplexity changes beside the paper's for the allocations it reports (paper.png)."""
    by_alloc = {
        a.name: [results[c.name] for c in grid.cells if c.allocation is a and c.name in results]
        for a in grid.allocations
    }
    written = _width_plot(grid, out_dir)
    written |= _curve_plots(grid, results, by_alloc, out_dir)
    written |= _novelty_plot(grid, by_alloc, summary, out_dir)
    written |= _paper_plots(grid, summary, out_dir)
    if _kv_pareto_plot(summary, out_dir / PLOTS["kv_pareto"]):
        written["kv_pareto"] = PLOTS["kv_pareto"]
    return written


def _width_plot(grid: Grid, out_dir: Path) -> dict[str, str]:
    """widths.png: the MLP width (and query heads, where tapered) per layer of every taper."""
    uniform = next(a for a in grid.allocations if a.is_uniform)
    tapered = [a for a in grid.allocations if not a.is_uniform] or [uniform]
    # a novelty:pilot allocation's widths differ by seed: the plot shows the first seed's
    profiles = {
        a.label + (f" (seed {grid.seeds[0]})" if a.needs_pilot else ""): grid.budget[a.name].widths
        for a in tapered
    }
    heads = {a.label: grid.budget[a.name].heads for a in tapered if not a.head_taper.is_uniform}
    analysis_plots.plot_width_profiles(
        profiles,
        grid.budget[uniform.name].baseline_width,
        out_dir / PLOTS["widths"],
        title="MLP width" + (" and query heads" if heads else "") + " per layer (equal budget)",
        heads=heads or None,
        baseline_heads=grid.budget[uniform.name].baseline_heads,
    )
    return {"widths": PLOTS["widths"]}


def _curve_plots(
    grid: Grid,
    results: Results,
    by_alloc: dict[str, list[CellResult]],
    out_dir: Path,
) -> dict[str, str]:
    """val_loss.png (the curves during training) and val_loss_diff.png (paired vs uniform)."""
    curves = {a.label: [r.curve for r in by_alloc[a.name] if r.curve] for a in grid.allocations}
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return {}
    # The curve points are the trainer's evaluations (train.eval_tokens each); the report's
    # final numbers use more tokens, so the last point need not equal the table's loss.
    # One clause per title line, so that no title runs past the figure's edge.
    every = f"each point {grid.base.train.eval_tokens:,} val tokens"
    final = {r.val.tokens for r in results.values()}
    if final:
        every += f";\nthe table's final losses: {'/'.join(f'{n:,}' for n in sorted(final))}"
    analysis_plots.plot_loss_curves(
        curves, out_dir / PLOTS["val_loss"], title=f"Validation loss during training\n({every})"
    )
    written = {"val_loss": PLOTS["val_loss"]}
    uniform = next(a for a in grid.allocations if a.is_uniform)
    base = {r.seed: r.curve for r in by_alloc[uniform.name]}
    diffs = {
        a.label: _diff_curves({r.seed: r.curve for r in by_alloc[a.name]}, base)
        for a in grid.allocations
        if not a.is_uniform
    }
    if any(diffs.values()):
        analysis_plots.plot_paired_differences(
            diffs,
            out_dir / PLOTS["val_loss_diff"],
            title="Paired validation-loss difference vs uniform during training\n"
            f"(mean ± 1 std over seeds; {every})",
        )
        written["val_loss_diff"] = PLOTS["val_loss_diff"]
    return written


def _novelty_plot(
    grid: Grid,
    by_alloc: dict[str, list[CellResult]],
    summary: ComparisonSummary,
    out_dir: Path,
) -> dict[str, str]:
    """novelty.png: layer-wise novelty of every allocation, averaged over seeds."""
    nov = {
        a.label: _averaged_novelty(by_alloc[a.name], a.label)
        for a in grid.allocations
        if by_alloc[a.name]
    }
    if not nov:
        return {}
    n_seeds = max(len(v) for v in by_alloc.values())
    analysis_plots.plot_novelty(
        nov,
        out_dir / PLOTS["novelty"],
        title=f"Layer-wise novelty: per-layer means averaged over {n_seeds} seed(s)",
        band="±1 std over seeds",
        r_labels=_r_labels(summary, nov),
        r_title=R_TITLE,
    )
    return {"novelty": PLOTS["novelty"]}


def _paper_plots(grid: Grid, summary: ComparisonSummary, out_dir: Path) -> dict[str, str]:
    """paper.png (our ppl changes beside the paper's) and, for --paper sweep, sweep.png."""
    written: dict[str, str] = {}
    rows, ref = _paper_rows(summary)
    if len(rows) >= 2:
        analysis_plots.plot_intervals(
            rows,
            out_dir / PLOTS["paper"],
            title="Val ppl change vs uniform: ours and the paper's",
            xlabel="val ppl change vs uniform, % (paper: 440M Transformer, 30B tokens)",
            reference=ref,
            reference_label="paper, 440M / 30B tokens",
        )
        written["paper"] = PLOTS["paper"]
    mode = paper_mode(grid.paper)
    if mode is not None and mode.sweep_claims and rows:
        specs = {a.label: a.spec for a in grid.allocations}
        _sweep_plot(specs, rows, ref, out_dir / PLOTS["sweep"])
        written["sweep"] = PLOTS["sweep"]
    return written


def _kv_pareto_plot(summary: ComparisonSummary, path: Path) -> bool:
    """With KV tapers in the grid: each allocation's paired val-loss difference vs uniform
    (95% interval) against its KV-cache bytes per token (bf16); False when every allocation
    caches the same."""
    allocs = [a for a in summary.allocations if a.kv_cache_bytes_per_token_bf16]
    if len({a.kv_cache_bytes_per_token_bf16 for a in allocs}) < 2:
        return False
    series = {}
    # Allocations with equal bytes are drawn side by side (1.5% of the range apart) so that
    # their intervals do not hide each other; the x axis still reads their bytes.
    xs = [a.kv_cache_bytes_per_token_bf16 for a in allocs]
    gap = 0.015 * (max(xs) - min(xs))
    for a in allocs:
        same = [
            b.label
            for b in allocs
            if b.kv_cache_bytes_per_token_bf16 == a.kv_cache_bytes_per_token_bf16
        ]
        x = a.kv_cache_bytes_per_token_bf16 + gap * (same.index(a.label) - (len(same) - 1) / 2)
        d = a.diff_vs_uniform and a.diff_vs_uniform.val_loss
        if a.diff_vs_uniform is None:
            series[a.label] = [(x, 0.0, None, None)]
        elif d and d.mean is not None:
            lo, hi = d.ci if d.ci else (None, None)
            series[a.label] = [(x, d.mean, lo, hi)]
    analysis_plots.plot_interval_series(
        series,
        path,
        title="Validation loss vs KV cache at equal parameters",
        xlabel="KV-cache bytes per token (bf16, all layers; equal bytes drawn side by side)",
        ylabel="val loss - uniform's (paired, 95% CI; lower is better)",
    )
    return True


def _sweep_plot(specs: dict[str, TaperSpec], rows, ref: dict[str, float], path: Path) -> None:
    """The sweep as the paper draws its claims: ppl change vs uniform against the start ratio,
    one line per schedule (ours with 95% intervals, the paper's dotted; `specs`: each row's
    allocation's MLP taper, by label, as parsed)."""
    series: dict[str, list] = {}
    paper: dict[str, list] = {}
    for label, mean, lo, hi in rows:
        spec = specs[label]
        series.setdefault(spec.schedule, []).append((spec.start, mean, lo, hi))
        paper.setdefault(spec.schedule, []).append((spec.start, ref[label]))
    analysis_plots.plot_interval_series(
        {k: sorted(v) for k, v in series.items()},
        path,
        title="Schedule x ratio sweep: val ppl change vs uniform",
        xlabel="start ratio (end = 2 − start)",
        ylabel="ppl change vs uniform, % (lower is better)",
        reference={k: sorted(v) for k, v in paper.items()},
        reference_label="paper, 440M",
    )
