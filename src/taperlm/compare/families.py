"""`taperlm compare --paper families`: the paper's family table at any scale.

Every family's preset `{prefix}-{size}` (default: transformer, gated, hope and titans-mag at the
size `micro`) is compared uniform vs cosine 1.5 -> 0.5 over the same seeds. Each family is its own
comparison at exactly its own uniform budget (`build_grid` asserts equal parameters and
FLOPs/token, and that the cells of a seed differ only in the widths): `OUT/<prefix>-<size>/` is a
complete `taperlm compare` of that family (report.md, runs/, plots), reproducible on its own
with the command its report names. `OUT/report.md`, `report.json` and `families.png` then put the
families side by side like the paper's 760M table, with the paper's numbers and relative changes
beside ours (`write_family_report`).

`--set` keys of a family's own section (`model.titans.window=32`, `hope.levels=2`) apply to that
family only; every other key applies to all. At the paper's sizes (`--preset-size 760m`) the
cells train with the paper's recipe (`taperlm.compare.recipe.PAPER_TRAIN`).

Titans: the paper does not say which variant it tapered; the default is MAG (why: docs/compare.md);
`--families transformer,titans-mac,titans-mal` runs others.

The family table: Our relative change is the ratio of the geometric-mean perplexities, exp(mean Δloss) − 1, with
the interval exp(CI of Δloss) − 1 (paired over seeds). The paper reports single runs at 760M
parameters and 50B tokens; its in-distribution validation perplexities per family are not given,
so WikiText perplexity (its first column) stands beside our validation perplexity."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taperlm.analysis import stats
from taperlm.analysis.plots import plot_intervals
from taperlm.analysis.stats import PairedDifference
from taperlm.compare.grid import (
    FAMILIES_TAPERS,
    PAPER_760M_CLAIM,
    PAPER_760M_COLUMNS,
    Paper760M,
    paper_760m,
)
from taperlm.compare.options import DEFAULT_FAMILIES, CompareOptions, list_text, run_arguments
from taperlm.compare.report import (
    CHANCE_NOTE,
    diff_ci,
    md_table,
    mean_pm,
    produced_by,
    yes_no,
    zero_shot_cell,
)
from taperlm.compare.results import (
    REPORT_FILE,
    AllocationSummary,
    ComparisonReport,
    DesignChecks,
    ModelMeta,
    SettingsMeta,
    write_record,
)
from taperlm.compare.study import Part, StudyPlan, StudyProgress
from taperlm.config.assembly import Assembly, Layer
from taperlm.config.presets import PAPER_SHAPES, SMALL_SHAPES, preset_families
from taperlm.errors import ConfigError
from taperlm.families import FAMILIES
from taperlm.files.io import atomic_write_text

PLOT = "families.png"


@dataclass(frozen=True)
class RelativeChange:
    """The tapered model's perplexity relative to uniform's, % (exp(mean Δ loss) − 1), with
    the interval of Δ loss mapped the same way."""

    mean: float  # %
    ci: tuple[float, float] | None  # % (None: one seed)

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci": None if self.ci is None else list(self.ci)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RelativeChange:
        ci = data["ci"]
        return cls(data["mean"], None if ci is None else (ci[0], ci[1]))


@dataclass(frozen=True)
class FamilyRow:
    """One family's row pair of the table: report.json's entry of `families` (`to_json` writes
    it; its params, FLOPs/token, widths and taper are the allocations')."""

    preset: str  # the family's preset, {prefix}-{size}
    prefix: str  # its preset prefix (e.g. titans-mag)
    family: str  # its model family
    label: str  # its name in the table (the paper's name where it has one)
    model: ModelMeta  # the comparison's model summary (its report's meta)
    uniform: AllocationSummary  # the uniform allocation, as its comparison reported it
    tapered: AllocationSummary  # the tapered allocation, likewise
    diff_val_loss: PairedDifference  # tapered minus uniform validation loss, seed by seed
    diff_val_ppl: PairedDifference  # ... validation perplexity
    relative_ppl_change: RelativeChange | None  # from diff_val_loss (None: no common seed)
    zero_shot_diff: dict[str, PairedDifference]  # zero-shot column -> tapered minus uniform
    paper_760m: Paper760M | None  # the paper's 760M rows (None: none)
    checks: DesignChecks  # its comparison's design checks
    budget_equal: bool  # both allocations have the same params and FLOPs/token
    run_times: dict[str, float]  # seconds summed over its runs: train_s, val_s, ...
    wall_s: float  # its comparison's wall seconds in the invocation that reported it
    settings: SettingsMeta  # its comparison's settings (its report's meta)

    @property
    def params(self) -> int:
        return self.uniform.params

    @property
    def flops_per_token(self) -> int:
        return self.uniform.flops_per_token

    @property
    def taper(self) -> str:
        return self.tapered.taper

    def to_json(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "prefix": self.prefix,
            "family": self.family,
            "label": self.label,
            "model": self.model.to_json(),
            "params": self.params,
            "flops_per_token": self.flops_per_token,
            "widths": {"uniform": self.uniform.widths, "tapered": self.tapered.widths},
            "taper": self.taper,
            "uniform": self.uniform.to_json(),
            "tapered": self.tapered.to_json(),
            "diff_val_loss": self.diff_val_loss.to_json(),
            "diff_val_ppl": self.diff_val_ppl.to_json(),
            "relative_ppl_change": None
            if self.relative_ppl_change is None
            else self.relative_ppl_change.to_json(),
            "zero_shot_diff": {c: d.to_json() for c, d in self.zero_shot_diff.items()},
            "paper_760m": None if self.paper_760m is None else self.paper_760m.to_json(),
            "checks": {**self.checks.to_json(), "budget_equal": self.budget_equal},
            "run_times": self.run_times,
            "wall_s": self.wall_s,
            "settings": self.settings.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FamilyRow:
        rel = data["relative_ppl_change"]
        return cls(
            preset=data["preset"],
            prefix=data["prefix"],
            family=data["family"],
            label=data["label"],
            model=ModelMeta.from_json(data["model"]),
            uniform=AllocationSummary.from_json(data["uniform"]),
            tapered=AllocationSummary.from_json(data["tapered"]),
            diff_val_loss=PairedDifference.from_json(data["diff_val_loss"]),
            diff_val_ppl=PairedDifference.from_json(data["diff_val_ppl"]),
            relative_ppl_change=None if rel is None else RelativeChange.from_json(rel),
            zero_shot_diff={
                c: PairedDifference.from_json(d) for c, d in data["zero_shot_diff"].items()
            },
            paper_760m=None if (p := data["paper_760m"]) is None else Paper760M.from_json(p),
            checks=DesignChecks.from_json(data["checks"]),
            budget_equal=data["checks"]["budget_equal"],
            run_times=data["run_times"],
            wall_s=data["wall_s"],
            settings=SettingsMeta.from_json(data["settings"]),
        )


@dataclass(frozen=True)
class FamilyMeta:
    """How a family table was produced: report.json's `meta` (`to_json` writes it)."""

    command: str  # the command that reproduces it
    preset_size: str  # the size every family's preset has
    families: tuple[str, ...]  # the preset prefixes, in the order run
    family_wall_s: dict[str, float]  # prefix -> its comparison's seconds in this invocation
    wall_s: float  # seconds of this invocation
    cpu_s: float  # CPU seconds of the main process
    created: str  # when it was written
    done: int  # families done
    total: int  # families planned

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "preset_size": self.preset_size,
            "families": list(self.families),
            "family_wall_s": self.family_wall_s,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "created": self.created,
            "done": self.done,
            "total": self.total,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FamilyMeta:
        return cls(
            data["command"],
            data["preset_size"],
            tuple(data["families"]),
            data["family_wall_s"],
            data["wall_s"],
            data["cpu_s"],
            data["created"],
            data["done"],
            data["total"],
        )


@dataclass(frozen=True)
class FamilyTable:
    """Every number of the family table (`summarize_families`): the rows and what they add up
    to (report.json beside its meta)."""

    families: tuple[FamilyRow, ...]  # one per family, in the order run
    verdicts: dict[str, str]  # prefix -> better / worse / undecided (`verdict`)
    better: int  # families whose tapered mean loss is lower
    significantly_better: int  # ... whose interval excludes 0 in favour of tapering
    significantly_worse: int  # ... against it
    all_budgets_equal: bool  # every family's allocations have equal params and FLOPs/token

    def to_json(self) -> dict[str, Any]:
        return {
            "families": [e.to_json() for e in self.families],
            "verdicts": self.verdicts,
            "better": self.better,
            "significantly_better": self.significantly_better,
            "significantly_worse": self.significantly_worse,
            "all_budgets_equal": self.all_budgets_equal,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FamilyTable:
        return cls(
            tuple(FamilyRow.from_json(e) for e in data["families"]),
            data["verdicts"],
            data["better"],
            data["significantly_better"],
            data["significantly_worse"],
            data["all_budgets_equal"],
        )


@dataclass(frozen=True)
class FamilyReport:
    """A families run's report.json: how it was produced, then the table's numbers."""

    meta: FamilyMeta
    table: FamilyTable

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta.to_json(), **self.table.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FamilyReport:
        return cls(FamilyMeta.from_json(data["meta"]), FamilyTable.from_json(data))


def _column_by_seed(entry: AllocationSummary, col: str) -> dict[int, float]:
    """Seed -> the value of zero-shot column `col` of one allocation's runs."""
    out = {}
    for seed, run in entry.per_seed.items():
        value = (run.zero_shot or {}).get(col)
        if value is not None:
            out[int(seed)] = float(value)
    return out


def _zero_shot_differences(
    u: AllocationSummary, t: AllocationSummary
) -> dict[str, PairedDifference]:
    """Paired differences (tapered − uniform, same seed) of every zero-shot column."""
    cols: list[str] = []
    for run in [*u.per_seed.values(), *t.per_seed.values()]:
        cols += [c for c in run.zero_shot or {} if c not in cols]
    out = {}
    for col in cols:
        pd = stats.paired_difference(_column_by_seed(t, col), _column_by_seed(u, col))
        if pd.n:
            out[col] = pd
    return out


def family_entry(prefix: str, size: str, report: ComparisonReport) -> FamilyRow:
    """One family's row pair from its comparison's report (preset `{prefix}-{size}`)."""
    allocs = report.summary.allocations
    u = next(a for a in allocs if a.diff_vs_uniform is None)
    t = next(a for a in allocs if a.diff_vs_uniform is not None)
    fam = report.meta.model.family
    paper = paper_760m(fam)
    label = paper.name if paper else fam
    if prefix != fam:
        label += f" ({prefix})"
    d = t.diff_vs_uniform.val_loss
    rel = None
    if d.mean is not None:
        rel = RelativeChange(
            stats.relative_ppl_change(d.mean),
            None if d.ci is None else (
                stats.relative_ppl_change(d.ci[0]), stats.relative_ppl_change(d.ci[1])
            ),
        )  # fmt: skip
    meta = report.meta
    return FamilyRow(
        preset=f"{prefix}-{size}",
        prefix=prefix,
        family=fam,
        label=label,
        model=meta.model,
        uniform=u,
        tapered=t,
        diff_val_loss=d,
        diff_val_ppl=t.diff_vs_uniform.val_ppl,
        relative_ppl_change=rel,
        zero_shot_diff=_zero_shot_differences(u, t),
        paper_760m=paper,
        checks=report.summary.checks,
        budget_equal=u.params == t.params and u.flops_per_token == t.flops_per_token,
        run_times=report.summary.run_times,
        wall_s=meta.wall_s,
        settings=meta.settings,
    )


def verdict(d: PairedDifference) -> str:
    """better / worse (the 95% interval excludes 0) or undecided."""
    if d.ci is None:
        return "undecided (one seed)"
    lo, hi = d.ci
    return "better" if hi < 0 else "worse" if lo > 0 else "undecided"


def summarize_families(reports: dict[str, ComparisonReport], size: str) -> FamilyTable:
    """Every number of the family table; reports: preset prefix -> its report."""
    entries = tuple(family_entry(prefix, size, rep) for prefix, rep in reports.items())
    verdicts = {e.prefix: verdict(e.diff_val_loss) for e in entries}
    return FamilyTable(
        families=entries,
        verdicts=verdicts,
        better=sum(e.diff_val_loss.mean < 0 for e in entries),
        significantly_better=sum(v == "better" for v in verdicts.values()),
        significantly_worse=sum(v == "worse" for v in verdicts.values()),
        all_budgets_equal=all(e.budget_equal for e in entries),
    )


# ----------------------------------------------------------------------------------------------
# markdown


def _pct(x: RelativeChange | None) -> str:
    if x is None:
        return "–"
    if x.ci is None:
        return f"{x.mean:+.2f}%"
    return f"{x.mean:+.2f}% [{x.ci[0]:+.2f}, {x.ci[1]:+.2f}]"


def _paper_cells(paper: Paper760M | None, tapered: bool) -> list[str]:
    if paper is None:
        return ["–", "–", "–"]
    row = paper.tapered if tapered else paper.uniform
    ch = paper.change
    if not tapered:
        return [f"{row['Wiki ppl']:.2f}", f"{row['LMB ppl']:.2f}", f"{row['Avg']:.2f}"]
    return [
        f"{row['Wiki ppl']:.2f} ({ch['Wiki ppl']:+.2f}%)",
        f"{row['LMB ppl']:.2f} ({ch['LMB ppl']:+.2f}%)",
        f"{row['Avg']:.2f} ({ch['Avg']:+.2f})",
    ]


def _validation_table(entries: tuple[FamilyRow, ...]) -> list[str]:
    head = [
        "model",
        "params",
        "FLOPs/token",
        "val loss",
        "val ppl",
        "Δ loss vs uniform, nats [95% CI]",
        "Δ ppl vs uniform, % [95% CI]",
        "n",
        "paper Wiki ppl (Δ %)",
        "paper LMB ppl (Δ %)",
        "paper Avg acc, % (Δ points)",
    ]
    rows = []
    for e in entries:
        for tapered in (False, True):
            a = e.tapered if tapered else e.uniform
            rows.append(
                [
                    f"+ tapered (`{e.taper}`)" if tapered else f"**{e.label}**",
                    f"{a.params:,}",
                    f"{a.flops_per_token:,}",
                    mean_pm(a.val_loss, ".4f"),
                    mean_pm(a.val_ppl, ".2f"),
                    diff_ci(e.diff_val_loss if tapered else None, ".4f"),
                    _pct(e.relative_ppl_change) if tapered else "(baseline)",
                    str(a.val_loss.n),
                    *_paper_cells(e.paper_760m, tapered),
                ]
            )
    return md_table(head, rows)


def _zero_shot_table(entries: tuple[FamilyRow, ...], settings: SettingsMeta) -> list[str]:
    have = [e for e in entries if e.uniform.zero_shot or e.tapered.zero_shot]
    if not have:
        return []
    cols = [c for c in PAPER_760M_COLUMNS if c in (have[0].uniform.zero_shot or {})]
    rows = []
    for e in have:
        for tapered in (False, True):
            zs = (e.tapered if tapered else e.uniform).zero_shot or {}
            avg = e.zero_shot_diff.get("Avg") if tapered else None
            rows.append(
                [
                    "+ tapered" if tapered else f"**{e.label}**",
                    *(zero_shot_cell(zs.get(c)) for c in cols),
                    diff_ci(avg, ".2f") if tapered else "",
                ]
            )
        paper = e.paper_760m
        if paper is not None:
            for row, name in ((paper.uniform, paper.name), (paper.tapered, "+ tapered")):
                rows.append([f"*paper 760M: {name}*", *(f"*{row[c]:.2f}*" for c in cols), ""])
    return [
        "## Zero-shot",
        "",
        f"Tasks {', '.join(settings.eval_tasks)}, first {settings.eval_limit or 'all'} items "
        "each; accuracies in %, mean ± std over seeds; Δ Avg = paired difference of the average "
        f"accuracy (tapered − uniform, 95% CI). {CHANCE_NOTE} The paper's 760M rows (italic) "
        "for scale.",
        "",
        *md_table(["model", *cols, "Δ Avg, acc points [95% CI]"], rows),
        "",
    ]


def _reading(summary: FamilyTable) -> list[str]:
    entries = summary.families
    n = len(entries)
    lines = ["## What the intervals allow", ""]
    for e in entries:
        d = e.diff_val_loss
        v = summary.verdicts[e.prefix]
        seeds = ", ".join(f"{x:+.4f}" for x in d.per_seed)
        wins = sum(x < 0 for x in d.per_seed)
        paper = e.paper_760m
        ref = "" if paper is None else f"; the paper: {paper.change['Wiki ppl']:+.2f}% Wiki ppl"
        lines.append(
            f"- {e.label}: tapered {v} (Δ loss {d.mean:+.4f}, tapered ahead in {wins} of "
            f"{d.n} seeds: {seeds}){ref}"
        )
    lines += [
        "",
        f"Tapered lower in {summary.better} of {n} families; the 95% interval excludes 0 in "
        f"favour of tapering in {summary.significantly_better}, against it in "
        f"{summary.significantly_worse} (the paper: {PAPER_760M_CLAIM} at 760M / 50B tokens).",
        "",
    ]
    return lines


def _time_table(entries: tuple[FamilyRow, ...], meta: FamilyMeta) -> list[str]:
    rows = []
    for e in entries:
        rt = e.run_times
        wall = meta.family_wall_s.get(e.prefix)
        rows.append(
            [
                e.preset,
                str(e.uniform.val_loss.n + e.tapered.val_loss.n),
                mean_pm(e.uniform.tokens_per_s, ",.0f"),
                mean_pm(e.tapered.tokens_per_s, ",.0f"),
                f"{rt['train_s'] / 60:.1f}",
                f"{sum(v for k, v in rt.items() if k != 'train_s') / 60:.1f}",
                "–" if wall is None else f"{wall / 60:.1f}",
            ]
        )
    return md_table(
        [
            "preset",
            "runs",
            "tokens/s uniform",
            "tokens/s tapered",
            "training min (sum)",
            "evaluation min (sum)",
            "wall min (this invocation)",
        ],
        rows,
    )


def render_family_markdown(summary: FamilyTable, meta: FamilyMeta) -> str:
    entries = summary.families
    first = entries[0]
    s, size = first.settings, meta.preset_size
    done = "" if meta.done == meta.total else f" (PARTIAL: {meta.done}/{meta.total})"
    links = ", ".join(f"[{e.preset}]({e.preset}/report.md)" for e in entries)
    # each family adds seeds until its own comparison is settled (--stop): the counts may differ
    used = {e.preset: len(e.settings.seeds) for e in entries}
    if len(set(used.values())) == 1:
        n_seeds, seeds = f"{len(s.seeds)} seeds", f"seeds {s.seeds}"
    else:
        n_seeds = f"up to {max(used.values())} seeds"
        seeds = "seeds " + ", ".join(f"0..{n - 1} ({p})" for p, n in used.items())
        seeds += " (each family stops on its own comparison: its report's 'When it stopped')"
    lines = [
        f"# taperlm compare — paper families: {size} presets, {n_seeds}, "
        f"{s.tokens:,} tokens/run{done}",
        "",
        *produced_by(meta.command),
        f"- every family's preset at size {size}, uniform vs tapered `{first.taper}`, "
        f"{seeds}, {s.tokens:,} tokens per run ({s.steps} steps of "
        f"{s.batch_tokens:,} tokens, seq_len {s.seq_len}, peak lr {s.lr:g}); "
        f"validation on the first {s.val_tokens:,} tokens of the val split of `{s.data_dir}`",
        f"- budgets: within every family both allocations have exactly the same parameters and "
        f"FLOPs/token (asserted before training; here: {yes_no(summary.all_budgets_equal)}); "
        "all runs of one seed saw the same batches: "
        f"{yes_no(all(e.checks.same_data_order_within_seed for e in entries))}",
        f"- wall time {meta.wall_s / 60:.1f} min this invocation ({meta.cpu_s / 60:.1f} "
        f"CPU-min in the main process); {meta.created}",
        f"- each family's full report (per-seed values, curves, novelty, plots): {links}",
        "",
        "## Validation, with the paper's 760M table beside it",
        "",
        *_validation_table(entries),
        "",
        "Mean ± sample std over seeds; Δ = tapered − uniform of the same seed, mean with the 95% "
        "Student-t interval (`*` = excludes 0); Δ ppl = exp(Δ loss) − 1. The paper's columns are "
        "single runs of 760M-parameter models after 50B tokens (its family table), with the tapered "
        "model's relative change (ppl) or change in accuracy points (Avg) in brackets; compare "
        "the direction and rough size, not the values.",
        "",
        f"![paired perplexity change per family]({PLOT})",
        "",
        *_reading(summary),
        *_zero_shot_table(entries, s),
        "## Time",
        "",
        *_time_table(entries, meta),
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# writing


def write_family_report(
    reports: dict[str, ComparisonReport], out_dir: Path, meta: FamilyMeta
) -> tuple[Path, Path]:
    """report.json, report.md and families.png of a families run in out_dir."""
    summary = summarize_families(reports, meta.preset_size)
    rows, refs = [], {}
    for e in summary.families:
        rel = e.relative_ppl_change
        if rel is None:
            continue
        lo, hi = rel.ci if rel.ci else (None, None)
        rows.append((e.label, rel.mean, lo, hi))
        if e.paper_760m:
            refs[e.label] = e.paper_760m.change["Wiki ppl"]
    if rows:
        plot_intervals(
            rows,
            out_dir / PLOT,
            title="Tapered vs uniform, per family (paired over seeds)",
            xlabel="perplexity change, % (ours: val ppl; paper: Wiki ppl at 760M)",
            reference=refs,
            reference_label="paper, 760M / 50B tokens",
        )
    md = render_family_markdown(summary, meta)
    json_path, md_path = out_dir / REPORT_FILE, out_dir / "report.md"
    write_record(json_path, FamilyReport(meta, summary))
    atomic_write_text(md_path, md)
    return md_path, json_path


# The main job's size: the default table (4 families x 5 seeds) fits about half an hour on 2 cores.
DEFAULT_PRESET_SIZE = "micro"


def family_presets(opts: CompareOptions) -> list[str]:
    """The preset prefixes of --families (default DEFAULT_FAMILIES), checked and deduplicated."""
    known = preset_families()
    out: list[str] = []
    for name in DEFAULT_FAMILIES if opts.families is None else opts.families:
        if name not in known:
            raise ConfigError(
                f"--families: unknown family preset {name!r}; choose from {', '.join(known)}"
            )
        if name not in out:
            out.append(name)
    if not out:
        raise ConfigError(f"--families is empty; give e.g. --families {','.join(DEFAULT_FAMILIES)}")
    return out


def preset_size(opts: CompareOptions) -> str:
    """--preset-size (default micro), checked against the preset sizes."""
    size = list_text(opts.preset_size) if opts.preset_size else DEFAULT_PRESET_SIZE
    sizes = [*SMALL_SHAPES, *PAPER_SHAPES]
    if size not in sizes:
        raise ConfigError(f"--preset-size {size!r} is unknown; choose from {', '.join(sizes)}")
    return size


def override_family(key: str) -> str | None:
    """The family whose own section the dotted key of a `--set` addresses (`model.titans.window`
    -> titans), or None for a key every family has."""
    parts = key.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "model" and parts[1] in FAMILIES else None


def family_options(opts: CompareOptions) -> list[tuple[str, CompareOptions]]:
    """(preset prefix, the CompareOptions of its comparison) for every family of the run."""
    if opts.preset or opts.config:
        raise ConfigError(
            "--paper families builds every family from its own preset: choose the size with "
            "--preset-size (tiny, small, 440m, ...) and the families with --families, not "
            "--preset/--config"
        )
    if opts.tapers or opts.taper_list:
        raise ConfigError("give either --paper MODE or --tapers/--taper, not both")
    prefixes = family_presets(opts)
    size = preset_size(opts)
    known = preset_families()
    names = {known[p][0].name for p in prefixes}
    # the key each --set text sets, as the assembly records it (checked here, as every family's
    # own assembly would)
    keys = Assembly.of({}, "--set", Layer.DEFAULT).overrides(opts.overrides, Layer.SET, "--set")
    families_of = {text: override_family(key) for text, key in zip(opts.overrides, keys)}
    for text in opts.overrides:
        fam = families_of[text]
        if fam is not None and fam not in names:
            raise ConfigError(
                f"--set {text!r} is an option of the {fam} family, which is not among "
                f"--families {','.join(prefixes)}"
            )
    out = []
    for prefix in prefixes:
        fam = known[prefix][0].name
        sets = [o for o in opts.overrides if families_of[o] in (None, fam)]
        sub = dataclasses.replace(
            opts,
            out=opts.out / f"{prefix}-{size}",
            preset=f"{prefix}-{size}",
            paper=None,
            tapers=FAMILIES_TAPERS,
            preset_size=None,
            families=None,
            overrides=sets,
        )
        out.append((prefix, sub))
    return out


def families_plan(opts: CompareOptions) -> StudyPlan:
    """The families study: every family's comparison, one after the other, and the family table
    rewritten after each (`taperlm.compare.study.run_study` runs it)."""
    subs = family_options(opts)
    size = preset_size(opts)

    def report(done: StudyProgress) -> tuple[Path, Path]:
        latest = done.reports[next(reversed(done.reports))]
        meta = FamilyMeta(
            command=_command(opts, subs, latest.meta.settings.tokens),
            preset_size=size,
            families=tuple(p for p, _ in subs),
            family_wall_s=dict(done.walls),
            wall_s=done.wall(),
            cpu_s=done.cpu(),
            created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            done=len(done.reports),
            total=done.total,
        )
        return write_family_report(done.reports, opts.out, meta)

    parts = [Part(prefix, sub, "family", sub.preset or prefix) for prefix, sub in subs]
    return StudyPlan(parts, report, mode="families", folder="families folder")


def _command(opts, subs: list[tuple[str, Any]], tokens: int) -> str:
    """The command line that reproduces the families run (every choice explicit)."""
    parts = ["taperlm", "compare", "--paper", "families", "--preset-size", preset_size(opts)]
    parts += ["--families", ",".join(p for p, _ in subs)]
    if opts.multiple_of:
        parts += ["--multiple-of", str(opts.multiple_of)]
    return shlex.join(parts + run_arguments(opts, subs[0][1].seeds, tokens))
