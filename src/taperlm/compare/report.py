"""The comparison report: report.json (every number, `taperlm.compare.summary`), report.md and
the PNGs (`taperlm.compare.plots`).

Statistics (see `taperlm.analysis.stats`):
- per allocation: mean and sample std over seeds of val loss, val ppl, tokens/s, train loss;
- paired difference vs uniform per seed (same seed = same data order and init seed), mean, std,
  n and the 95% Student-t confidence interval; a CI that excludes 0 is marked `*`;
- novelty: Pearson r of rho_mlp (and rho_block) with depth, mean ± std over seeds, and the
  per-layer rho means averaged over seeds;
- paper comparison (allocations the paper reports): Spearman rank correlation between our mean
  val ppl and the paper's, the fraction of allocation pairs ordered as in the paper (pairs tied
  in the paper skipped), and for the sweep the paper's two claims (cosine < linear < sigmoid at
  every ratio; cosine best at 1.5 -> 0.5).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taperlm.analysis.stats import PairedDifference, Summary, relative_ppl_change
from taperlm.compare import crossing
from taperlm.compare.grid import Grid
from taperlm.compare.plots import PLOTS, write_plots
from taperlm.compare.summary import (
    AllocationSummary,
    ComparisonSummary,
    Execution,
    ExecutionSetting,
    PaperComparison,
    PilotSummary,
    ZeroShotColumn,
    summarize,
)
from taperlm.config import to_dict
from taperlm.files.io import atomic_write_text, finite_json, parse_json

if TYPE_CHECKING:
    from taperlm.compare.runner import Results

# another part's report: (report.json key, its data, the lines of its report.md section)
Extra = tuple[str, Any, Callable[[Any], list[str]]]


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
    meta: dict[str, Any],
    extra: Sequence[str] = (),
    lead: Sequence[str] = (),
) -> str:
    """report.md: how it was produced, `lead` (the verdict), validation with paired
    differences, the paper, zero-shot, novelty, plots and per-seed losses."""
    allocs = summary.allocations
    s = meta["settings"]
    lines = _header(summary, meta)
    lines += list(lead)
    lines += _validation_section(summary)
    lines += list(extra)  # e.g. --tune-lr's section
    if summary.paper_comparison:
        lines += _paper_section(summary.paper_comparison, allocs)
    lines += _zero_shot_section(allocs, s)
    lines += _novelty_section(allocs, s)
    lines += _plots_section(meta["plots"], s)
    lines += _per_seed_section(allocs, s["seeds"])
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


def _header(summary: ComparisonSummary, meta: dict[str, Any]) -> list[str]:
    s, m = meta["settings"], meta["model"]
    return [
        f"# taperlm compare — {meta['title']}",
        "",
        *produced_by(meta["command"]),
        f"- model: {m['family']}, {m['n_layers']} layers, d_model {m['d_model']}, "
        f"{m['n_heads']} heads, baseline MLP width {m['mlp_width']}, vocab {m['vocab_size']}",
        f"- training per run: {s['tokens']:,} tokens ({s['steps']} steps of "
        f"{s['batch_tokens']:,} tokens, seq_len {s['seq_len']}), peak lr {s['lr']:g}, "
        f"warmup {s['warmup_tokens']:,} tokens; seeds {s['seeds']}",
        f"- data: `{s['data_dir']}` (train {s['train_tokens']:,} tokens); validation on the "
        f"first {s['val_tokens']:,} tokens of its val split (the same for every run)",
        f"- {len(summary.allocations)} allocations x {len(s['seeds'])} seeds = "
        f"{meta['cells']} runs; wall time {meta['wall_s'] / 60:.1f} min this invocation, "
        f"{meta.get('cpu_s', 0) / 60:.1f} CPU-min; {meta['created']}",
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


def _zero_shot_section(allocs: list[AllocationSummary], s: dict[str, Any]) -> list[str]:
    zs = [a for a in allocs if a.zero_shot]
    if not zs:
        return []
    cols = [c for c in zs[0].zero_shot if c]
    return [
        "## Zero-shot",
        "",
        f"Tasks {', '.join(s['eval_tasks'])}, first {s['eval_limit'] or 'all'} items each "
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


def _novelty_section(allocs: list[AllocationSummary], s: dict[str, Any]) -> list[str]:
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
        f"averaged over {allocs[0].novelty.tokens} tokens of {s['novelty_text']}; r = "
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


def _plots_section(plots: dict[str, str], s: dict[str, Any]) -> list[str]:
    evals = f"{s['eval_tokens']:,} val tokens per point, not the table's {s['val_tokens']:,}"
    captions = {
        "widths": "MLP width per layer (uniform baseline dashed)",
        "val_loss": f"validation loss during training, mean ± 1 std over seeds ({evals})",
        "val_loss_diff": f"paired validation-loss difference vs uniform during training ({evals})",
        "novelty": "rho_mlp and rho_block per layer, means over seeds ± 1 std over seeds",
        "paper": "perplexity change vs uniform beside the paper's",
        "sweep": "the sweep: perplexity change vs start ratio per schedule, beside the paper's",
        "kv_pareto": "paired validation-loss difference vs uniform against KV-cache bytes per token",
        crossing.REPORT_KEY: "paired difference vs uniform against tokens per parameter, with "
        "the crossing",
    }
    lines = ["", "## Plots", ""]
    lines += [f"- [{captions[key]}]({file})" for key, file in plots.items()]
    lines += ["", f"![widths]({PLOTS['widths']})"]
    if crossing.REPORT_KEY in plots:
        lines.append(f"![difference against tokens]({plots[crossing.REPORT_KEY]})")
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


# ----------------------------------------------------------------------------------------------
# writing


@dataclass
class ComparisonReport:
    """A comparison's report.json, typed: what a study puts its comparisons together from."""

    out: Path  # the comparison's folder (report.md, report.json and the PNGs)
    meta: dict[str, Any]  # how it was produced: title, command, model, settings, times, plots
    base_config: dict[str, Any]  # the config every cell started from (`taperlm.config.to_dict`)
    summary: ComparisonSummary  # every number (other parts' under its extras)
    runs: dict[str, dict[str, Any]]  # cell -> its result.json without the config

    @property
    def md_path(self) -> Path:
        return self.out / "report.md"

    @property
    def json_path(self) -> Path:
        return self.out / "report.json"

    def to_json(self) -> dict[str, Any]:
        """report.json's object."""
        return {
            "meta": self.meta,
            "base_config": self.base_config,
            **self.summary.to_json(),
            "runs": self.runs,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], out: Path) -> ComparisonReport:
        """The report `to_json` wrote into `out`."""
        return cls(
            out, data["meta"], data["base_config"], ComparisonSummary.from_json(data), data["runs"]
        )


