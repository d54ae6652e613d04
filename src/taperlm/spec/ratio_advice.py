"""Which cosine ratio START -> 2-START the measurements favour for a run of P parameters and T
training tokens, and how sure that is: the ratio advice `taperlm plan` prints.

The measurements ship with the package (`ratio_measurements.json` beside this module; the wheel
has no benchmarks/): every point of the `taperlm compare --paper scaling` sweep and of the
`--paper tokens` / `--paper ratios` token axis as their reports give them (size, parameters,
tokens per parameter, the paired difference vs uniform at 1.5 -> 0.5 and at the best measured
ratio with 95% intervals, the fitted best start with its bootstrap interval), the paper's own
440M point, and the pre-registered checks of a point's lead on fresh seeds (`taperlm compare
--paper confirm` / `confirm-code`, read by their rule: `confirmations`). `benchmarks/ratio_measurements.py` writes the file from benchmarks/results/, and a
test checks that it still equals what those reports say; a new measured point is a regenerated
file, nothing here changes.

The advice, per run (`advice`): the measured points nearest in log space (decades of parameters
and of tokens per parameter, both axes weighted alike: a 10x larger model is as far as 10x longer
training), each with its differences and fitted best start; whether the run is on a measured
point, inside the measured range or outside it (by how many decades on each axis); and a verdict
in words. The token axis decides first: when the longest-trained measured points that trained no
longer than the run show no decided advantage, the advantage is gone by then, and the advice
says so whatever shorter runs measured.

A point whose best measured taper was checked again on its own corpus (`checked`) is read by the
check, which was pre-registered and used fresh seeds: a lead the check did not confirm is no
decided advantage (a refuted one, a disadvantage), whatever the exploratory interval said; both
are shown. A check on another corpus is shown beside the point and changes nothing.

Torch-free (plan is): it reads one small JSON through the project's bounded reader.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from taperlm.errors import MalformedFileError
from taperlm.files.io import read_json

MEASUREMENTS = Path(__file__).with_name("ratio_measurements.json")
MAX_MEASUREMENTS_BYTES = 1 << 20  # a few dozen points are ~20 KB
NEAREST = 3  # measured points the advice shows
# Two points (or a run and a point) closer than this in both log10 axes count as the same point:
# 12%, well inside the spread of the budgets a sweep names one point (whole steps of a batch).
SAME_POINT_DECADES = 0.05
WIDTH = 100  # columns of the printed advice
# A cosine start from which the verdict calls a winning taper steep: the paper's 1.5 -> 0.5 and
# milder are plain tapers, 1.75 -> 0.25 and beyond (what short training favours) steep ones.
STEEP_START = 1.75

_POINT_KEYS = ("point", "size", "params", "tokens_per_param", "diff_1.5", "best_measured",
               "diff_best", "best_ratio", "mode")  # fmt: skip
_CHECK_KEYS = ("point", "mode", "taper", "corpus", "seeds", "mean", "anytime_ci", "better_in",
               "verdict")  # fmt: skip
BUILT_IN = "built-in"  # the corpus every point of the sweeps trained on
CHECK_VERDICTS = ("confirmed", "refuted", "not confirmed")


def load_measurements(path: str | Path = MEASUREMENTS) -> dict[str, Any]:
    """The packaged measurements (see the module doc), their shape checked."""
    doc = read_json(path, MAX_MEASUREMENTS_BYTES, "ratio measurements")
    points = doc.get("points") if isinstance(doc, dict) else None
    if not isinstance(points, list) or not points or not isinstance(doc.get("paper"), dict):
        raise MalformedFileError(
            f"{path}: ratio measurements need a non-empty 'points' list and a 'paper' point; "
            "regenerate the file with `python3 benchmarks/ratio_measurements.py`"
        )
    for p in points:
        missing = [k for k in _POINT_KEYS if not isinstance(p, dict) or k not in p]
        if missing:
            raise MalformedFileError(
                f"{path}: a ratio measurement lacks {', '.join(missing)}; regenerate the file "
                "with `python3 benchmarks/ratio_measurements.py`"
            )
    checks = doc.get("confirmations", [])
    for c in checks if isinstance(checks, list) else [None]:
        missing = [k for k in _CHECK_KEYS if not isinstance(c, dict) or k not in c]
        if missing or c["verdict"] not in CHECK_VERDICTS:  # type: ignore[index]
            raise MalformedFileError(
                f"{path}: a confirmation lacks {', '.join(missing) or 'a known verdict'}; "
                "regenerate the file with `python3 benchmarks/ratio_measurements.py`"
            )
    return doc


def with_checks(points: list[dict[str, Any]], checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each point with the pre-registered checks run at it (`confirmations`, by point name)."""
    return [{**p, "confirmations": [c for c in checks if c["point"] == p["point"]]} for p in points]


