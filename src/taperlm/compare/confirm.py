"""`taperlm compare --paper confirm` and `--paper confirm-code`: the lead the long-training
modes found, checked once, as written down before the first cell trained (docs/compare.md, "The
confirmatory comparison: pre-registered").

The lead: cosine 0.75 -> 1.25, a taper that *widens* with depth, measured best at micro at 2 and
10 tokens per parameter (`taperlm.compare.longrun`), each time one of six uncorrected intervals
on seeds 0-4 and one data order. Each mode is one comparison of uniform against that taper, fixed
here so that no run can drift from the pre-registration: the size, the tokens per parameter, the
learning rate (as tuned at that point, or tuned by the rule `--paper tokens` uses), fresh seeds
(from CONFIRM_FIRST_SEED on: never used at these points; the lr tuning's seeds are 10000 on),
the sequential rule and its error rate, and the seed cap. The run is an ordinary resumable
`taperlm compare` in --out (its report's command names every setting explicitly).

- `confirm`: micro at 10 tokens per parameter on the built-in corpus (bpe:2048), both arms at
  uniform's lr as tuned at `--paper tokens`' micro-10579968 point (0.004).
- `confirm-code`: micro at 2 tokens per parameter on the code corpus (CPython's standard library
  source, prepared at bpe:2048 with the commands of docs/compare.md, given as --data); uniform's
  lr tuned there first as `--paper tokens` tunes each point (`--tune-lr --tune-lr-scope uniform`,
  its grid extended up to LONGRUN_EXTEND times at an edge), both arms at it.

The reading (`read_outcome`) is the rule's, from the finished comparison's report.json, and
nothing else: the anytime-valid interval where the sequence stopped decides (below 0:
*confirmed*, above: *refuted*, the cap reached undecided: *not confirmed*); the fixed-n t
interval is shown beside it, never decides. A report that is not the mode's pre-registered run
(another pair, budget, lr rule, seeds or stopping rule) is refused rather than read. The run's
report.md ends with the reading, and docs/compare.md's table and README's sentence are
`outcome_table` and `outcome_sentence` of the committed report (tests/repo/test_docs_numbers.py).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taperlm.analysis.stats import confidence_sequence
from taperlm.compare.cell import read_result
from taperlm.compare.longrun import (
    CELL_TOKENS_PER_S,
    LONGRUN_EXTEND,
    SIZES,
    TUNE_LRS,
    TUNE_SEEDS,
    budget_tokens,
)
from taperlm.compare.options import (
    CONFIRM_MODES,
    CONFIRM_SEEDS,
    DEFAULT_MIN_SEEDS,
    DEFAULT_STOP_ALPHA,
    CompareOptions,
)
from taperlm.compare.report import md_table
from taperlm.compare.results import ComparisonReport, read_record
from taperlm.compare.study import Part, StudyPlan
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError, MalformedFileError
from taperlm.files.io import MAX_RECORD_BYTES, atomic_write_text, read_text

CONFIRM_TAPERS = "uniform;cosine:0.75:1.25"
# Fresh seeds: the token axis's micro points reported seeds 0-4 and tuned on 10000-10001.
CONFIRM_FIRST_SEED = 100
# the cap: seeds 100..114 (CONFIRM_SEEDS, in options: --seeds' default in these modes)
CONFIRM_STOP = "decided"  # stop once the anytime-valid interval excludes 0
CONFIRM_ALPHA = DEFAULT_STOP_ALPHA  # 0.05: the one comparison's error rate, however it stops
CONFIRM_MIN_SEEDS = DEFAULT_MIN_SEEDS  # 3: the interval is unbounded before


@dataclass(frozen=True)
class ConfirmPoint:
    """One pre-registered comparison: where it trains and at which lr."""

    size: str  # a size of the long-training sweeps (`longrun.SIZES`)
    tokens_per_param: float
    lr: float | None  # both arms' peak lr; None: uniform's, tuned first as --paper tokens does
    corpus: str  # "built-in" (no --data) or "code" (--data: the code corpus)


CONFIRM_POINTS: dict[str, ConfirmPoint] = {
    # the lead at micro-10579968: -0.0604 [-0.1084, -0.0124], 5 of 5 seeds; lr as tuned there
    "confirm": ConfirmPoint("micro", 10.0, 0.004, "built-in"),
    # micro-2115584 on the built-in corpus: -0.0163 [-0.0266, -0.0060]; here on code
    "confirm-code": ConfirmPoint("micro", 2.0, None, "code"),
}

# What each mode fixes, as (field, the value it must have when given, the option's flag): given
# otherwise, the run would not be the pre-registered one, so it is refused.
_FIXED = (
    ("preset", None, "--preset"),
    ("config", None, "--config"),
    ("tapers", None, "--tapers"),
    ("taper_list", (), "--taper"),
    ("tokens", None, "--tokens"),
    ("preset_size", None, "--preset-size"),
    ("families", None, "--families"),
    ("tune_lr", False, "--tune-lr"),
    ("tune_scope", None, "--tune-lr-scope"),
    ("lr_grid", None, "--lr-grid"),
    ("multiple_of", None, "--multiple-of"),
    ("first_seed", 0, "--first-seed"),
)


def confirm_options(opts: CompareOptions) -> CompareOptions:
    """The one comparison of `opts.paper` (a CONFIRM_MODES mode), with every pre-registered
    setting; ConfigError naming the option that would change one."""
    mode = opts.paper
    point = CONFIRM_POINTS.get(mode or "")
    if point is None:
        raise ConfigError(f"--paper {mode!r}: the confirmatory modes are {CONFIRM_MODES}")
    for name, free, flag in _FIXED:
        if getattr(opts, name) != free:
            raise ConfigError(
                f"--paper {mode} is pre-registered (docs/compare.md, 'The confirmatory "
                f"comparison'): it sets {flag} itself; give no {flag}"
            )
    rule = (opts.stop.as_text(), opts.stop_alpha, opts.min_seeds, opts.stop_on, opts.seeds)
    want = (CONFIRM_STOP, CONFIRM_ALPHA, CONFIRM_MIN_SEEDS, "each", CONFIRM_SEEDS)
    if rule != want:
        raise ConfigError(
            f"--paper {mode} is pre-registered with --stop {CONFIRM_STOP} --stop-alpha "
            f"{CONFIRM_ALPHA:g} --min-seeds {CONFIRM_MIN_SEEDS} --stop-on each --seeds "
            f"{CONFIRM_SEEDS}; give none of them, or exactly these"
        )
    if point.corpus == "code" and opts.data is None:
        raise ConfigError(
            f"--paper {mode} trains on the code corpus: prepare it once (docs/compare.md, "
            "'The confirmatory comparison': CPython's standard library at bpe:2048) and give "
            "it as --data DIR"
        )
    if point.corpus == "built-in" and opts.data is not None:
        raise ConfigError(f"--paper {mode} trains on the built-in corpus; give no --data")
    preset = SIZES[point.size][0]
    overrides = list(opts.overrides)
    if point.lr is not None:
        overrides.append(f"train.lr={point.lr:g}")
    return dataclasses.replace(
        opts,
        paper=None,  # one plain comparison: its report's command names every setting
        preset=preset,
        tapers=CONFIRM_TAPERS,
        tokens=budget_tokens(point.size, point.tokens_per_param),
        first_seed=CONFIRM_FIRST_SEED,
        overrides=overrides,
        tune_lr=point.lr is None,
        tune_scope="uniform" if point.lr is None else None,
        lr_grid_extend=(
            (LONGRUN_EXTEND if opts.lr_grid_extend is None else opts.lr_grid_extend)
            if point.lr is None
            else opts.lr_grid_extend
        ),
    )


def confirm_plan(opts: CompareOptions) -> StudyPlan:
    """`--paper confirm` / `confirm-code`: one comparison, run in --out itself (resumable), read
    by the pre-registered rule once it ends (`conclude`)."""
    mode = opts.paper or "confirm"
    return StudyPlan(
        [Part("", confirm_options(opts))],
        mode=mode,
        conclude=lambda report: conclude(report, mode),
    )


def confirm_hours(
    mode: str, seeds: int = CONFIRM_SEEDS, cores: int = 2, tokens_per_s: float | None = None
) -> float:
    """Hours on `cores` idle cores for `seeds` reported seeds (2 cells each) and, where the lr is
    tuned, the tuning runs (4 lrs x 2 seeds, no extension), at `tokens_per_s` per core (default:
    the sweeps' measured `longrun.CELL_TOKENS_PER_S`); evaluation (~2%) left out."""
    point = CONFIRM_POINTS[mode]
    tokens = budget_tokens(point.size, point.tokens_per_param)
    runs = 2 * seeds + (0 if point.lr is not None else TUNE_LRS * TUNE_SEEDS)
    speed = tokens_per_s or CELL_TOKENS_PER_S[point.size]
    return runs * tokens / speed / cores / 3600


# ----------------------------------------------------------------------------------------------
# The reading: what the finished comparison says, by the pre-registered rule

CONFIRMED, REFUTED, NOT_CONFIRMED = "confirmed", "refuted", "not confirmed"
TAPER_LABEL = CONFIRM_TAPERS.split(";")[1]  # the arm checked against uniform
OUTCOME_HEADING = "## The pre-registered reading"
# Where each check's finished report.json is committed (benchmarks/results/): docs/compare.md's
# table, README's sentence and `taperlm plan`'s advice (benchmarks/ratio_measurements.py) read it.
RESULT_FILES = {
    "confirm": "confirm_micro_10tpp.json",
    "confirm-code": "confirm_code_micro_2tpp.json",
}


@dataclass(frozen=True)
class ConfirmOutcome:
    """One confirmatory comparison read by its rule: Δ = taper − uniform, final validation loss
    in nats, paired by seed."""

    mode: str  # "confirm" or "confirm-code"
    point: ConfirmPoint
    lr: float  # both arms' peak lr (as fixed, or as tuned for uniform)
    seeds: tuple[int, ...]  # the seeds the comparison used, in order
    mean: float  # the mean paired Δ over them
    anytime_ci: tuple[float, float]  # the confidence sequence where it stopped: it decides
    t_ci: tuple[float, float]  # the fixed-n t interval at the same seeds: shown, not the decision
    better_in: int  # seeds where the taper's loss is below uniform's
    verdict: str  # CONFIRMED, REFUTED or NOT_CONFIRMED

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def point_name(self) -> str:
        """The measured point it checks, as the long-training sweeps name it (micro-10579968)."""
        return f"{self.point.size}-{budget_tokens(self.point.size, self.point.tokens_per_param)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.point_name,
            "mode": self.mode,
            "taper": TAPER_LABEL,
            "size": self.point.size,
            "tokens_per_param": self.point.tokens_per_param,
            "corpus": self.point.corpus,
            "lr": self.lr,
            "seeds": list(self.seeds),
            "mean": self.mean,
            "anytime_ci": list(self.anytime_ci),
            "t_ci": list(self.t_ci),
            "better_in": self.better_in,
            "verdict": self.verdict,
        }