def write_report(
    grid: Grid,
    results: Results,
    out_dir: Path,
    meta: dict[str, Any],
    extra: Extra | Sequence[Extra] | None = None,
) -> ComparisonReport:
    """report.json, report.md and the PNGs in out_dir; `extra` = (key, data, render), or a list
    of them: data goes into report.json under `key`, and render(data)'s lines into report.md
    after the validation table, in the order given. Returns the report as report.json holds it."""
    summary = summarize(grid, results)
    meta = dict(meta)
    meta["plots"] = write_plots(grid, results, out_dir, summary)
    # the difference against tokens seen: where the taper's advantage ends (every report)
    vs_tokens = crossing.loss_vs_tokens(grid, results)
    if crossing.plot(vs_tokens, out_dir / crossing.PLOT_FILE):
        meta["plots"][crossing.REPORT_KEY] = crossing.PLOT_FILE
    summary.extras[crossing.REPORT_KEY] = vs_tokens.to_json()
    final = {a.name: a.diff_vs_uniform and a.diff_vs_uniform.val_loss for a in summary.allocations}
    lines: list[str] = crossing.section(vs_tokens)
    extras = [extra] if isinstance(extra, tuple) else list(extra or [])
    settled: dict[str, str] = {}  # allocation label -> a verdict an extra settled (--stop's)
    for key, data, render in extras:  # other parts' numbers and sections, e.g. --tune-lr's
        summary.extras[key] = data
        lines += render(data)
        if callable(getattr(data, "settled_verdicts", None)):
            settled.update(data.settled_verdicts())
    runs = {
        name: {k: v for k, v in r.to_json().items() if k != "config"} for name, r in results.items()
    }
    report = ComparisonReport(out_dir, meta, to_dict(grid.base), summary, runs)
    md = render_markdown(summary, meta, lines, crossing.headline(vs_tokens, final, settled))
    text = json.dumps(finite_json(report.to_json()), indent=1, allow_nan=False)
    atomic_write_text(report.json_path, text + "\n")
    atomic_write_text(report.md_path, md)
    # what a study reads is what the file holds (non-finite numbers null, keys strings), as a
    # rerun that finds this comparison done would read it
    return ComparisonReport.from_json(parse_json(text, report.json_path), out_dir)