def checked(p: dict[str, Any]) -> dict[str, Any] | None:
    """The pre-registered check of `p`'s lead (its best measured taper) on its own corpus, if
    one ran: the reading that decides the point."""
    for c in p.get("confirmations") or ():
        if c["corpus"] == BUILT_IN and c["taper"] == p["best_measured"]:
            return c
    return None


# ----------------------------------------------------------------------------------------------
# the arithmetic: log-space distances, the measured range, a point's verdict


def distance(params_a: float, tpp_a: float, params_b: float, tpp_b: float) -> float:
    """Euclidean distance in decades: (log10 params, log10 tokens per parameter)."""
    return math.hypot(
        math.log10(params_a) - math.log10(params_b), math.log10(tpp_a) - math.log10(tpp_b)
    )


def nearest(
    points: list[dict[str, Any]], params: float, tpp: float, k: int = NEAREST
) -> list[dict[str, Any]]:
    """The `k` points nearest to (params, tpp) in log space, nearest first, each with
    `distance_decades` added (ties keep the file's order)."""
    ranked = sorted(points, key=lambda p: distance(params, tpp, p["params"], p["tokens_per_param"]))
    return [
        {**p, "distance_decades": distance(params, tpp, p["params"], p["tokens_per_param"])}
        for p in ranked[:k]
    ]


def decades_outside(value: float, low: float, high: float) -> float:
    """How many decades `value` lies above `high` (positive) or below `low` (negative); 0 inside."""
    if value > high:
        return math.log10(value / high)
    if value < low:
        return -math.log10(low / value)
    return 0.0


def status(p: dict[str, Any]) -> str:
    """ "helps": the best measured taper beats uniform, its interval below 0; "hurts": the best
    taper (or 1.5 -> 0.5 where uniform measured lowest) is worse, its interval above 0;
    "undecided": the interval includes 0. A checked lead (`checked`) is what its check says:
    confirmed helps, refuted hurts, not confirmed is undecided."""
    check = checked(p)
    if check is not None:
        return {"confirmed": "helps", "refuted": "hurts"}.get(check["verdict"], "undecided")
    d = p["diff_best"] or p["diff_1.5"]
    if not d or not d.get("ci"):
        return "undecided"
    lo, hi = d["ci"]
    return "helps" if hi < 0 else "hurts" if lo > 0 else "undecided"


def advantage_gone(points: list[dict[str, Any]], tpp: float) -> list[dict[str, Any]]:
    """The longest-trained points that trained no longer than `tpp` tokens per parameter (within
    SAME_POINT_DECADES), when none of them shows a decided advantage: the advantage is gone by
    then. Empty when they show one, or when every point trained longer than the run."""
    log_t = math.log10(tpp)
    not_longer = [
        p for p in points if math.log10(p["tokens_per_param"]) <= log_t + SAME_POINT_DECADES
    ]
    if not not_longer:
        return []
    longest = max(math.log10(p["tokens_per_param"]) for p in not_longer)
    group = [
        p for p in not_longer if math.log10(p["tokens_per_param"]) >= longest - SAME_POINT_DECADES
    ]
    return [] if any(status(p) == "helps" for p in group) else group


# ----------------------------------------------------------------------------------------------
# the advice