def _refuse(mode: str, where: str, what: str) -> MalformedFileError:
    return MalformedFileError(
        f"{where}: not the pre-registered --paper {mode} comparison ({what}); only its own "
        f"finished report can be read by its rule: rerun `taperlm compare --paper {mode}` into "
        "its folder"
    )


def _get(doc: Mapping[str, Any], *keys: str) -> Any:
    """doc[k1][k2]...; None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(key)  # type: ignore[assignment]
    return doc


def read_outcome(
    report: Mapping[str, Any], mode: str, where: str = "report.json"
) -> ConfirmOutcome:
    """The pre-registered reading of `mode`'s finished comparison (`report`: its report.json's
    object; `where` names it in errors). MalformedFileError when the report is not that
    comparison run to its end under its rule: the reading would not be the pre-registered one."""
    point = CONFIRM_POINTS.get(mode)
    if point is None:
        raise ConfigError(f"{mode!r} is not a confirmatory mode; choose from {CONFIRM_MODES}")
    allocs = report.get("allocations") if isinstance(report, Mapping) else None
    labels = [a.get("label") for a in allocs or () if isinstance(a, Mapping)]
    if labels != CONFIRM_TAPERS.split(";"):
        raise _refuse(mode, where, f"its allocations are {labels}, not {CONFIRM_TAPERS!r}")
    tokens = _get(report, "base_config", "train", "tokens")
    want_tokens = budget_tokens(point.size, point.tokens_per_param)
    if tokens != want_tokens:
        raise _refuse(mode, where, f"it trained {tokens} tokens a run, not {want_tokens:,}")
    preset = SIZES[point.size][0]
    want_model = get_preset(preset, resolve=False)
    shape = ("family", "d_model", "n_layers", "n_heads", "mlp_width")
    got = tuple(_get(report, "base_config", "model", k) for k in shape)
    if got != tuple(getattr(want_model, k) for k in shape):
        raise _refuse(mode, where, f"its model {dict(zip(shape, got))} is not {preset}")
    lr = _get(report, "base_config", "train", "lr")
    scope = _get(report, "lr_tuning", "scope")
    if point.lr is not None and (lr != point.lr or scope is not None):
        raise _refuse(mode, where, f"both arms must train at lr {point.lr:g}, untuned")
    if point.lr is None and scope != "uniform":
        raise _refuse(mode, where, "uniform's lr must be tuned first (--tune-lr-scope uniform)")
    stopping = report.get("stopping") or {}
    rule = tuple(stopping.get(k) for k in ("rule", "alpha", "min_seeds", "stop_on", "cap"))
    want_rule = (CONFIRM_STOP, CONFIRM_ALPHA, CONFIRM_MIN_SEEDS, "each", CONFIRM_SEEDS)
    if rule != want_rule:
        raise _refuse(mode, where, f"its stopping rule is {rule}, pre-registered {want_rule}")
    diff = _get(allocs[1], "diff_vs_uniform", "val_loss") or {}
    seeds = tuple(diff.get("seeds") or ())
    fresh = tuple(range(CONFIRM_FIRST_SEED, CONFIRM_FIRST_SEED + len(seeds)))
    if not seeds or seeds != fresh or stopping.get("seeds_used") != len(seeds):
        raise _refuse(mode, where, f"its seeds are {list(seeds)}, not {CONFIRM_FIRST_SEED} on")
    reason, sequence = stopping.get("reason"), stopping.get("sequence") or []
    last = _get(sequence[-1], "comparisons", TAPER_LABEL) if sequence else None
    if not isinstance(last, Mapping) or last.get("n") != len(seeds) or not last.get("ci"):
        raise _refuse(mode, where, "its sequence has no interval at its last seed")
    lo, hi = (float(x) for x in last["ci"])
    if reason == CONFIRM_STOP and (hi < 0 or lo > 0):
        verdict = CONFIRMED if hi < 0 else REFUTED
    elif reason == "cap" and len(seeds) == CONFIRM_SEEDS and lo <= 0 <= hi:
        verdict = NOT_CONFIRMED
    else:
        raise _refuse(mode, where, f"it stopped ({reason}) at {len(seeds)} seeds, not by its rule")
    per_seed = [float(x) for x in diff.get("per_seed") or ()]
    return ConfirmOutcome(
        mode=mode,
        point=point,
        lr=float(lr),
        seeds=seeds,
        mean=float(last["mean"]),
        anytime_ci=(lo, hi),
        t_ci=(float(diff["ci"][0]), float(diff["ci"][1])),
        better_in=sum(d < 0 for d in per_seed),
        verdict=verdict,
    )


def _where(o: ConfirmOutcome) -> str:
    corpus = "the built-in corpus" if o.point.corpus == "built-in" else "the code corpus"
    return f"{o.point.size}, {o.point.tokens_per_param:g} tokens per parameter, {corpus}"


def _ci(ci: tuple[float, float]) -> str:
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def outcome_sentence(o: ConfirmOutcome) -> str:
    """The reading in one sentence (README's and report.md's)."""
    measured = (
        f"Δ {o.mean:+.4f} nats, 95% anytime-valid {_ci(o.anytime_ci)}, {o.n} fresh seeds, "
        f"the taper better in {o.better_in} of {o.n}"
    )
    if o.verdict == CONFIRMED:
        return (
            f"Confirmed: at {_where(o)}, cosine 0.75 -> 1.25 (widening with depth) beats "
            f"uniform ({measured})."
        )
    if o.verdict == REFUTED:
        return (
            f"Refuted: at {_where(o)}, cosine 0.75 -> 1.25 (widening with depth) is worse than "
            f"uniform ({measured})."
        )
    return (
        f"Not confirmed: at {_where(o)}, {CONFIRM_SEEDS} fresh seeds do not decide a difference "
        f"between cosine 0.75 -> 1.25 and uniform, either way ({measured}); this is not a "
        "finding that they are equal."
    )


OUTCOME_HEAD = (
    "check", "point", "lr", "seeds", "Δ taper − uniform (nats)", "95% anytime-valid (decides)",
    "95% fixed-n t (shown)", "taper better in", "reading",
)  # fmt: skip


def outcome_table(outcomes: list[ConfirmOutcome]) -> list[str]:
    """docs/compare.md's table of the confirmatory comparisons, one row each."""
    rows = [
        [
            f"`--paper {o.mode}`",
            _where(o),
            f"{o.lr:g}" + (" (tuned)" if o.point.lr is None else ""),
            f"{o.seeds[0]}–{o.seeds[-1]}",
            f"{o.mean:+.4f}",
            _ci(o.anytime_ci),
            _ci(o.t_ci),
            f"{o.better_in} of {o.n}",
            f"**{o.verdict}**",
        ]
        for o in outcomes
    ]
    return md_table(OUTCOME_HEAD, rows)