def advice(
    params: float,
    tokens: float,
    measurements: dict[str, Any] | None = None,
    taper: str | None = None,
    family: str | None = None,
) -> dict[str, Any]:
    """What the measurements say about the ratio for a run of `params` parameters trained on
    `tokens` tokens (the keys of `plan --json`'s ratio_advice; `format_advice` prints it)."""
    doc = measurements if measurements is not None else load_measurements()
    points = with_checks(doc["points"], doc.get("confirmations", []))
    paper = doc["paper"]
    tpp = tokens / params
    near = [{**p, "status": status(p)} for p in nearest(points, params, tpp)]
    p_lo, p_hi = min(p["params"] for p in points), max(p["params"] for p in points)
    t_lo = min(p["tokens_per_param"] for p in points)
    longest = max(points, key=lambda p: p["tokens_per_param"])
    t_hi = longest["tokens_per_param"]
    outside = {
        "params": decades_outside(params, p_lo, p_hi),
        "tokens_per_param": decades_outside(tpp, t_lo, t_hi),
    }
    if near[0]["distance_decades"] <= SAME_POINT_DECADES:
        where = "measured point"
    elif outside["params"] == 0 and outside["tokens_per_param"] == 0:
        where = "inside"
    else:
        where = "outside"
    gone = advantage_gone(points, tpp)
    paper_d = distance(params, tpp, paper["params"], paper["tokens_per_param"])
    out = {
        "run": {
            "params": params,
            "tokens": tokens,
            "tokens_per_param": tpp,
            "taper": taper,
            "family": family,
        },
        "nearest": near,
        "paper": {**paper, "distance_decades": paper_d},
        "measured_range": {"params": [p_lo, p_hi], "tokens_per_param": [t_lo, t_hi]},
        "longest_measured": {
            "point": longest["point"],
            "params": longest["params"],
            "tokens_per_param": t_hi,
        },
        "outside_decades": outside,
        "where": where,
        "advantage_gone_at": [
            {"point": p["point"], "mode": p["mode"], "tokens_per_param": p["tokens_per_param"]}
            for p in gone
        ],
        "source": doc.get("source", "taperlm/spec/ratio_measurements.json"),
    }
    out["verdict"] = _verdict(out, points, near, gone)
    out["how_sure"] = _how_sure(out)
    return out


def _params(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.3g}B"
    return f"{n / 1e6:.3g}M"


def _tpp(x: float) -> str:
    return f"{x:.3g}"


def _ratio(taper: str | None) -> str:
    """ "cosine:1.75:0.25" as "1.75 -> 0.25"."""
    if not taper or not taper.startswith("cosine:"):
        return taper or "uniform"
    _, start, end = taper.split(":")
    return f"{start} -> {end}"


def _start(taper: str | None) -> float | None:
    """The start of a cosine taper ("cosine:0.75:1.25" -> 0.75); None for anything else."""
    if not taper or not taper.startswith("cosine:"):
        return None
    return float(taper.split(":")[1])


def _which_way(taper: str | None) -> str:
    """How the verdict opens for a taper that beats uniform. The measured winners run from
    inverse tapers (MLPs widening with depth, start below 1) to the steepest start swept, so
    the opening says which way, and how steeply, the winner tapers."""
    start = _start(taper)
    if start is None or start == 1.0:
        return "Taper"
    if start < 1.0:
        return "Widen with depth (an inverse taper)"
    return "Taper, steeply" if start >= STEEP_START else "Taper"


def _best_measured(p: dict[str, Any]) -> str:
    """ "1.75 -> 0.25: -0.0660 [...]", or "uniform" alone when no swept taper beats it (its
    difference to itself is 0, and the 1.5 -> 0.5 one is reported beside it)."""
    if p["best_measured"] in (None, "uniform"):
        return "uniform"
    return f"{_ratio(p['best_measured'])}: {_diff(p['diff_best'])}"


def _diff(d: dict[str, Any] | None) -> str:
    if not d:
        return "–"
    text = f"{d['mean']:+.4f}"
    return text + (f" [{d['ci'][0]:+.4f}, {d['ci'][1]:+.4f}]" if d.get("ci") else "")


def _best_start(b: dict[str, Any]) -> str:
    if b.get("best") is None:
        return "–"
    text = f"{b['best']:.2f}"
    if b.get("ci"):
        text += f" [{b['ci'][0]:.2f}, {b['ci'][1]:.2f}]"
    upper, lower = b.get("at_upper_edge") or 0, b.get("at_lower_edge") or 0
    if upper > 0.5:
        text += f" (at the steepest ratio swept in {upper:.0%} of resamples)"
    elif lower > 0.5:
        low = b.get("lowest_start")
        where = "uniform" if low is None or round(low, 6) == 1.0 else f"the mildest swept, {low:g}"
        text += f" (at the lowest start swept, {where}, in {lower:.0%} of resamples)"
    return text


def _where_point(p: dict[str, Any]) -> str:
    return (
        f"{p['point']} ({_params(p['params'])} params, {_tpp(p['tokens_per_param'])} tokens/param)"
    )


def _verdict(
    a: dict[str, Any],
    points: list[dict[str, Any]],
    near: list[dict[str, Any]],
    gone: list[dict[str, Any]],
) -> str:
    run_t = a["run"]["tokens_per_param"]
    first = near[0]
    if gone:
        g = min(
            gone,
            key=lambda p: distance(a["run"]["params"], run_t, p["params"], p["tokens_per_param"]),
        )
        # g trains at most SAME_POINT_DECADES longer than the run: "as long as" at worst
        how_long = _how_far(max(math.log10(run_t / g["tokens_per_param"]), 0.0), "long", "short")
        text = (
            f"The advantage is gone: at {_where_point(g)}, the longest training measured that is "
            f"not longer than your run's, {_no_lead(g)} (best measured "
            f"{_best_measured(g)}; "
            f"1.5 -> 0.5: {_diff(g['diff_1.5'])}). Your run trains {how_long} that: the "
            "measurements here favour no taper — uniform, or a mild taper at no measured gain."
        ) + _check_note(g)
    elif first["status"] == "helps":
        text = (
            f"{_which_way(first['best_measured'])}: at the nearest measured point, "
            f"{_where_point(first)}, the best measured ratio is cosine "
            f"{_ratio(first['best_measured'])} "
            f"({_diff(first['diff_best'])} nats vs uniform; 1.5 -> 0.5: "
            f"{_diff(first['diff_1.5'])}), the fitted best start {_best_start(first['best_ratio'])}."
        ) + _check_note(first)
        log_t = math.log10(run_t) + SAME_POINT_DECADES
        lost = [
            p for p in points if math.log10(p["tokens_per_param"]) > log_t and status(p) != "helps"
        ]
        if lost:
            g = min(
                lost,
                key=lambda p: distance(
                    a["run"]["params"], run_t, p["params"], p["tokens_per_param"]
                ),
            )
            text += (
                f" Longer training loses it: at {_where_point(g)} {_no_lead(g)} "
                f"(best measured {_best_measured(g)}; 1.5 -> 0.5: {_diff(g['diff_1.5'])})."
            ) + _check_note(g)
    elif first["status"] == "hurts":
        text = (
            f"Do not taper: at the nearest measured point, {_where_point(first)}, the taper is "
            f"worse than uniform (best measured {_best_measured(first)}; "
            f"1.5 -> 0.5: {_diff(first['diff_1.5'])})."
        ) + _check_note(first)
    else:
        held = "its lead not confirmed" if checked(first) else "no interval excluding 0"
        text = (
            f"No decided advantage: at the nearest measured point, {_where_point(first)}, the "
            f"best measured is {_best_measured(first)} (1.5 -> 0.5: {_diff(first['diff_1.5'])} "
            f"vs uniform), {held}: uniform, or a mild taper at no measured gain."
        ) + _check_note(first)
    paper = a["paper"]
    if paper["distance_decades"] < first["distance_decades"]:
        # the paper's winner narrows with depth: a measured inverse taper does not agree with it
        narrows = (_start(first["best_measured"]) or 0.0) > 1.0
        agree = "agrees" if first["status"] == "helps" and narrows and not gone else "disagrees"
        text += (
            f" Your run is nearer the paper's point ({_params(paper['params'])} params, "
            f"{_tpp(paper['tokens_per_param'])} tokens/param: {paper['distance_decades']:.2f} "
            f"decades away) than any point measured here ({first['distance_decades']:.2f}): the "
            f"paper's single runs favour cosine {_paper_ratio(paper)} ({paper['diff']:+.3f} "
            f"nats vs uniform, no interval), which {agree} with the measurements here."
        )
    return text