def outcome_markdown(o: ConfirmOutcome) -> str:
    """report.md's closing section: the rule, the reading and the sentence."""
    lines = [
        OUTCOME_HEADING,
        "",
        f"Pre-registered (docs/compare.md, 'The confirmatory comparison'): uniform against "
        f"{TAPER_LABEL} at {_where(o)}, seeds from {CONFIRM_FIRST_SEED}, --stop {CONFIRM_STOP} "
        f"at α = {CONFIRM_ALPHA:g}, read after each seed from {CONFIRM_MIN_SEEDS} seeds up to "
        f"{CONFIRM_SEEDS}; "
        "the anytime-valid interval decides, the t interval is shown beside it.",
        "",
        *outcome_table([o]),
        "",
        outcome_sentence(o),
    ]
    return "\n".join(lines) + "\n"


def conclude(report: ComparisonReport, mode: str) -> None:
    """Append the reading to the finished comparison's report.md and print it; a report the
    rule cannot read yet (or at all) is said so, and report.md left as the comparison wrote it."""
    try:
        outcome = read_outcome(report.to_json(), mode, str(report.json_path))
    except MalformedFileError as err:
        print(f"taperlm compare --paper {mode}: no pre-registered reading: {err}", file=sys.stderr)
        return
    md = report.md_path
    # report.md is the comparison's own, just written; bounded all the same (a few KB)
    text = read_text(md, MAX_RECORD_BYTES, "comparison report.md")
    text = text.split("\n" + OUTCOME_HEADING + "\n")[0].rstrip("\n")
    atomic_write_text(md, text + "\n\n" + outcome_markdown(outcome))
    print(f"taperlm compare --paper {mode}: {outcome_sentence(outcome)}", file=sys.stderr)


@dataclass(frozen=True)
class Interim:
    """A check under way, read from its finished cells: the seeds both arms have finished, in
    order from CONFIRM_FIRST_SEED (the sequence is read in seed order: a gap ends it), their
    paired differences (taper − uniform) and the anytime-valid interval where they end."""

    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    anytime_ci: tuple[float, float] | None  # None before CONFIRM_MIN_SEEDS: unbounded

    @property
    def decided(self) -> bool:
        return self.anytime_ci is not None and (self.anytime_ci[1] < 0 or self.anytime_ci[0] > 0)


def interim(runs: Path) -> Interim:
    """The rule's reading so far of a check's cell folders (`runs`: its --out's runs/, or the
    kept copy of their result.json files), for a page to quote while the check is under way."""
    taper = TAPER_LABEL.replace(":", "-")  # the allocation's cell-name stem
    seeds, diffs = [], []
    for seed in range(CONFIRM_FIRST_SEED, CONFIRM_FIRST_SEED + CONFIRM_SEEDS):
        pair = [read_result(runs / f"{name}-s{seed}") for name in ("uniform", taper)]
        if None in pair:
            break
        uniform, tapered = pair
        seeds.append(seed)
        diffs.append(tapered.val.loss - uniform.val.loss)  # type: ignore[union-attr]
    steps = confidence_sequence(diffs, CONFIRM_ALPHA) if diffs else []
    ci = steps[-1].ci if steps and len(diffs) >= CONFIRM_MIN_SEEDS else None
    return Interim(tuple(seeds), tuple(diffs), ci)


def interim_sentence(i: Interim) -> str:
    """The interim reading in words (docs/compare.md quotes it while the check runs)."""
    n = len(i.seeds)
    if n == 0:
        return "under way: no seed finished yet"
    worse = sum(d > 0 for d in i.diffs)
    mean = sum(i.diffs) / n
    at = f"anytime-valid 95% {_ci(i.anytime_ci)}" if i.anytime_ci else "no interval before 3 seeds"
    state = "decided, its report not committed yet" if i.decided else "not decided yet"
    return (
        f"under way: {n} of at most {CONFIRM_SEEDS} seeds ({i.seeds[0]}–{i.seeds[-1]}), {state}: "
        f"Δ {mean:+.4f} nats, {at}, the taper worse in {worse} of {n} (interim, not a result)"
    )


def read_outcome_file(path: str | Path, mode: str) -> ConfirmOutcome:
    """`read_outcome` of a report.json on disk (a committed one: benchmarks/results)."""
    return read_record(
        Path(path), "comparison report", lambda doc: read_outcome(doc, mode, str(path))
    )