def _no_lead(p: dict[str, Any]) -> str:
    """Why a point shows no advantage: no decided interval, or a lead its check did not hold."""
    if checked(p):
        return "no taper's lead holds on fresh seeds"
    return "no taper decidedly beats uniform"


def _on_corpus(c: dict[str, Any]) -> str:
    """Where a check trained, when not on the built-in corpus (its point's own measurements')."""
    return "" if c["corpus"] == BUILT_IN else f" on the {c['corpus']} corpus"


def check_line(c: dict[str, Any]) -> str:
    """One pre-registered check in words: what, where, and its reading."""
    lo, hi = c["anytime_ci"]
    n = len(c["seeds"])
    return (
        f"cosine {_ratio(c['taper'])} checked once{_on_corpus(c)}, pre-registered, on {n} fresh seeds "
        f"(taperlm compare --paper {c['mode']}): {c['verdict']}, Δ {c['mean']:+.4f} "
        f"[{lo:+.4f}, {hi:+.4f}] nats (anytime-valid 95%), the taper better in "
        f"{c['better_in']} of {n}"
    )


def _check_note(p: dict[str, Any]) -> str:
    """The checks run at a point the verdict quotes, as sentences ("" where none ran)."""
    return "".join(f" At {p['point']}, {check_line(c)}." for c in p.get("confirmations") or ())


def _paper_ratio(paper: dict[str, Any]) -> str:
    return f"{paper['best']:g} -> {2 - paper['best']:g}"


_COMPARATIVE = {"large": "larger", "small": "smaller", "long": "longer", "short": "shorter"}


def _how_far(decades: float, up: str, down: str) -> str:
    """How far past a measured end a run is, `decades` out (< 0: below it): "1.5 decades larger
    than", or "as large as" within a point's SAME_POINT_DECADES ("0.0 decades" says nothing)."""
    word = up if decades >= 0 else down
    if abs(decades) <= SAME_POINT_DECADES:
        return f"as {word} as"
    return f"{abs(decades):.1f} decades {_COMPARATIVE[word]} than"


def _how_sure(a: dict[str, Any]) -> str:
    near = a["nearest"][0]
    lo, hi = a["measured_range"]["params"]
    t_lo, t_hi = a["measured_range"]["tokens_per_param"]
    if a["where"] == "measured point":
        return f"Measured: your run is on {near['point']}; the intervals above are its own."
    if a["where"] == "inside":
        return (
            f"Interpolated: inside the measured range (params {_params(lo)}-{_params(hi)}, "
            f"tokens/param {_tpp(t_lo)}-{_tpp(t_hi)}), but the nearest measured point is "
            f"{near['distance_decades']:.2f} decades away."
        )
    parts = []
    dp, dt = a["outside_decades"]["params"], a["outside_decades"]["tokens_per_param"]
    run = a["run"]
    if dp:
        largest = dp > 0
        parts.append(
            f"{_how_far(dp, 'large', 'small')} the {'largest' if largest else 'smallest'} model "
            f"measured ({_params(hi if largest else lo)})"
        )
    if dt > 0:
        longest = a["longest_measured"]
        size_gap = math.log10(run["params"] / longest["params"])
        gap = (
            f"{abs(size_gap):.1f} decades {'smaller' if size_gap > 0 else 'larger'} than your run"
            if abs(size_gap) > SAME_POINT_DECADES
            else "your run's size"
        )
        parts.append(
            f"{_how_far(dt, 'long', 'short')} the longest training measured ({_tpp(t_hi)} "
            f"tokens/param, at {_params(longest['params'])} params: {gap})"
        )
    elif dt < 0:
        parts.append(
            f"{_how_far(dt, 'long', 'short')} the shortest training measured ({_tpp(t_lo)} "
            "tokens/param)"
        )
    return (
        f"Extrapolated: your run ({_params(run['params'])} params, "
        f"{_tpp(run['tokens_per_param'])} tokens/param) is {' and '.join(parts)}; the nearest "
        f"measured point is {near['distance_decades']:.2f} decades away. Read the verdict as a "
        "direction, not a number."
    )


def _run_notes(a: dict[str, Any]) -> list[str]:
    """What the measurements do not cover about the configured model itself."""
    run = a["run"]
    notes = []
    if run.get("family") not in (None, "transformer"):
        notes.append(
            f"measured on Transformer++ only; this model is {run['family']}, which no point "
            "here measures"
        )
    taper = run.get("taper")
    if taper is not None:
        notes.append(
            "this model is uniform: every Δ below is a taper's gain over it"
            if taper == "uniform"
            else f"this model's taper: {taper}"
        )
    return notes


def format_advice(a: dict[str, Any]) -> str:
    """The advice as `taperlm plan` prints it."""
    run = a["run"]
    lines = [
        "ratio advice: which cosine taper START -> 2-START the measurements favour for this run",
        f"  ({a['source']}: Transformer++; Δ = a taper's validation loss minus",
        "  uniform's in nats, paired over seeds, 95% intervals)",
        f"  your run: {_params(run['params'])} params x {run['tokens']:,.0f} tokens = "
        f"{_tpp(run['tokens_per_param'])} tokens/param",
    ]
    lines += [f"  {n}" for n in _run_notes(a)]
    lines.append("  nearest measured points (distance in decades of params and tokens/param):")
    for p in a["nearest"]:
        lines.append(
            f"    {p['point']} (--paper {p['mode']}): {_params(p['params'])} params, "
            f"{_tpp(p['tokens_per_param'])} tokens/param, {p['distance_decades']:.2f} decades away"
        )
        detail = (
            f"Δ 1.5 -> 0.5 {_diff(p['diff_1.5'])}; best measured {_best_measured(p)}; "
            f"fitted best start {_best_start(p['best_ratio'])}: "
            f"{_STATUS_WORDS[p['status']]}"
        )
        for c in p.get("confirmations") or ():
            detail += f"; {check_line(c)}"
        lines.append(
            textwrap.fill(detail, WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6)
        )
    paper = a["paper"]
    paper_line = (
        f"the paper: {_params(paper['params'])} params, {_tpp(paper['tokens_per_param'])} "
        f"tokens/param, one run per ratio: cosine {_paper_ratio(paper)} best of its sweep, "
        f"{paper['diff']:+.4f} nats ({paper['ppl'][0]} -> {paper['ppl'][1]} ppl); "
        f"{paper['distance_decades']:.2f} decades from your run"
    )
    for label, text in (
        ("", paper_line),
        ("verdict: ", a["verdict"]),
        ("how sure: ", a["how_sure"]),
    ):
        lines.append(
            textwrap.fill(label + text, WIDTH, initial_indent="  ", subsequent_indent="    ")
        )
    return "\n".join(lines)


_STATUS_WORDS = {
    "helps": "the taper helps (interval below 0)",
    "hurts": "the taper hurts (interval above 0)",
    "undecided": "no decided difference (interval includes 0)",
}


def points_markdown(doc: dict[str, Any]) -> str:
    """The packaged points as a markdown table (docs/compare.md shows it; plan reads the same)."""
    head = ["point", "mode", "params", "tokens/param", "Δ 1.5→0.5 [95% CI]", "best measured",
            "Δ there [95% CI]", "fitted best start [95% bootstrap]", "reading"]  # fmt: skip
    rows = [head]
    points = with_checks(doc["points"], doc.get("confirmations", []))
    for p in sorted(points, key=lambda p: (p["params"], p["tokens_per_param"], p["mode"])):
        rows.append(
            [
                p["point"],
                f"--paper {p['mode']}",
                f"{p['params']:,}",
                f"{p['tokens_per_param']:.3g}",
                _diff(p["diff_1.5"]),
                _ratio(p["best_measured"]),
                _diff(p["diff_best"]),
                _best_start(p["best_ratio"]),
                "; ".join(
                    [_STATUS_WORDS[status(p)]]
                    + [
                        f"{c['verdict']} on fresh seeds{_on_corpus(c)} (--paper {c['mode']})"
                        for c in p["confirmations"]
                    ]
                ),
            ]
        )
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(head))
    return "\n".join(lines)
